// The CUDA prefill against the host reference: ragged query lengths 1..4096, prefix-cached
// offsets, chunked prompts that reproduce the whole prompt, block sizes 1..256 (1, 3, 17 among
// them), GQA 1, 5 and 16, every head_dim and dtype pair compiled, fp8 KV with per-head scales,
// window, soft-cap and ALiBi, shuffled dense and CSR tables, NHD and HND, split KV, CUDA-graph
// replay; fresh random inputs, poisoned outputs and workspace; errors that name the value. On an
// sm_90 device every case the wgmma body takes (head_dim 128, KV of q's type) runs three ways: the
// planner's pick (wgmma, TMA where the pages allow), the wgmma body with every tile by cp.async, and
// the mma.sync body, each against the reference.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <pagedkv/cuda/prefill.cuh>

#include "attention_case.hpp"
#include "device_attention_case.cuh"
#include "gpu_test.cuh"

namespace pk = pagedkv::kernels;
using pk::testing::attention_case;
using pk::testing::case_config;
using pk::cuda::device_buffer;
using pk::testing::device_inputs;
using pk::testing::prompt_case;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r = pk::testing::seeded_rng();
  return r;
}

struct dtype_pair {
  pk::dtype q, kv;
};
constexpr dtype_pair prefill_dtypes[] = {{pk::dtype::bf16, pk::dtype::bf16},
                                         {pk::dtype::f16, pk::dtype::f16},
                                         {pk::dtype::bf16, pk::dtype::fp8_e4m3},
                                         {pk::dtype::f16, pk::dtype::fp8_e4m3}};

bool compiled(const case_config& cfg) {
  if (pk::cuda::prefill_all_dtypes) return true;
  return (cfg.head_dim == 64 || cfg.head_dim == 128) && cfg.kv_dtype != pk::dtype::f16;
}

/// A prefill of c on the device: plan, workspace (0xff: NaN), run.
struct prefill_run {
  device_inputs d;
  pk::cuda::prefill_plan plan;
  device_buffer workspace;

  explicit prefill_run(const attention_case& c, pk::cuda::prefill_kernel kernel = pk::cuda::prefill_kernel::automatic)
      : d(c), plan(pk::cuda::plan_prefill(d.params, c.q_indptr, kernel)), workspace(plan.workspace_bytes) {}
  void run(cudaStream_t stream = nullptr) {
    pk::cuda::prefill(d.params, plan, workspace.get(), workspace.bytes(), stream);
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

/// Runs the prefill and the host reference on one fresh case; returns the plan it ran. Where the
/// planner picked a wgmma body, the other bodies run the case too.
pk::cuda::prefill_plan check_case(const case_config& cfg) {
  SCOPED_TRACE(cfg.describe());
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  prefill_run r(c);
  r.run();
  pk::testing::expect_reference_output(c, r.d.o, r.d.lse, r.plan.num_splits > 1);
  if (r.plan.kernel == pk::cuda::prefill_kernel::wgmma) {
    {
      SCOPED_TRACE("the mma.sync body");
      prefill_run m(c, pk::cuda::prefill_kernel::mma);
      m.run();
      pk::testing::expect_computed_reference(c, m.d.o, m.d.lse, m.plan.num_splits > 1);
    }
    // bf16 only: one more instantiation in this test (f16 KV exists only in the full sweep).
    if (cfg.q_dtype == pk::dtype::bf16) {
      SCOPED_TRACE("the wgmma body, every tile by cp.async, in the other CTA order");
      prefill_run w(c, pk::cuda::prefill_kernel::wgmma);
      w.plan.tiles_across_heads = !w.plan.tiles_across_heads;
      pk::cuda::detail::launch_prefill_wgmma_kernel<__nv_bfloat16>(w.d.params, w.plan, w.workspace.get(), nullptr,
                                                                   true, false);
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      pk::testing::expect_computed_reference(c, w.d.o, w.d.lse, w.plan.num_splits > 1);
    }
  }
  return r.plan;
}

bool device_is_sm90() {
  int major = 0, minor = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  return major == 9 && minor == 0;
}

int device_sms() {
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

class PrefillCuda : public ::testing::Test {
 protected:
  void SetUp() override { PAGEDKV_SKIP_WITHOUT_GPU(); }
};

}  // namespace

// Ragged query lengths (1, 7, 64, 65, 129, 700) after cached prefixes of 0 to 1871 tokens (not
// multiples of the block or the tile), a sequence of no tokens (zeros, LSE -inf), GQA 1, 5, 16;
// split and not.
TEST_F(PrefillCuda, RaggedQueryLengthsAfterCachedPrefixes) {
  for (const int group : {1, 5, 16}) {
    case_config cfg = prompt_case(group, group == 16 ? 1 : 2, {1, 7, 77, 300, 1100, 2000, 0}, {1, 7, 64, 65, 700, 129, 1});
    cfg.csr = group == 5;
    check_case(cfg);  // few CTAs: split
    cfg.max_splits = 1;
    EXPECT_EQ(check_case(cfg).num_splits, 1);
  }
}

// Every block size, GQA group, head_dim and dtype pair, with the layouts, orders, tables, scales
// and LSE varied by the case's place in the sweep. One test a (block size, group), so that gtest's
// shards split it: as one test the full sweep's 360 cases ran past 110 s on an H100 (run c7).
constexpr int sweep_block_sizes[] = {1, 3, 16, 17, 64, 256};
constexpr int sweep_groups[] = {1, 5, 16};
constexpr int sweep_head_dims[] = {64, 80, 96, 128, 256};

class PrefillCudaSweep : public PrefillCuda, public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(PrefillCudaSweep, HeadDimDtype) {
  const auto [bs_at, group_at] = GetParam();
  const int bs = sweep_block_sizes[bs_at], group = sweep_groups[group_at];
  int index = (bs_at * int(std::size(sweep_groups)) + group_at) * int(std::size(sweep_head_dims) * std::size(prefill_dtypes));
  int skipped = 0;
  for (const int d : sweep_head_dims)
    for (const auto& [qt, kvt] : prefill_dtypes) {
      case_config cfg = pk::testing::sweep_case(bs, group, d, qt, kvt, index);
      cfg.with_lse = index % 5 != 0;
      std::uniform_int_distribution<int> len(2, 2 * bs + 250);
      cfg.kv_lens = {1, len(rng()), len(rng())};
      std::uniform_int_distribution<int> q(1, 90);
      cfg.q_lens = {1, q(rng()), q(rng())};
      ++index;
      if (!compiled(cfg)) {
        ++skipped;
        continue;
      }
      check_case(cfg);
      if (HasFailure()) return;
    }
  if (skipped) std::printf("[ note     ] %d cases not compiled in this build (PAGEDKV_KERNELS_FULL_SWEEP=OFF)\n", skipped);
}

INSTANTIATE_TEST_SUITE_P(BlockSizeGroup, PrefillCudaSweep,
                         ::testing::Combine(::testing::Range(0, int(std::size(sweep_block_sizes))),
                                            ::testing::Range(0, int(std::size(sweep_groups)))),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return "bs" + std::to_string(sweep_block_sizes[std::get<0>(info.param)]) + "_group" +
                                  std::to_string(sweep_groups[std::get<1>(info.param)]);
                         });


// Whole prompts of 4096 and 2500 tokens; 1500 queries over 6000 tokens, fp8 KV, GQA 4.
TEST_F(PrefillCuda, LongPrompts) {
  check_case(prompt_case(1, 1, {4096}, {4096}));
  check_case(prompt_case(2, 2, {2500, 33}, {2500, 33}));
  case_config cfg = prompt_case(4, 2, {6000}, {1500});
  cfg.kv_dtype = pk::dtype::fp8_e4m3;
  cfg.per_head_scale = true;
  check_case(cfg);
}

// A prompt prefilled in chunks (1, 255, 256 and 488 tokens, each over the tokens before it) gives
// the whole prompt's output: each chunk a run of its own over the same pool and table.
TEST_F(PrefillCuda, ChunkedPromptReproducesTheWholePrompt) {
  for (const auto& [qt, kvt] : {dtype_pair{pk::dtype::bf16, pk::dtype::bf16}, dtype_pair{pk::dtype::bf16, pk::dtype::fp8_e4m3}}) {
    case_config cfg = prompt_case(4, 2, {1000}, {1000});
    cfg.q_dtype = qt;
    cfg.kv_dtype = kvt;
    cfg.block_size = 17;
    SCOPED_TRACE(cfg.describe());
    attention_case c;
    pk::testing::make_case(c, cfg, rng());
    prefill_run whole(c);
    whole.run();
    std::vector<unsigned char> whole_o, chunked_o;
    whole.d.o.to(whole_o);
    device_inputs chunked(c);  // its o: poison until the chunks write it
    std::int32_t done = 0;
    for (const std::int32_t chunk : {1, 255, 256, 488}) {
      const std::vector<std::int32_t> q_indptr = {done, done + chunk}, kv_len = {done + chunk};
      const device_buffer d_q_indptr = device_buffer::from(q_indptr), d_kv_len = device_buffer::from(kv_len);
      pk::attention_params p = chunked.params;
      p.q_indptr = d_q_indptr.as<std::int32_t>();
      p.table.kv_lens = d_kv_len.as<std::int32_t>();
      const auto plan = pk::cuda::plan_prefill(p, q_indptr);
      const device_buffer workspace(plan.workspace_bytes);
      pk::cuda::prefill(p, plan, workspace.get(), workspace.bytes());
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      done += chunk;
    }
    ASSERT_EQ(done, 1000);
    chunked.o.to(chunked_o);
    pk::testing::dense_result whole_result;
    for (std::size_t i = 0; i < c.out_elems(); ++i) whole_result.out.push_back(pk::testing::load_as(qt, whole_o.data(), i));
    const auto cmp = pk::testing::compare(c, chunked_o.data(), nullptr, whole_result);
    EXPECT_EQ(cmp.non_finite, 0u);
    EXPECT_LE(cmp.rel_error, pk::testing::tolerance(qt)) << "chunks against the whole prompt";
    pk::testing::expect_reference_output(c, chunked.o, chunked.lse, false);
  }
}

// GQA 5 and 16 with fp8 KV (per-head scales), windows of 0, 5 and 100 tokens, a soft-cap, ALiBi,
// alone and together, over prefixes and chunks.
TEST_F(PrefillCuda, GqaFp8WindowSoftCapAlibi) {
  int index = 0;
  for (const int group : {5, 16})
    for (const auto& [qt, kvt] : {dtype_pair{pk::dtype::bf16, pk::dtype::fp8_e4m3}, dtype_pair{pk::dtype::f16, pk::dtype::fp8_e4m3},
                                  dtype_pair{pk::dtype::bf16, pk::dtype::bf16}})
      for (const int variant : {0, 1, 2, 3}) {
        case_config cfg = prompt_case(group, 2, {1, 300, 900}, {1, 300, 257});
        cfg.q_dtype = qt;
        cfg.kv_dtype = kvt;
        cfg.per_head_scale = true;
        cfg.block_size = index % 2 ? 3 : 16;
        cfg.csr = index % 3 == 0;
        cfg.layout = index % 2 ? pk::kv_layout::hnd : pk::kv_layout::nhd;
        cfg.window_left = std::array{0, 5, 100, -1}[std::size_t(variant)];
        cfg.soft_cap = variant == 1 || variant == 3 ? 30.0f : 0.0f;
        cfg.alibi = variant >= 2;
        ++index;
        check_case(cfg);
        if (HasFailure()) return;
      }
}

// Few queries over long contexts split the KV (merge_states joins the partials); max_splits caps
// the split count and 1 turns it off.
TEST_F(PrefillCuda, SplitKvForFewQueriesOverLongContexts) {
  for (const auto& [qt, kvt] : {dtype_pair{pk::dtype::bf16, pk::dtype::bf16}, dtype_pair{pk::dtype::f16, pk::dtype::fp8_e4m3}}) {
    case_config cfg = prompt_case(4, 1, {20000, 9001, 1}, {16, 3, 1});
    cfg.q_dtype = qt;
    cfg.kv_dtype = kvt;
    const int splits = check_case(cfg).num_splits;
    EXPECT_GT(splits, 1);
    for (const int cap : {1, 3}) {
      cfg.max_splits = cap;
      EXPECT_EQ(check_case(cfg).num_splits, std::min(cap, splits)) << "max_splits " << cap;
    }
    cfg.max_splits = 0;
    cfg.window_left = 700;  // most splits hold none of a row's keys: zeros and -inf, weighed 0
    cfg.alibi = true;
    EXPECT_GT(check_case(cfg).num_splits, 1);
  }
}

// Pages the wgmma body copies by TMA (block sizes 16, 32, 64, 128, 256: runs of 16 to 128 rows) over
// shuffled tables, dense and CSR, NHD and HND, after cached prefixes (tiles wholly inside the
// range by TMA, the range's last tile by cp.async), split and not, GQA 1 and 6; a window (CTAs whose
// range starts mid-run: every tile by cp.async in the same body) and fp8 KV (the mma.sync body).
TEST_F(PrefillCuda, TmaPageRunsAfterPrefixesShuffledTables) {
  int index = 0;
  for (const int bs : {16, 32, 64, 128, 256})
    for (const int group : {1, 6}) {
      case_config cfg = prompt_case(group, 2, {1000, 129, 2300}, {300, 129, 700});
      cfg.block_size = bs;
      cfg.layout = index % 2 ? pk::kv_layout::hnd : pk::kv_layout::nhd;
      cfg.order = index % 3 == 1 ? pk::layer_order::block_major : pk::layer_order::layer_major;
      cfg.num_layers = 1 + index % 2;
      cfg.layer = index % 2;
      cfg.csr = index % 2 == 0;
      cfg.max_splits = index % 3 == 2 ? 1 : 0;
      check_case(cfg);
      if (HasFailure()) return;
      ++index;
    }
  case_config cfg = prompt_case(4, 1, {1500}, {600});
  cfg.block_size = 64;
  cfg.window_left = 333;
  check_case(cfg);
  cfg.window_left = -1;
  cfg.kv_dtype = pk::dtype::fp8_e4m3;
  check_case(cfg);
}

// Many sequences, more CTAs than the SMs hold at once, one a decode token (q_len 1) among them.
TEST_F(PrefillCuda, ManySequences) {
  case_config cfg = prompt_case(8, 4, {}, {});
  std::uniform_int_distribution<int> len(1, 600);
  for (int i = 0; i < device_sms() / 2 + 7; ++i) {
    const int kv = len(rng());
    cfg.kv_lens.push_back(kv);
    cfg.q_lens.push_back(i % 5 == 0 ? 1 : 1 + kv / (1 + i % 4));
  }
  check_case(cfg);
}

// Small enough for compute-sanitizer, yet every path: 16-bit and fp8 KV, head_dim 64 and 128,
// splits and the merge, odd blocks, CSR, HND, ALiBi with a window.
TEST_F(PrefillCuda, SmallMixedForSanitizers) {
  struct small {
    int group, d, bs;
    pk::dtype q, kv;
  };
  for (const small s : {small{1, 128, 16, pk::dtype::bf16, pk::dtype::bf16}, small{5, 64, 3, pk::dtype::bf16, pk::dtype::fp8_e4m3},
                        small{16, 128, 1, pk::dtype::f16, pk::dtype::fp8_e4m3}}) {
    case_config cfg = prompt_case(s.group, 1, {1, 150, 0, 37}, {1, 70, 1, 37});
    cfg.head_dim = s.d;
    cfg.block_size = s.bs;
    cfg.q_dtype = s.q;
    cfg.kv_dtype = s.kv;
    cfg.csr = s.bs == 3;
    cfg.layout = s.bs == 1 ? pk::kv_layout::hnd : pk::kv_layout::nhd;
    cfg.alibi = s.group == 5;
    cfg.window_left = s.group == 5 ? 40 : -1;
    check_case(cfg);
    cfg.kv_lens = {2100};  // one tile of few queries: split
    cfg.q_lens = {9};
    EXPECT_GT(check_case(cfg).num_splits, 1);
  }
}

// The planner's pick: wgmma on sm_90 for head_dim 128 with KV of q's type (its 128 x 128 tile),
// mma.sync otherwise; asking wgmma for a case it does not take is refused naming why.
TEST_F(PrefillCuda, PlannerPicksTheBody) {
  const bool hopper = device_is_sm90();
  case_config cfg = prompt_case(4, 2, {300}, {300});
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  const prefill_run bf16(c);
  EXPECT_EQ(bf16.plan.kernel, hopper ? pk::cuda::prefill_kernel::wgmma : pk::cuda::prefill_kernel::mma);
  EXPECT_EQ(bf16.plan.q_tile_rows, hopper ? 128 : pk::cuda::prefill_tile_of(128).q_rows);
  EXPECT_EQ(bf16.plan.kv_tile_tokens, hopper ? 128 : pk::cuda::prefill_tile_of(128).kv_tokens);
  cfg.kv_dtype = pk::dtype::fp8_e4m3;
  attention_case fp8;
  pk::testing::make_case(fp8, cfg, rng());
  device_inputs d(fp8);
  EXPECT_EQ(pk::cuda::plan_prefill(d.params, fp8.q_indptr).kernel, pk::cuda::prefill_kernel::mma);
  try {
    (void)pk::cuda::plan_prefill(d.params, fp8.q_indptr, pk::cuda::prefill_kernel::wgmma);
    ADD_FAILURE() << "wgmma over fp8 KV was not refused";
  } catch (const pagedkv::error& e) {
    EXPECT_NE(std::string(e.what()).find("the wgmma kernel does not take this case: kv_dtype is not q_dtype"),
              std::string::npos)
        << e.what();
  }
  // A plan of the mma.sync body runs as such; a wgmma plan handed params of another KV type is refused.
  if (hopper) {
    pk::cuda::prefill_plan plan = bf16.plan;
    try {
      pk::cuda::prefill(d.params, plan, nullptr, 0);
      ADD_FAILURE() << "a wgmma plan ran over fp8 KV";
    } catch (const pagedkv::error& e) {
      EXPECT_NE(std::string(e.what()).find("the plan was made for"), std::string::npos) << e.what();
    }
  }
}

TEST_F(PrefillCuda, RepeatedRunsAndGraphReplayAreBitIdentical) {
  case_config cfg = prompt_case(4, 2, {3000, 800, 9000}, {700, 800, 5});
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  prefill_run r(c);
  r.run();
  std::vector<unsigned char> first, again;
  r.d.o.to(first);
  cudaStream_t stream;
  PAGEDKV_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  pk::cuda::prefill(r.d.params, r.plan, r.workspace.get(), r.workspace.bytes(), stream);
  PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) {
    PAGEDKV_CUDA_CHECK(cudaMemset(r.d.o.get(), 0xff, r.d.o.bytes()));
    if (i == 0) r.run();
    else PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    r.d.o.to(again);
    ASSERT_EQ(first, again) << (i == 0 ? "a repeated run" : "a graph replay") << " differs: a race";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  pk::testing::expect_reference_output(c, r.d.o, r.d.lse, r.plan.num_splits > 1);
}

TEST(PrefillCudaErrors, NameTheUnsupportedValue) {
  // The checks run before any device call, so this test needs no GPU.
  pk::attention_params p;
  std::vector<std::int32_t> lens = {4}, q_indptr = {0, 4};
  std::vector<pagedkv::block_id> table = {0};
  alignas(16) static unsigned char pool[1 << 16], q[1 << 12], o[1 << 12];
  p.q = q; p.o = o; p.k = pool; p.v = pool;
  p.q_indptr = q_indptr.data();
  p.table.indices = table.data();
  p.table.kv_lens = lens.data();
  p.table.max_blocks_per_seq = 1;
  p.num_seqs = 1; p.num_kv_heads = 1; p.num_qo_heads = 1; p.head_dim = 72;
  p.block_stride = 16 * 72; p.token_stride = 72; p.head_stride = 72; p.max_kv_len = 16;
  const auto message_of = [&](auto&& call) {
    try {
      call();
    } catch (const pagedkv::error& e) {
      return std::string(pagedkv::to_string(e.code())) + ": " + e.what();
    }
    return std::string("no error");
  };
  const auto plan_error = [&] { return message_of([&] { (void)pk::cuda::plan_prefill(p, q_indptr); }); };
  EXPECT_NE(plan_error().find("invalid_argument: pagedkv: prefill: head_dim 72 is not compiled"), std::string::npos)
      << plan_error();
  p.head_dim = 128; p.block_stride = 16 * 128; p.token_stride = 128; p.head_stride = 128;
  p.q_dtype = p.kv_dtype = pk::dtype::f32;
  EXPECT_NE(plan_error().find("q_dtype f32 is not supported"), std::string::npos) << plan_error();
  p.q_dtype = p.kv_dtype = pk::dtype::bf16;
  p.q_indptr = nullptr;
  EXPECT_NE(plan_error().find("prefill takes q_indptr"), std::string::npos) << plan_error();
  p.q_indptr = q_indptr.data();
  p.k = pool + 8;
  EXPECT_NE(plan_error().find("16-byte aligned"), std::string::npos) << plan_error();
  p.k = pool;
  if (!pk::cuda::prefill_all_dtypes) {
    p.q_dtype = p.kv_dtype = pk::dtype::f16;
    EXPECT_NE(plan_error().find("kv_dtype f16 is not compiled"), std::string::npos) << plan_error();
    p.q_dtype = p.kv_dtype = pk::dtype::bf16;
  }
  // A plan of other params, and a short workspace.
  pk::cuda::prefill_plan plan = pk::cuda::plan_prefill(p, q_indptr, 132, pk::cuda::prefill_tile_of(128), 2);
  const auto run_error = [&] { return message_of([&] { pk::cuda::prefill(p, plan, nullptr, 0); }); };
  p.num_qo_heads = 2;
  EXPECT_NE(run_error().find("the plan was made for 1 sequences, 1 KV heads, group 1"), std::string::npos)
      << run_error();
  p.num_qo_heads = 1;
  plan.num_splits = 3;
  EXPECT_NE(run_error().find("the plan was made for"), std::string::npos) << "split_div left at 1: " << run_error();
  plan.split_div = pk::cuda::fast_divmod(3);
  plan.workspace_bytes = 4096;
  EXPECT_NE(run_error().find("buffer_too_small: pagedkv: prefill: workspace of 0 bytes, the plan needs 4096"),
            std::string::npos)
      << run_error();
}
