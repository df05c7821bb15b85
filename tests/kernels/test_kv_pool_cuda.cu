// kv_pool, the storage of a paged KV cache: its layout checks run before any CUDA call (no GPU
// needed, so they run in CI); allocation, fills, copies, moves and a short memory on the GPU.
// swap_blocks between a device and a pinned host kv_pool: test_cache_ops_cuda.cu.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <pagedkv/cuda/kv_pool.cuh>

#include "gpu_test.cuh"

namespace pk = pagedkv::kernels;

namespace {

/// What constructing a kv_pool<Memory> of `layout` throws (pagedkv::error), or "no error".
template <class Memory = pk::cuda::device_memory>
std::string error_of(const pk::kv_cache_layout& layout) {
  try {
    pk::cuda::kv_pool<Memory> pool(layout);
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    return e.what();
  }
  return "no error";
}

class KvPoolCuda : public ::testing::Test {
 protected:
  void SetUp() override { PAGEDKV_SKIP_WITHOUT_GPU(); }
};

}  // namespace

TEST(KvPoolErrors, NameTheBadLayoutBeforeAnyCudaCall) {
  EXPECT_NE(error_of(pk::kv_cache_layout{}).find("num_blocks 0"), std::string::npos) << error_of({});
  const auto good = pk::make_kv_cache_layout({2, 8, 16, 4, 128}, pk::kv_layout::nhd, pk::dtype::bf16);
  auto layout = good;
  layout.shape.head_dim = 0;
  EXPECT_NE(error_of(layout).find("head_dim 0"), std::string::npos) << error_of(layout);
  layout = good;
  layout.block_stride = -layout.block_stride;
  EXPECT_NE(error_of(layout).find("negative stride"), std::string::npos) << error_of(layout);
  // Strides whose last element lies past 2^64: 3 * 2^62 twice.
  layout = good;
  layout.shape.num_kv_heads = 4;
  layout.shape.num_blocks = 4;
  layout.head_stride = layout.block_stride = std::int64_t(1) << 62;
  EXPECT_NE(error_of(layout).find("overflows 64 bits"), std::string::npos) << error_of(layout);
  // Elements that fit 64 bits, bytes that do not (fp32: 4 bytes each).
  layout = pk::make_kv_cache_layout({1, 1, 1, 1, 1}, pk::kv_layout::nhd, pk::dtype::f32);
  layout.shape.num_blocks = 3;
  layout.block_stride = std::int64_t(1) << 62;
  EXPECT_NE(error_of<pk::cuda::pinned_host_memory>(layout).find("bits of bytes"), std::string::npos)
      << error_of<pk::cuda::pinned_host_memory>(layout);
  EXPECT_NE(error_of(layout).find(pk::to_string(layout)), std::string::npos) << "names the layout";
}

TEST_F(KvPoolCuda, HoldsEveryElementOfItsLayout) {
  for (const auto order : {pk::layer_order::layer_major, pk::layer_order::block_major})
    for (const auto kind : {pk::kv_layout::nhd, pk::kv_layout::hnd}) {
      const auto layout = pk::make_kv_cache_layout({3, 5, 7, 2, 80}, kind, pk::dtype::fp8_e4m3, order);
      pk::cuda::device_kv_pool pool(layout);
      EXPECT_EQ(pool.size_bytes(), layout.size_bytes());
      EXPECT_EQ(pk::to_string(pool.layout()), pk::to_string(layout));
      std::vector<unsigned char> bytes(layout.size_bytes());
      std::mt19937 rng(1);
      for (auto& b : bytes) b = static_cast<unsigned char>(rng());
      pool.copy_from(bytes);
      EXPECT_EQ(pk::testing::host_bytes_of(pool), bytes);
      pool.fill(0x7e);
      EXPECT_EQ(pk::testing::host_bytes_of(pool), std::vector<unsigned char>(layout.size_bytes(), 0x7e));
    }
}

TEST_F(KvPoolCuda, MovesLeaveTheSourceEmpty) {
  const auto layout = pk::make_kv_cache_layout({1, 4, 16, 2, 64}, pk::kv_layout::nhd, pk::dtype::bf16);
  pk::cuda::pinned_host_kv_pool a(layout);
  a.fill(0x11);
  void* const data = a.data();
  pk::cuda::pinned_host_kv_pool b(std::move(a));
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(static_cast<const unsigned char*>(b.data())[layout.size_bytes() - 1], 0x11) << "pinned: the host reads it";
  pk::cuda::pinned_host_kv_pool c;
  c = std::move(b);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size_bytes(), layout.size_bytes());
}

TEST_F(KvPoolCuda, CopiesOfAnotherSizeNameBothSizes) {
  const auto layout = pk::make_kv_cache_layout({1, 2, 16, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16);
  pk::cuda::device_kv_pool pool(layout);
  std::vector<unsigned char> host(layout.size_bytes() - 1);
  try {
    pool.copy_from(host);
    FAIL() << "copy_from took " << host.size() << " bytes for " << layout.size_bytes();
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("8191 host bytes for a device pool of 8192"), std::string::npos) << e.what();
  }
  host.resize(layout.size_bytes() + 1);
  EXPECT_THROW(pool.copy_to(host), pagedkv::error);
}

TEST_F(KvPoolCuda, AShortDeviceNamesTheCallAndTheSize) {
  // 1 PiB: more than any GPU has.
  const auto layout = pk::make_kv_cache_layout({1024, 1 << 20, 256, 8, 128}, pk::kv_layout::nhd, pk::dtype::bf16);
  const std::string bytes = std::to_string(layout.size_bytes());
  try {
    pk::cuda::device_kv_pool pool(layout);
    FAIL() << "allocated " << bytes << " bytes";
  } catch (const pk::cuda_error& e) {
    EXPECT_EQ(e.code(), cudaErrorMemoryAllocation);
    EXPECT_NE(std::string(e.what()).find("cudaMalloc of " + bytes + " bytes"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(pk::cuda::device_kv_pool::try_allocate(layout).has_value());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed allocation left no error for the next check";
  const auto small = pk::make_kv_cache_layout({1, 1, 16, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16);
  const auto pool = pk::cuda::device_kv_pool::try_allocate(small);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ(pool->size_bytes(), small.size_bytes());
}
