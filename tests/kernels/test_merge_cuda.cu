// The CUDA merge_states against its host reference: every output dtype, head_dims from 1 to 256
// (16-byte chunks and single elements), 1 to 17 states, empty states and empty rows, padded and
// misaligned states, in place; outputs poisoned and checked fully written.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <pagedkv/cuda/merge.cuh>
#include <pagedkv/reference/merge.hpp>

#include "attention_case.hpp"
#include "gpu_test.cuh"

namespace pk = pagedkv::kernels;
using pk::cuda::device_buffer;
using pk::testing::load_as;

namespace {

class MergeCuda : public ::testing::Test {
 protected:
  void SetUp() override { PAGEDKV_SKIP_WITHOUT_GPU(); }
  std::mt19937_64 rng = pk::testing::seeded_rng();
};

/// One merge on the device and on the host. `offset` elements before the states (an offset that
/// is not a whole 16 bytes takes the kernel's element-at-a-time path), `pad` elements between
/// them; in_place: o and lse are state 0's.
void check_merge(pk::dtype t, std::int64_t rows, std::int32_t n, std::int32_t d, std::int64_t pad, std::int64_t offset,
                 bool in_place, std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << pk::to_string(t) << " rows " << rows << " states " << n << " head_dim " << d
                                  << " pad " << pad << " offset " << offset << " in_place " << in_place);
  const std::size_t es = pk::size_of(t);
  const pk::testing::random_states states(t, rows, n, d, pad, offset, rng);
  const pk::merge_states_params& p = states.p;
  const std::vector<unsigned char>& o_in = states.o_in;
  const std::vector<float>& lse_in = states.lse_in;

  // Host reference, out of place.
  std::vector<unsigned char> want(std::size_t(rows * d) * es);
  std::vector<float> want_lse(static_cast<std::size_t>(rows));
  pk::merge_states_params h = p;
  h.o_in = o_in.data() + offset * es;
  h.lse_in = lse_in.data();
  h.o = want.data();
  h.lse = want_lse.data();
  pk::reference::merge_states(h);

  const device_buffer d_in = device_buffer::from(o_in), d_lse_in = device_buffer::from(lse_in);
  const device_buffer d_out(want.size() + 16), d_lse(want_lse.size() * sizeof(float));  // 0xff: NaN
  pk::merge_states_params g = p;
  g.o_in = d_in.as<unsigned char>() + offset * es;
  g.lse_in = d_lse_in.as<float>();
  g.o = in_place ? const_cast<void*>(g.o_in) : d_out.as<unsigned char>() + offset * es;
  g.lse = in_place ? d_lse_in.as<float>() : d_lse.as<float>();
  pk::cuda::merge_states(g);
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> got(want.size());
  std::vector<float> got_lse(want_lse.size());
  PAGEDKV_CUDA_CHECK(cudaMemcpy(got.data(), g.o, got.size(), cudaMemcpyDeviceToHost));
  PAGEDKV_CUDA_CHECK(cudaMemcpy(got_lse.data(), g.lse, got_lse.size() * sizeof(float), cudaMemcpyDeviceToHost));

  double num = 0, den = 0;
  for (std::size_t i = 0; i < std::size_t(rows * d); ++i) {
    const double x = load_as(t, got.data(), i), ref = load_as(t, want.data(), i);
    ASSERT_TRUE(std::isfinite(x)) << "element " << i << " unwritten or NaN";
    num += (x - ref) * (x - ref);
    den += ref * ref;
  }
  // Both fp32, in different orders; a 16-bit output may round the other way.
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), t == pk::dtype::f32 ? 1e-6 : 1e-3);
  for (std::size_t r = 0; r < want_lse.size(); ++r) {
    if (std::isinf(want_lse[r])) {
      EXPECT_TRUE(std::isinf(got_lse[r]) && got_lse[r] < 0) << "row " << r;
      continue;
    }
    EXPECT_NEAR(got_lse[r], want_lse[r], 1e-5) << "row " << r;
  }
}

}  // namespace

TEST_F(MergeCuda, MatchesTheHostReference) {
  for (auto t : {pk::dtype::f32, pk::dtype::f16, pk::dtype::bf16})
    for (std::int32_t d : {1, 3, 8, 64, 80, 128, 256})
      for (std::int32_t n : {1, 2, 3, 5, 17})
        for (std::int64_t rows : {1, 7, 1000}) check_merge(t, rows, n, d, 0, 0, false, rng);
}

TEST_F(MergeCuda, PaddedMisalignedAndInPlace) {
  for (auto t : {pk::dtype::f32, pk::dtype::bf16})
    for (std::int32_t d : {64, 128})
      for (std::int64_t pad : {0, 3, 8})
        for (std::int64_t offset : {0, 1})
          for (bool in_place : {false, true}) check_merge(t, 333, 3, d, pad, offset, in_place, rng);
}

TEST_F(MergeCuda, NothingToMergeLaunchesNothing) {
  pk::merge_states_params p;
  p.num_rows = 0;
  p.num_states = 2;
  p.head_dim = 128;
  pk::cuda::merge_states(p);  // no pointers needed, no launch
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
}
