// The CUDA decode kernel against the host reference: block sizes 1..256, GQA 1..16, every
// head_dim and dtype, ragged and >= 32k contexts, batch 1..256, fresh random inputs, poisoned
// outputs and workspace, CUDA-graph replay, errors that name the unsupported value.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

#include <pagedkv/cuda/cache_ops.cuh>
#include <pagedkv/cuda/dispatch.cuh>
#include <pagedkv/cuda/merge.cuh>
#include <pagedkv/reference/attention.hpp>

#include "attention_case.hpp"
#include "gpu_test.cuh"

namespace pk = pagedkv::kernels;
using pk::testing::attention_case;
using pk::testing::case_config;
using pk::cuda::device_buffer;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r = [] {
    const std::uint64_t seed = std::random_device{}();
    std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return r;
}

/// The case's inputs on the device, and params pointing at them.
struct device_case {
  pk::cuda::device_kv_pool pool;
  device_buffer indices, indptr, kv_lens, last_block_len, q, o, lse, k_scales, v_scales, alibi, workspace;
  pk::attention_params params;
  pk::cuda::decode_plan plan;

  explicit device_case(const attention_case& c) {
    pool = pk::testing::device_pool_of(c.layout, c.pool);
    indices = device_buffer::from(c.indices);
    indptr = device_buffer::from(c.indptr);
    kv_lens = device_buffer::from(c.kv_lens);
    last_block_len = device_buffer::from(c.last_block_len);
    q = device_buffer::from(c.q);
    o = device_buffer(c.o.size());      // 0xff: NaN, so an unwritten output shows
    lse = device_buffer(c.lse.size() * sizeof(float));
    k_scales = device_buffer::from(c.k_scales);
    v_scales = device_buffer::from(c.v_scales);
    alibi = device_buffer::from(c.alibi_slopes);
    params = c.params;
    params.set_kv(pool.layout(), pool.data(), c.cfg.layer);
    params.q = q.get();
    params.o = o.get();
    params.lse = c.params.lse ? lse.as<float>() : nullptr;
    params.table.indices = indices.as<pagedkv::block_id>();
    params.table.indptr = c.params.table.indptr ? indptr.as<std::int32_t>() : nullptr;
    params.table.kv_lens = c.params.table.kv_lens ? kv_lens.as<std::int32_t>() : nullptr;
    params.table.last_block_len = c.params.table.last_block_len ? last_block_len.as<std::int32_t>() : nullptr;
    params.k_scale_per_head = c.params.k_scale_per_head ? k_scales.as<float>() : nullptr;
    params.v_scale_per_head = c.params.v_scale_per_head ? v_scales.as<float>() : nullptr;
    params.alibi_slopes = c.params.alibi_slopes ? alibi.as<float>() : nullptr;
    plan = pk::cuda::plan_decode(params);
    workspace = device_buffer(plan.workspace_bytes);
  }
  void run(cudaStream_t stream = nullptr) {
    pk::cuda::decode(params, workspace.get(), workspace.bytes(), stream);
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

/// The device's output of a finished run of case c against the host reference of c.
void expect_reference_output(attention_case& c, const device_case& d) {
  std::vector<unsigned char> o;
  std::vector<float> lse;
  d.o.to(o);
  d.lse.to(lse);
  pk::reference::attention(c.params);  // fills c.o and c.lse on the host
  pk::testing::dense_result ref;
  ref.out.resize(c.out_elems());
  for (std::size_t i = 0; i < ref.out.size(); ++i) ref.out[i] = c.out(i);
  ref.lse.assign(c.lse.begin(), c.lse.end());
  const auto cmp = pk::testing::compare(c, o.data(), c.cfg.with_lse ? lse.data() : nullptr, ref);
  EXPECT_EQ(cmp.non_finite, 0u) << "outputs left unwritten (poison) or NaN";
  EXPECT_LE(cmp.rel_error, pk::testing::tolerance(c.cfg.q_dtype)) << "splits=" << d.plan.num_splits;
  EXPECT_LE(cmp.max_lse_error, 2e-3) << "splits=" << d.plan.num_splits;
}

/// Runs decode and the host reference on one case; returns the plan it ran.
pk::cuda::decode_plan check_case(const case_config& cfg) {
  SCOPED_TRACE(cfg.describe());
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  device_case d(c);
  d.run();
  expect_reference_output(c, d);
  return d.plan;
}

struct dtype_pair {
  pk::dtype q, kv;
};
constexpr dtype_pair all_dtypes[] = {{pk::dtype::bf16, pk::dtype::bf16},
                                     {pk::dtype::f16, pk::dtype::f16},
                                     {pk::dtype::f32, pk::dtype::f32},
                                     {pk::dtype::bf16, pk::dtype::fp8_e4m3},
                                     {pk::dtype::f16, pk::dtype::fp8_e4m3},
                                     // fp8 KV under an fp32 q: the CUDA-core body's fp8 path
                                     {pk::dtype::f32, pk::dtype::fp8_e4m3}};

/// Whether this build compiles cfg's decode: its head_dim (dispatch.cuh's list) and KV type (bf16
/// and fp8 in every build, f16 and f32 with PAGEDKV_KERNELS_FULL_SWEEP).
bool compiled(const case_config& cfg) {
  const bool dim = pk::cuda::detail::visit_exact(cfg.head_dim, pk::cuda::decode_head_dims{}, []<int>() {});
  const bool kv = cfg.kv_dtype == pk::dtype::bf16 || cfg.kv_dtype == pk::dtype::fp8_e4m3;
  return dim && (kv || pk::cuda::decode_all_kv_dtypes);
}

/// Whether cfg's decode runs the tensor-core body: a compiled one under a 16-bit q.
bool on_tensor_cores(const case_config& cfg) { return compiled(cfg) && cfg.q_dtype != pk::dtype::f32; }

/// The shapes of a test that must run in every build (each one compiled in the default build too:
/// the test fails on one that is not, rather than skip it), then, with
/// PAGEDKV_KERNELS_FULL_SWEEP, those of head_dims and KV types only the full sweep compiles.
template <class Shape>
std::vector<Shape> shapes_of_this_build(std::initializer_list<Shape> every_build,
                                        std::initializer_list<Shape> full_sweep_only) {
  std::vector<Shape> shapes(every_build);
  if (pk::cuda::decode_all_kv_dtypes) shapes.insert(shapes.end(), full_sweep_only);
  return shapes;
}

/// Head_dim 128 (the Llama shapes), block 16, dtypes t, `group` query heads to each of
/// `kv_heads`, sequences of `kv_lens` tokens.
case_config llama_case(dtype_pair t, int group, int kv_heads, std::vector<std::int32_t> kv_lens = {}) {
  case_config cfg;
  cfg.q_dtype = t.q;
  cfg.kv_dtype = t.kv;
  cfg.head_dim = 128;
  cfg.block_size = 16;
  cfg.group = group;
  cfg.num_kv_heads = kv_heads;
  cfg.kv_lens = std::move(kv_lens);
  return cfg;
}

/// A bf16 q over bf16 KV (llama_case).
case_config bf16_case(int group, int kv_heads, std::vector<std::int32_t> kv_lens = {}) {
  return llama_case({pk::dtype::bf16, pk::dtype::bf16}, group, kv_heads, std::move(kv_lens));
}

class DecodeCuda : public ::testing::Test {
 protected:
  void SetUp() override { PAGEDKV_SKIP_WITHOUT_GPU(); }
};

}  // namespace

TEST_F(DecodeCuda, SweepBlockSizeGroupHeadDimDtype) {
  int index = 0, skipped = 0;
  for (int bs : {1, 3, 7, 16, 17, 64, 256})
    for (int group : {1, 2, 4, 5, 8, 16})
      for (int d : {64, 80, 96, 128, 256})
        for (const auto& [qt, kvt] : all_dtypes) {
          case_config cfg = pk::testing::sweep_case(bs, group, d, qt, kvt, index);
          std::uniform_int_distribution<int> len(2, 3 * bs + 300);
          cfg.kv_lens = {1, len(rng()), len(rng())};
          if (index % 4 == 0) cfg.kv_lens.push_back(bs * 5);
          ++index;
          if (!compiled(cfg)) { ++skipped; continue; }
          check_case(cfg);
          if (HasFailure()) return;
        }
  if (skipped) std::printf("[ note     ] %d cases not compiled in this build (PAGEDKV_KERNELS_FULL_SWEEP=OFF)\n", skipped);
}

// Small enough for compute-sanitizer, yet every body and path of the build: CUDA-core (fp8 KV under
// an fp32 q; fp32 KV in the full sweep), tensor-core (groups 1-16 on one and two n-tiles; 16-bit KV,
// fp8 KV under a bf16 and an f16 q; narrow, wide and shallow CTAs), padded and swizzled shared
// rows, splits and merge, odd block sizes, and in the full sweep odd head_dims. Every shape runs
// in every build that compiles it: the default build runs the first nine.
TEST_F(DecodeCuda, SmallMixedForSanitizers) {
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct small { int group, d, bs; pk::dtype q, kv; };
  const auto shapes = shapes_of_this_build<small>(
      {small{1, 128, 16, pk::dtype::bf16, pk::dtype::bf16}, small{5, 64, 7, pk::dtype::bf16, pk::dtype::fp8_e4m3},
       small{4, 128, 16, pk::dtype::bf16, pk::dtype::bf16}, small{16, 64, 3, pk::dtype::bf16, pk::dtype::bf16},
       small{2, 64, 17, pk::dtype::f32, pk::dtype::fp8_e4m3}, small{8, 128, 1, pk::dtype::f16, pk::dtype::fp8_e4m3},
       small{1, 64, 16, pk::dtype::bf16, pk::dtype::fp8_e4m3}, small{12, 64, 16, pk::dtype::f16, pk::dtype::fp8_e4m3},
       small{2, 128, 16, pk::dtype::f32, pk::dtype::fp8_e4m3}},
      {small{5, 80, 7, pk::dtype::bf16, pk::dtype::fp8_e4m3}, small{16, 256, 3, pk::dtype::f16, pk::dtype::f16},
       small{2, 96, 17, pk::dtype::f32, pk::dtype::f32}, small{8, 64, 1, pk::dtype::f16, pk::dtype::f16},
       small{8, 96, 16, pk::dtype::f16, pk::dtype::fp8_e4m3}});
  for (const small s : shapes) {
    case_config cfg;
    cfg.group = s.group;
    cfg.head_dim = s.d;
    cfg.block_size = s.bs;
    cfg.q_dtype = s.q;
    cfg.kv_dtype = s.kv;
    cfg.kv_lens = {1, 1100, 0, 37};  // 0: a padded slot, zeros and an LSE of -inf
    cfg.csr = s.bs == 7;
    cfg.alibi = s.group % 2 == 0;  // the slopes' reads checked on both bodies
    ASSERT_TRUE(compiled(cfg)) << cfg.describe();
    check_case(cfg);
    cfg.kv_lens = {1200};  // one sequence, one KV head: split (wide CTAs where they exist)
    EXPECT_GT(check_case(cfg).num_splits, 1);
    cfg.num_kv_heads = sms + 1;  // more CTAs than SMs: narrow
    cfg.kv_lens = {40};
    EXPECT_EQ(check_case(cfg).cta, pk::cuda::decode_cta::narrow);
    cfg.num_kv_heads = pk::cuda::decode_shallow_min_ctas_per_sm * sms;  // many waves: shallow where it exists
    cfg.kv_lens = {5};
    check_case(cfg);
  }
  std::printf("[ note     ] %zu shapes (%s build)\n", shapes.size(),
              pk::cuda::decode_all_kv_dtypes ? "full-sweep" : "default");
}

// max_kv_len is only an upper bound (an engine may pass its model's context limit, so that one
// captured graph serves every step). Far above every length and past the table's pitch (19
// blocks here), most splits start beyond a row's last block: they must read nothing past the
// table and leave empty partials. Small, so that it runs under compute-sanitizer too.
TEST_F(DecodeCuda, LooseMaxKvLen) {
  for (const auto& [qt, kvt] : {dtype_pair{pk::dtype::bf16, pk::dtype::bf16}, dtype_pair{pk::dtype::bf16, pk::dtype::fp8_e4m3}})
    for (const bool csr : {false, true})
      for (const int group : {1, 4}) {
        case_config cfg = llama_case({qt, kvt}, group, 2, {1, 300, 0, 77});
        cfg.csr = csr;
        SCOPED_TRACE(cfg.describe());
        attention_case c;
        pk::testing::make_case(c, cfg, rng());
        c.params.max_kv_len = 40000;
        device_case d(c);
        EXPECT_GE(std::int64_t(d.plan.num_splits - 1) * d.plan.chunk_tokens, 19 * 16) << "splits start past the row";
        d.run();
        expect_reference_output(c, d);
      }
}

// The tensor-core body runs wide CTAs (one an SM) when a launch has no more CTAs than SMs,
// shallow ones (three an SM) when it has many waves, narrow ones (two an SM) otherwise: every
// dtype pair, head_dim and group bucket on each, with odd block sizes and splits on the wide side.
TEST_F(DecodeCuda, NarrowWideAndShallowCtas) {
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  using pk::cuda::decode_cta;
  int index = 0, wide = 0, narrow = 0, shallow = 0;
  for (int d : {64, 80, 96, 128, 256})
    for (int group : {1, 5, 16})
      for (const auto& [qt, kvt] : all_dtypes) {
        case_config cfg;
        cfg.head_dim = d;
        cfg.group = group;
        cfg.q_dtype = qt;
        cfg.kv_dtype = kvt;
        cfg.block_size = index % 2 ? 7 : 16;
        cfg.per_head_scale = index % 3 == 0;
        ++index;
        if (!compiled(cfg)) continue;
        cfg.num_kv_heads = 2;
        cfg.kv_lens = {1500};  // 2 units, split: the wide side where it exists
        wide += check_case(cfg).cta == decode_cta::wide;
        cfg.num_kv_heads = sms / 2 + 3;  // 2 sequences: more CTAs than SMs, too few for shallow
        std::uniform_int_distribution<int> len(1, 200);
        cfg.kv_lens = {len(rng()), len(rng())};
        EXPECT_EQ(check_case(cfg).cta, decode_cta::narrow);
        ++narrow;
        if (group < 16) {  // the host reference of 16-head groups at this size takes too long
          cfg.num_kv_heads = (pk::cuda::decode_shallow_min_ctas_per_sm * sms + 1) / 2;  // 2 sequences: many waves
          std::uniform_int_distribution<int> short_len(1, 24);
          cfg.kv_lens = {short_len(rng()), short_len(rng())};
          shallow += check_case(cfg).cta == decode_cta::shallow;
        }
        if (HasFailure()) return;
      }
  EXPECT_GT(wide, 0);
  EXPECT_GT(shallow, 0);
  std::printf("[ note     ] %d cases on wide CTAs, %d on shallow ones, %d on narrow (or CUDA-core) ones\n", wide,
              shallow, narrow);
}

TEST_F(DecodeCuda, LongContextsUseSplits) {
  for (const auto& [qt, kvt] : {dtype_pair{pk::dtype::bf16, pk::dtype::bf16}, dtype_pair{pk::dtype::bf16, pk::dtype::fp8_e4m3}})
    for (int group : {1, 8}) {
      case_config cfg = llama_case({qt, kvt}, group, 2, {32768 + 17, 40000, 1});
      const int splits = check_case(cfg).num_splits;
      EXPECT_GT(splits, 1);
      for (int cap : {1, 3}) {  // a caller's cap on the splits: still exact, never exceeded
        cfg.max_splits = cap;
        EXPECT_EQ(check_case(cfg).num_splits, std::min(cap, splits)) << "max_splits " << cap;
      }
      // One unit spread over the SMs: 79-105 splits for the merge.
      cfg.max_splits = 0;
      cfg.num_kv_heads = 1;
      cfg.kv_lens = {40000};
      EXPECT_GT(check_case(cfg).num_splits, 64);
    }
}

TEST_F(DecodeCuda, CascadeOverASharedPrefixMergesToTheWholeSequence) {
  // Sequences sharing a prompt's blocks: decode over the shared blocks, decode over each one's
  // own, merge_states of the two: attention over the whole sequence. Long parts split (the
  // decode's own merge under the cascade's), short ones (own parts of 1 and 16 tokens) do not.
  for (const auto& [qt, kvt] : {dtype_pair{pk::dtype::bf16, pk::dtype::bf16}, dtype_pair{pk::dtype::f16, pk::dtype::fp8_e4m3}})
    for (const int prefix_blocks : {1, 256}) {
      case_config cfg = llama_case({qt, kvt}, 4, 8);
      for (const int own : {1, 16, 700, 9000}) cfg.kv_lens.push_back(prefix_blocks * 16 + own);
      SCOPED_TRACE(cfg.describe());
      attention_case c;
      pk::testing::make_case(c, cfg, rng());
      pk::testing::share_prefix(c, prefix_blocks);
      const device_case d(c);  // its table, after the sharing
      const auto parts = pk::testing::cascade_parts(c, {prefix_blocks});
      const std::size_t rows = std::size_t(c.num_q_tokens) * std::size_t(c.num_qo_heads());
      const std::size_t state_bytes = rows * std::size_t(cfg.head_dim) * pk::size_of(qt);
      const device_buffer o_states(2 * state_bytes), lse_states(2 * rows * sizeof(float));
      std::vector<device_buffer> keep;
      for (std::size_t i = 0; i < parts.size(); ++i) {
        pk::attention_params p = d.params;
        keep.push_back(device_buffer::from(parts[i].indices));
        p.table.indices = keep.back().as<pagedkv::block_id>();
        keep.push_back(device_buffer::from(parts[i].kv_lens));
        p.table.kv_lens = keep.back().as<std::int32_t>();
        p.max_kv_len = parts[i].max_kv_len;
        p.o = o_states.as<unsigned char>() + i * state_bytes;
        p.lse = lse_states.as<float>() + i * rows;
        keep.emplace_back(pk::cuda::plan_decode(p).workspace_bytes);
        pk::cuda::decode(p, keep.back().get(), keep.back().bytes());
      }
      pk::merge_states_params m;
      m.o_in = o_states.get();
      m.lse_in = lse_states.as<float>();
      m.o = d.o.get();
      m.lse = d.lse.as<float>();
      m.num_rows = std::int64_t(rows);
      m.num_states = 2;
      m.head_dim = cfg.head_dim;
      m.o_dtype = qt;
      pk::cuda::merge_states(m);
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<unsigned char> o;
      std::vector<float> lse;
      d.o.to(o);
      d.lse.to(lse);
      const auto cmp = pk::testing::compare(c, o.data(), lse.data(), pk::testing::naive_attention(c));
      EXPECT_EQ(cmp.non_finite, 0u);
      EXPECT_LE(cmp.rel_error, 2 * pk::testing::tolerance(qt)) << "each part rounded to q's type, then merged";
      EXPECT_LE(cmp.max_lse_error, 2e-3);
    }
}

TEST_F(DecodeCuda, BatchOneTo256Ragged) {
  for (int batch : {1, 2, 31, 256}) {
    case_config cfg = bf16_case(4, batch > 100 ? 2 : 8);
    cfg.block_size = 16;
    std::uniform_int_distribution<int> len(1, batch > 100 ? 1500 : 5000);
    for (int i = 0; i < batch; ++i) cfg.kv_lens.push_back(i % 7 == 3 ? 0 : len(rng()));  // some padded slots
    cfg.kv_lens[0] = 1;
    cfg.csr = batch % 2 == 1;
    check_case(cfg);
  }
}

TEST_F(DecodeCuda, WindowSoftCapNoLse) {
  for (int window : {0, 3, 100, 5000}) {
    case_config cfg;
    cfg.q_dtype = pk::dtype::bf16;
    cfg.kv_dtype = window == 3 ? pk::dtype::fp8_e4m3 : pk::dtype::bf16;
    cfg.head_dim = 128;
    cfg.group = 8;
    cfg.num_kv_heads = 2;
    cfg.kv_lens = {1, 700, 9000};
    cfg.window_left = window;
    cfg.soft_cap = window == 100 ? 30.0f : 0.0f;
    cfg.with_lse = window != 0;
    check_case(cfg);
  }
}

/// Turns case c (layer 1 of 2, layer-major, a window) into the tables of a sliding-window group
/// of hybrid_kv_cache_manager: null_block for every block wholly before its sequence's window.
/// The pool is laid out so that a read through a null entry finds NaN: block -1 of layer 1 is, for
/// K, the last block of layer 0's V (layer 0 is poisoned whole) and, for V, the last block of
/// layer 1's K (kept unused and poisoned).
void null_blocks_before_the_window(attention_case& c) {
  const pk::kv_cache_layout& l = c.layout;
  ASSERT_EQ(c.cfg.order, pk::layer_order::layer_major);
  ASSERT_EQ(c.cfg.layer, 1);
  const std::int32_t num_blocks = l.shape.num_blocks, bs = c.cfg.block_size;
  const std::size_t bytes = std::size_t(l.block_elems()) * pk::size_of(c.cfg.kv_dtype);
  const auto block_at = [&](std::int32_t layer, std::int32_t kv, pagedkv::block_id b) {
    return c.pool.data() + std::size_t(l.offset(layer, kv, b, 0, 0)) * pk::size_of(c.cfg.kv_dtype);
  };
  std::vector<bool> used(std::size_t(num_blocks), false);
  for (pagedkv::block_id b : c.indices)
    if (b != pagedkv::null_block) used[std::size_t(b)] = true;
  const pagedkv::block_id last = num_blocks - 1;
  if (used[std::size_t(last)]) {  // move its data to an unused block (extra_blocks >= 1)
    const auto spare = pagedkv::block_id(std::find(used.begin(), used.end(), false) - used.begin());
    ASSERT_LT(spare, num_blocks);
    for (std::int32_t layer = 0; layer < 2; ++layer)
      for (std::int32_t kv = 0; kv < 2; ++kv) std::memcpy(block_at(layer, kv, spare), block_at(layer, kv, last), bytes);
    std::replace(c.indices.begin(), c.indices.end(), last, spare);
  }
  const std::size_t elems = std::size_t(l.block_elems());
  for (std::int32_t kv = 0; kv < 2; ++kv)
    for (pagedkv::block_id b = 0; b < num_blocks; ++b) pk::testing::poison(c.cfg.kv_dtype, block_at(0, kv, b), elems);
  for (std::int32_t kv = 0; kv < 2; ++kv) pk::testing::poison(c.cfg.kv_dtype, block_at(1, kv, last), elems);
  for (std::int32_t s = 0; s < std::int32_t(c.kv_lens.size()); ++s) {
    const std::int32_t first = std::max(0, c.kv_lens[std::size_t(s)] - 1 - c.cfg.window_left) / bs;
    for (std::int32_t j = 0; j < first; ++j) {
      pagedkv::block_id& entry = c.cfg.csr ? c.indices[std::size_t(c.indptr[std::size_t(s)] + j)]
                                           : c.indices[std::size_t(s) * std::size_t(c.max_blocks) + std::size_t(j)];
      for (std::int32_t kv = 0; kv < 2; ++kv) pk::testing::poison(c.cfg.kv_dtype, block_at(1, kv, entry), elems);
      entry = pagedkv::null_block;
    }
  }
}

// A sliding-window group of hybrid_kv_cache_manager releases the blocks wholly before the window
// and leaves null_block in its table: decode reads from the window's first token on and never
// touches them. Dense and CSR tables, block sizes 1, 7 and 16, windows of 1 token to past a
// split, bf16 and fp8 KV, lengths inside and far past the window.
TEST_F(DecodeCuda, SkipsNullBlocksBeforeTheWindow) {
  for (int index = 0; index < 6; ++index) {
    case_config cfg = bf16_case(4, 2, {1, 37, 700, 4100, 9000});
    cfg.block_size = std::array{16, 1, 7, 16, 7, 16}[std::size_t(index)];
    cfg.window_left = std::array{100, 30, 0, 4095, 255, 1000}[std::size_t(index)];
    cfg.kv_dtype = index == 4 ? pk::dtype::fp8_e4m3 : pk::dtype::bf16;
    cfg.num_layers = 2;
    cfg.layer = 1;
    cfg.csr = index % 2 == 1;
    cfg.max_splits = index == 5 ? 8 : 0;
    SCOPED_TRACE(cfg.describe());
    attention_case c;
    pk::testing::make_case(c, cfg, rng());
    null_blocks_before_the_window(c);
    device_case d(c);
    d.run();
    expect_reference_output(c, d);
  }
}

// ALiBi on every body: tensor cores over 16-bit KV (one and two n-tiles) and fp8 KV, CUDA cores
// over fp8 (under an fp32 q) and, in the full sweep, fp32; with splits, a window, a soft-cap, and on
// shallow and paired CTAs. Every build runs the first six shapes.
TEST_F(DecodeCuda, Alibi) {
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct shape { int group, d; pk::dtype q, kv; };
  int index = 0, shallow = 0, paired = 0;
  for (const shape s : shapes_of_this_build<shape>(
           {shape{1, 128, pk::dtype::bf16, pk::dtype::bf16}, shape{5, 128, pk::dtype::bf16, pk::dtype::bf16},
            shape{16, 64, pk::dtype::bf16, pk::dtype::bf16}, shape{4, 128, pk::dtype::bf16, pk::dtype::fp8_e4m3},
            shape{1, 128, pk::dtype::f32, pk::dtype::fp8_e4m3}, shape{2, 64, pk::dtype::f32, pk::dtype::fp8_e4m3}},
           {shape{16, 64, pk::dtype::f16, pk::dtype::f16}, shape{2, 96, pk::dtype::f32, pk::dtype::f32}})) {
    case_config cfg;
    cfg.group = s.group;
    cfg.head_dim = s.d;
    cfg.q_dtype = s.q;
    cfg.kv_dtype = s.kv;
    cfg.num_kv_heads = 2;
    cfg.block_size = index % 2 ? 16 : 7;
    cfg.alibi = true;
    cfg.kv_lens = {1, 700, 9000, 33000};
    cfg.window_left = index == 2 ? 500 : -1;
    cfg.soft_cap = index == 3 ? 30.0f : 0.0f;
    ASSERT_TRUE(compiled(cfg)) << cfg.describe();
    check_case(cfg);
    cfg.kv_lens.assign(std::size_t(pk::cuda::decode_shallow_min_ctas_per_sm * sms / cfg.num_kv_heads + 1), 0);
    for (auto& len : cfg.kv_lens) len = 1 + int(rng()() % 300);  // many short sequences: shallow or paired CTAs
    const auto cta = check_case(cfg).cta;
    shallow += cta == pk::cuda::decode_cta::shallow;
    paired += cta == pk::cuda::decode_cta::paired;
    ++index;
  }
  EXPECT_GE(shallow, 2) << "ALiBi on shallow CTAs of the 16-bit tensor-core body";
  EXPECT_GE(paired, 2) << "ALiBi on paired CTAs, 16-bit head_dim 64 and fp8 head_dim 128";
}

// Paired CTAs (two adjacent KV heads of an NHD pool, where a head's row is 128 bytes) take every
// launch with at least as many pairs as SMs: fp8 head_dim 128 and 16-bit head_dim 64, each group
// bucket (fp8 MHA and groups of 2 too, on tensor cores like the rest), odd block sizes, ragged
// lengths with empty sequences, per-head scales that differ between the two heads, CSR tables, a
// window and a soft-cap, both layer orders. HND pools and odd KV head counts are not paired.
// Small enough for compute-sanitizer. Every build runs the first nine shapes; f16 KV is the full
// sweep's.
static_assert(pk::cuda::detail::decode_mma_shapes<__nv_bfloat16, __nv_fp8_e4m3, 128, 1>::paired &&
              pk::cuda::detail::decode_mma_shapes<__half, __half, 64, 2>::paired &&
              pk::cuda::detail::decode_mma_shapes<__nv_bfloat16, __nv_bfloat16, 64, 2>::paired &&
              !pk::cuda::detail::decode_mma_shapes<__nv_bfloat16, __nv_bfloat16, 128, 1>::paired);
TEST_F(DecodeCuda, PairedKvHeads) {
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  using pk::cuda::decode_cta;
  struct shape { int group, d; pk::dtype q, kv; };
  int index = 0;
  for (const shape s : shapes_of_this_build<shape>(
           {shape{4, 128, pk::dtype::bf16, pk::dtype::fp8_e4m3}, shape{3, 128, pk::dtype::f16, pk::dtype::fp8_e4m3},
            shape{16, 128, pk::dtype::bf16, pk::dtype::fp8_e4m3}, shape{1, 64, pk::dtype::bf16, pk::dtype::bf16},
            shape{5, 64, pk::dtype::bf16, pk::dtype::bf16}, shape{8, 64, pk::dtype::bf16, pk::dtype::bf16},
            shape{9, 64, pk::dtype::bf16, pk::dtype::bf16}, shape{1, 128, pk::dtype::bf16, pk::dtype::fp8_e4m3},
            shape{2, 128, pk::dtype::f16, pk::dtype::fp8_e4m3}},
           {shape{5, 64, pk::dtype::f16, pk::dtype::f16}, shape{9, 64, pk::dtype::f16, pk::dtype::f16}})) {
    case_config cfg;
    cfg.group = s.group;
    cfg.head_dim = s.d;
    cfg.q_dtype = s.q;
    cfg.kv_dtype = s.kv;
    cfg.num_kv_heads = index % 2 ? 4 : 2;
    cfg.block_size = std::array{1, 7, 16, 17}[index % 4];
    cfg.per_head_scale = true;
    cfg.csr = index % 3 == 1;
    cfg.order = index % 2 ? pk::layer_order::block_major : pk::layer_order::layer_major;
    cfg.num_layers = 1 + index % 2;
    cfg.layer = index % 2;
    cfg.window_left = index == 2 ? 150 : -1;
    cfg.soft_cap = index == 4 ? 30.0f : 0.0f;
    cfg.with_lse = index != 5;
    ++index;
    ASSERT_TRUE(on_tensor_cores(cfg)) << cfg.describe();
    std::uniform_int_distribution<int> len(1, 400);
    const int seqs = 2 * sms / cfg.num_kv_heads + index;  // at least as many pairs as SMs
    for (int i = 0; i < seqs; ++i) cfg.kv_lens.push_back(i % 11 == 5 ? 0 : len(rng()));
    cfg.kv_lens[1] = 1;
    const auto plan = check_case(cfg);
    EXPECT_EQ(plan.cta, decode_cta::paired);
    EXPECT_EQ(plan.kv_heads(), 2);
    EXPECT_EQ(plan.num_splits, 1);
    cfg.layout = pk::kv_layout::hnd;  // a head's tokens are contiguous there; heads, in blocks of one token
    EXPECT_EQ(check_case(cfg).cta == decode_cta::paired, cfg.block_size == 1);
    cfg.layout = pk::kv_layout::nhd;
    cfg.num_kv_heads = 3;  // odd: one head a CTA
    EXPECT_NE(check_case(cfg).cta, decode_cta::paired);
    if (HasFailure()) return;
  }
}

// fp8 KV under a bf16 q runs the mma on fp16 operands, q scaled into fp16's range by a power of
// two: q far beyond fp16's largest value (65504) and far below its smallest normal (2^-14) must
// give the logits and outputs of an ordinary q, on one and two n-tiles and with a soft-cap.
TEST_F(DecodeCuda, Fp8UnderBf16QOfAnyMagnitude) {
  for (const float magnitude : {0x1p40f, 0x1p20f, 0x1p-30f, 0x1p-60f})
    for (const int group : {4, 12}) {
      case_config cfg;
      cfg.q_dtype = pk::dtype::bf16;
      cfg.kv_dtype = pk::dtype::fp8_e4m3;
      cfg.head_dim = 128;
      cfg.group = group;
      cfg.num_kv_heads = 2;
      cfg.kv_lens = {1, 333, 5000};
      cfg.q_magnitude = magnitude;
      cfg.soft_cap = group == 12 ? 30.0f : 0.0f;
      check_case(cfg);
    }
}

// Dependent launches: copy_blocks moves every block of the table to a block nobody wrote (NaN)
// and the decode, next on the stream with nothing between them, reads the moved blocks through a
// table that points there. It must wait for the copies, as the merge must for the decode: a read
// before them finds NaN.
TEST_F(DecodeCuda, ReadsWhatTheLaunchBeforeItWrote) {
  cudaStream_t stream;
  PAGEDKV_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const int max_splits : {1, 0}) {  // without the merge, and with it
    case_config cfg = bf16_case(4, 8, {9000, 1, 4000, 16000, 700, 2500});
    cfg.max_splits = max_splits;
    cfg.extra_blocks = 0;
    for (const int len : cfg.kv_lens) cfg.extra_blocks += (len + cfg.block_size - 1) / cfg.block_size;
    SCOPED_TRACE(cfg.describe());
    attention_case c;
    pk::testing::make_case(c, cfg, rng());
    std::vector<char> in_table(std::size_t(c.layout.shape.num_blocks), 0);
    for (const pagedkv::block_id b : c.indices)
      if (b != pagedkv::null_block) in_table[std::size_t(b)] = 1;
    std::vector<pagedkv::block_id> pairs, moved = c.indices;
    pagedkv::block_id next = 0;
    for (pagedkv::block_id& b : moved) {
      if (b == pagedkv::null_block) continue;
      while (in_table[std::size_t(next)]) ++next;
      pairs.push_back(b);
      pairs.push_back(next);
      b = next++;
    }
    device_case d(c);
    const device_buffer d_pairs = device_buffer::from(pairs), d_moved = device_buffer::from(moved);
    d.params.table.indices = d_moved.as<pagedkv::block_id>();
    pk::cuda::copy_blocks({d_pairs.as<pagedkv::block_id>(), d.pool.data(), c.layout, int(pairs.size() / 2)}, stream);
    d.run(stream);
    expect_reference_output(c, d);  // the host reads the blocks before the move
  }
  PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_F(DecodeCuda, RepeatedRunsAreBitIdentical) {
  const case_config cfg = bf16_case(8, 4, {20000, 3, 777});
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  device_case d(c);
  std::vector<unsigned char> first, again;
  d.run();
  d.o.to(first);
  for (int i = 0; i < 5; ++i) {
    d.run();
    d.o.to(again);
    ASSERT_EQ(first, again) << "run " << i << " differs: a race";
  }
}

TEST_F(DecodeCuda, GraphReplayFollowsLengthsOnTheDevice) {
  const case_config cfg = bf16_case(4, 2, {3000, 5000});
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  device_case d(c);
  cudaStream_t stream;
  PAGEDKV_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  pk::cuda::decode(d.params, d.workspace.get(), d.workspace.bytes(), stream);
  PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // Shrink the lengths on the device only, then replay: the output must follow, down to a slot
  // the batch left empty (length 0: zeros).
  for (std::vector<std::int32_t> lens :
       {std::vector<std::int32_t>{1, 4999}, std::vector<std::int32_t>{2999, 17}, std::vector<std::int32_t>{0, 4000}}) {
    PAGEDKV_CUDA_CHECK(cudaMemcpy(d.kv_lens.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    PAGEDKV_CUDA_CHECK(cudaMemset(d.o.get(), 0xff, d.o.bytes()));
    PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    c.kv_lens = lens;
    c.cfg.kv_lens = lens;
    pk::reference::attention(c.params);
    std::vector<unsigned char> o;
    d.o.to(o);
    pk::testing::dense_result ref;
    for (std::size_t i = 0; i < c.out_elems(); ++i) ref.out.push_back(c.out(i));
    const auto cmp = pk::testing::compare(c, o.data(), nullptr, ref);
    EXPECT_EQ(cmp.non_finite, 0u);
    EXPECT_LE(cmp.rel_error, pk::testing::tolerance(cfg.q_dtype));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(DecodeCudaErrors, NameTheUnsupportedValue) {
  // Dispatch and checks run before any device call, so this test needs no GPU.
  pk::attention_params p;
  std::vector<std::int32_t> lens = {4};
  std::vector<pagedkv::block_id> table = {0};
  alignas(16) static unsigned char pool[1 << 16], q[1 << 12], o[1 << 12];
  p.q = q; p.o = o; p.k = pool; p.v = pool;
  p.table.indices = table.data();
  p.table.kv_lens = lens.data();
  p.table.max_blocks_per_seq = 1;
  p.num_seqs = 1; p.num_kv_heads = 1; p.num_qo_heads = 1; p.head_dim = 72;
  p.block_stride = 16 * 72; p.token_stride = 72; p.head_stride = 72; p.max_kv_len = 16;
  const auto message_of = [&] {
    try {
      (void)pk::cuda::plan_decode(p);
    } catch (const pagedkv::error& e) {
      EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of().find("head_dim 72"), std::string::npos) << message_of();
  p.head_dim = 128; p.block_stride = 16 * 128; p.token_stride = 128; p.head_stride = 128;
  p.num_qo_heads = 17;  // beyond the tensor-core body (16-bit KV) and every CUDA-core bucket (fp8 KV)
  EXPECT_NE(message_of().find("group size 17"), std::string::npos) << message_of();
  p.kv_dtype = pk::dtype::fp8_e4m3;
  EXPECT_NE(message_of().find("group size 17"), std::string::npos) << message_of();
  p.num_qo_heads = 1;
  p.kv_dtype = pk::dtype::fp8_e4m3;
  p.q_dtype = pk::dtype::fp8_e4m3;
  EXPECT_NE(message_of().find("q_dtype fp8_e4m3"), std::string::npos) << message_of();
  p.kv_dtype = p.q_dtype = pk::dtype::bf16;
  p.max_splits = -1;
  EXPECT_NE(message_of().find("max_splits -1"), std::string::npos) << message_of();
}
