// Decode attention bandwidth on the GPU: achieved KV bytes / kernel time, as GB/s and as a
// percentage of a read ceiling (the fastest of three 16-byte read streams) that this binary
// measures first, in the same run. Sweeps batch, context, block size, head_dim, GQA shape, KV
// dtype, and the block table's order: shuffled (random block order), identity (contiguous), or
// built by pagedkv::kv_cache_manager as an engine's would be, with a LIFO free list or with
// extents of one 2 MiB page. CUDA-event manual timing; use --benchmark_out=<file>
// --benchmark_out_format=json for JSON.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <pagedkv/cuda/device_buffer.cuh>
#include <pagedkv/cuda/dispatch.cuh>
#include <pagedkv/cuda/decode_mma.cuh>
#include <pagedkv/cuda/kv_pool.cuh>

#include "engine_tables.hpp"
#include "gpu_bench.cuh"
#include "read_stream.cuh"

namespace pk = pagedkv::kernels;
using pk::cuda::device_buffer;

namespace {

double g_ceiling_gbps = 0.0;

template <class T>
__global__ void fill_random_kernel(T* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 27;
    const float u = float(x >> 40) / float(1ull << 24) * 2.0f - 1.0f;
    p[i] = pk::cuda::from_float<T>(u * scale);
  }
}

template <class T>
void fill_random(void* p, std::size_t n, std::uint64_t seed, float scale) {
  fill_random_kernel<T><<<1024, 256>>>(static_cast<T*>(p), n, seed, scale);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

/// The read ceiling: one pass over 2 GiB by each read stream of read_stream.cuh (16-byte loads,
/// 8 CTAs of 256 threads an SM; 16-byte cp.async, 4 warps of 3 stages, one and two CTAs an SM);
/// the fastest stream's bandwidth is the ceiling.
void bm_read_ceiling(benchmark::State& state) {
  const std::size_t bytes = std::size_t(2) << 30;
  device_buffer data(bytes, 0), sink(4, 0);
  fill_random<float>(data.get(), bytes / 4, 7, 1.0f);
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int stages = 3, copy_smem = 4 * stages * 8192;
  PAGEDKV_CUDA_CHECK(cudaFuncSetAttribute(copy_stream_kernel<stages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          copy_smem));
  const auto stream = [&](int which) {
    if (which == 0)
      read_stream_kernel<<<sms * 8, 256>>>(data.as<uint4>(), bytes / 16, sink.as<unsigned>());
    else  // one or two CTAs an SM
      copy_stream_kernel<stages><<<sms * which, 128, copy_smem>>>(static_cast<const char*>(data.get()), bytes / 8192);
  };
  const std::vector<double> seconds = seconds_of_each(state, 3, stream);
  const auto gbps = [&](int which) { return double(bytes) / seconds[std::size_t(which)] / 1e9; };
  g_ceiling_gbps = std::max({gbps(0), gbps(1), gbps(2)});
  state.counters["GBps"] = g_ceiling_gbps;
  state.counters["loads_GBps"] = gbps(0);
  state.counters["copies_1_GBps"] = gbps(1);
  state.counters["copies_2_GBps"] = gbps(2);
  state.counters["pct_ceiling"] = 100.0;
}

/// Where the block table's ids come from.
enum class table_order {
  shuffled,        ///< every block of the pool, in random order
  identity,        ///< in order: contiguous KV
  engine_lifo,     ///< kv_cache_manager<lifo_free_list> (engine_tables)
  engine_extents,  ///< kv_cache_manager<extent_free_list>, extents of layout.blocks_per_page()
};

/// The sequences' lengths.
enum class length_spread {
  uniform,         ///< every sequence ctx tokens
  engine,          ///< an engine's decode batch (engine_lengths), in random order
  longest_first,   ///< the same lengths, longest first
};

/// The plan a decode_engine row launches (bf16 head_dim 128 only, groups of up to 8): the
/// library's own, or a CTA shape forced (decode_plan.hpp's shapes) with plan_decode's split for
/// its tile; split_512: narrow CTAs over chunks of 512 tokens; paired: two adjacent KV heads a CTA
/// (NHD pools only), as the fp8 body's pairs, over 512-byte rows. (Values 3, 4 and 6 were reading
/// ahead, not kept: docs/journal/decode-kernel.md, "Short contexts at large batch".)
enum class forced_plan { automatic = 0, narrow = 1, shallow = 2, split_512 = 5, paired = 7 };

struct decode_shape {
  int batch, ctx, block_size, head_dim, qo_heads, kv_heads;
  bool fp8;
  table_order table;
  bool hnd;
  int max_splits;  // attention_params::max_splits, 0: the kernel's choice
  length_spread lengths = length_spread::uniform;
  forced_plan plan = forced_plan::automatic;
};

/// `count` lengths of a mean near ctx as an engine's running decode batch has them: each a
/// ShareGPT-like prompt (ln ~ N(4.6147, 1.0), at most 1024 tokens) plus a uniform share of its
/// output (ln ~ N(5.4417, 0.9), at most 1024; docs/simulation.md), scaled to the mean ctx.
std::vector<std::int32_t> engine_lengths(int count, int ctx, bool longest_first) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> z;
  std::uniform_real_distribution<double> u;
  std::vector<double> raw;
  for (int i = 0; i < count; ++i) {
    const double prompt = std::min(1024.0, std::round(std::exp(4.6147 + 1.0 * z(rng))));
    const double output = std::min(1024.0, std::round(std::exp(5.4417 + 0.9 * z(rng))));
    raw.push_back(std::max(1.0, prompt) + u(rng) * output);
  }
  const double mean = std::accumulate(raw.begin(), raw.end(), 0.0) / count;
  std::vector<std::int32_t> lens;
  for (const double x : raw) lens.push_back(std::max(1, int(std::lround(x * ctx / mean))));
  if (longest_first) std::sort(lens.begin(), lens.end(), std::greater<>());
  return lens;
}

/// Launches the tensor-core body (bf16, head_dim 128, one n-tile) on CTA shape Shape with `plan`,
/// its shared-memory limit raised first (this TU's instance of the kernel is its own).
template <pk::cuda::decode_cta Shape>
void launch_forced(const pk::attention_params& p, const pk::cuda::decode_plan& plan, void* workspace,
                   std::size_t workspace_bytes, cudaStream_t stream) {
  namespace d = pk::cuda::detail;
  using bf = __nv_bfloat16;
  static const bool allowed = [] {
    d::allow_smem(d::decode_mma_kernel<bf, bf, 128, 1, Shape>, d::decode_mma_smem<bf, bf, 128, 1, Shape>::bytes);
    return true;
  }();
  (void)allowed;
  d::launch_decode_mma_kernel<bf, bf, 128, 1, Shape>(p, plan, workspace, workspace_bytes, stream);
}

/// The plan of a forced row (see forced_plan) on the GPU's SMs; `library` is the library's own.
pk::cuda::decode_plan forced_plan_of(const pk::attention_params& p, forced_plan which, int sms,
                                     const pk::cuda::decode_plan& library) {
  using policy = pk::cuda::decode_mma_policy<__nv_bfloat16, 128>;
  using paired = pk::cuda::decode_mma_policy<__nv_bfloat16, 128, pk::cuda::decode_cta::paired>;
  if (which == forced_plan::automatic) return library;
  if (which == forced_plan::paired) {
    pk::cuda::decode_plan plan = pk::cuda::plan_decode(p, sms, paired::tile_tokens, policy::min_chunk_tokens);
    plan.cta = pk::cuda::decode_cta::paired;
    return plan;
  }
  pk::cuda::decode_plan plan = pk::cuda::plan_decode(p, sms, policy::tile_tokens, policy::min_chunk_tokens);
  if (which == forced_plan::shallow) plan.cta = pk::cuda::decode_cta::shallow;
  if (which == forced_plan::split_512) {
    plan.chunk_tokens = 512;
    plan.num_splits = (p.max_kv_len + 511) / 512;
    plan.workspace_bytes = plan.num_splits > 1 ? std::size_t(plan.num_splits) * std::size_t(p.num_seqs) *
                                                     std::size_t(p.num_qo_heads) * (128 + 1) * sizeof(float)
                                               : 0;
  }
  return plan;
}

/// Decode over disjoint copies of the batch's KV, rotated per iteration so that small
/// shapes are not served from the 50 MB L2; with ALiBi (slopes 2^(-8 (h + 1) / heads), BLOOM's for
/// 32 heads) when `alibi`.
/// decode_engine rows: lengths as an engine's batch has them (length_spread) and a forced plan,
/// their tables as long as the longest sequence.
void bm_decode(benchmark::State& state, bool alibi, bool engine_row) {
  const decode_shape s{int(state.range(0)), int(state.range(1)), int(state.range(2)), int(state.range(3)),
                       int(state.range(4)), int(state.range(5)), state.range(6) != 0,
                       table_order(state.range(7)), state.range(8) != 0, int(state.range(9)),
                       engine_row ? length_spread(state.range(10)) : length_spread::uniform,
                       engine_row ? forced_plan(state.range(11)) : forced_plan::automatic};
  const pk::dtype kv_t = s.fp8 ? pk::dtype::fp8_e4m3 : pk::dtype::bf16;
  const std::vector<std::int32_t> seq_lens =
      s.lengths == length_spread::uniform ? std::vector<std::int32_t>(std::size_t(s.batch), s.ctx)
                                          : engine_lengths(s.batch, s.ctx, s.lengths == length_spread::longest_first);
  const std::int32_t longest = *std::max_element(seq_lens.begin(), seq_lens.end());
  const int blocks_per_seq = (longest + s.block_size - 1) / s.block_size;
  const double kv_bytes = double(std::accumulate(seq_lens.begin(), seq_lens.end(), std::int64_t(0))) * s.kv_heads *
                          s.head_dim * 2.0 * double(pk::size_of(kv_t));
  const rotation r(kv_bytes);  // r.sets copies of the KV, r.reps launches a graph
  const std::int64_t blocks_per_set = std::int64_t(s.batch) * blocks_per_seq, used = blocks_per_set * r.sets;
  const bool engine = s.table == table_order::engine_lifo || s.table == table_order::engine_extents;
  const auto capacity = std::int32_t(engine ? used + used / 8 + 1 : used);  // engine: others' blocks too
  const auto layout = pk::make_kv_cache_layout({1, capacity, s.block_size, s.kv_heads, s.head_dim},
                                               s.hnd ? pk::kv_layout::hnd : pk::kv_layout::nhd, kv_t);
  pk::cuda::device_kv_pool pool(layout);
  if (s.fp8) fill_random<__nv_fp8_e4m3>(pool.data(), std::size_t(layout.size()), 1, 8.0f);
  else fill_random<__nv_bfloat16>(pool.data(), std::size_t(layout.size()), 1, 1.0f);
  std::vector<pagedkv::block_id> all(static_cast<std::size_t>(used));
  std::iota(all.begin(), all.end(), 0);
  if (s.table == table_order::shuffled) std::shuffle(all.begin(), all.end(), std::mt19937_64(42));
  if (s.table == table_order::engine_lifo)
    all = engine_tables<pagedkv::lifo_free_list>(s.batch * r.sets, longest, s.block_size, capacity, 0);
  if (s.table == table_order::engine_extents)
    all = engine_tables<pagedkv::extent_free_list>(s.batch * r.sets, longest, s.block_size, capacity,
                                                   layout.blocks_per_page());
  std::vector<device_buffer> tables;
  for (int k = 0; k < r.sets; ++k)
    tables.push_back(device_buffer::from(std::vector<pagedkv::block_id>(all.begin() + k * blocks_per_set,
                                                                        all.begin() + (k + 1) * blocks_per_set)));
  device_buffer lens = device_buffer::from(seq_lens);
  const std::size_t q_elems = std::size_t(s.batch) * s.qo_heads * s.head_dim;
  device_buffer q(q_elems * 2, 0), o(q_elems * 2, 0);
  fill_random<__nv_bfloat16>(q.get(), q_elems, 3, 1.0f);

  pk::attention_params p;
  p.set_kv(pool.layout(), pool.data(), 0);
  p.q = q.get();
  p.o = o.get();
  p.q_dtype = pk::dtype::bf16;
  p.max_splits = s.max_splits;
  std::vector<float> slopes;
  for (int h = 0; h < s.qo_heads; ++h) slopes.push_back(std::exp2(-8.0f * float(h + 1) / float(s.qo_heads)));
  const device_buffer alibi_slopes = device_buffer::from(slopes);
  if (alibi) p.alibi_slopes = alibi_slopes.as<float>();
  p.num_seqs = s.batch;
  p.num_qo_heads = s.qo_heads;
  p.table.kv_lens = lens.as<std::int32_t>();
  p.table.max_blocks_per_seq = blocks_per_seq;
  p.table.indices = tables[0].as<pagedkv::block_id>();
  p.max_kv_len = longest;
  p.sm_scale = 1.0f / std::sqrt(float(s.head_dim));
  p.k_scale = p.v_scale = s.fp8 ? 0.125f : 1.0f;
  pk::cuda::decode_plan plan;
  try {
    plan = pk::cuda::plan_decode(p);
  } catch (const pagedkv::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (s.plan != forced_plan::automatic) {
    if (s.fp8 || s.head_dim != 128 || s.qo_heads > 8 * s.kv_heads) {
      state.SkipWithError("forced plans are bf16 head_dim 128 with groups of up to 8");
      return;
    }
    if (s.plan == forced_plan::paired && !pk::cuda::decode_pairs_fit(p)) {
      state.SkipWithError("paired CTAs need an NHD pool");
      return;
    }
    plan = forced_plan_of(p, s.plan, sms, plan);
  }
  device_buffer workspace(plan.workspace_bytes, 0);
  const auto run = [&](cudaStream_t stream) {
    switch (s.plan) {
      case forced_plan::automatic: pk::cuda::decode(p, workspace.get(), workspace.bytes(), stream); break;
      default:
        if (plan.cta == pk::cuda::decode_cta::paired)
          launch_forced<pk::cuda::decode_cta::paired>(p, plan, workspace.get(), workspace.bytes(), stream);
        else if (plan.cta == pk::cuda::decode_cta::shallow)
          launch_forced<pk::cuda::decode_cta::shallow>(p, plan, workspace.get(), workspace.bytes(), stream);
        else
          launch_forced<pk::cuda::decode_cta::narrow>(p, plan, workspace.get(), workspace.bytes(), stream);
    }
  };
  const double seconds = seconds_per_launch(state, r.reps, [&](int k, cudaStream_t stream) {
    p.table.indices = tables[std::size_t(k % r.sets)].as<pagedkv::block_id>();
    run(stream);
  });
  if (seconds == 0) return;
  const double gbps = kv_bytes / seconds / 1e9;
  state.counters["GBps"] = gbps;
  state.counters["pct_ceiling"] = g_ceiling_gbps > 0 ? 100.0 * gbps / g_ceiling_gbps : 0.0;
  state.counters["splits"] = plan.num_splits;
  state.counters["cta"] = double(int(plan.cta));  // decode_cta: 0 narrow, 1 wide, 2 shallow, 3 paired
  state.counters["mean_ctx"] = kv_bytes / (double(s.batch) * s.kv_heads * s.head_dim * 2.0 * double(pk::size_of(kv_t)));
  state.counters["longest"] = longest;
  state.counters["kv_MB"] = kv_bytes / 1e6;
  state.counters["us"] = seconds * 1e6;
}

const std::vector<std::string> arg_names = {"batch", "ctx", "bs", "hd", "hq", "hkv", "fp8", "table", "hnd", "max_splits"};
constexpr double max_kv_bytes = 9e9;  // fits the H100's 80 GB with room for rotation sets

const std::vector<std::string> engine_arg_names = [] {
  std::vector<std::string> names = arg_names;
  names.insert(names.end(), {"lengths", "plan"});
  return names;
}();

void add(const char* group, std::vector<std::int64_t> args) {
  if (args.size() < arg_names.size()) args.push_back(0);  // max_splits: the kernel's choice
  const double bytes = double(args[0]) * double(args[1]) * double(args[5]) * double(args[3]) * 2.0 * (args[6] ? 1 : 2);
  if (bytes > max_kv_bytes) return;
  const bool alibi = std::string(group) == "alibi", engine_row = args.size() > arg_names.size();
  benchmark::RegisterBenchmark((std::string("decode_") + group).c_str(),
                               [alibi, engine_row](benchmark::State& state) { bm_decode(state, alibi, engine_row); })
      ->Args(args)
      ->ArgNames(engine_row ? engine_arg_names : arg_names)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(0.1);
}

void register_all() {
  benchmark::RegisterBenchmark("read_ceiling", bm_read_ceiling)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  // Llama-2-7B (32/32) and Llama-3-8B (32/8) shapes, bf16, head_dim 128, block 16, shuffled tables.
  for (int hkv : {32, 8})
    for (int batch : {1, 16, 64, 256})
      for (int ctx : {128, 512, 2048, 8192, 32768}) add("shape", {batch, ctx, 16, 128, 32, hkv, 0, 0, 0});
  // fp8 KV on the same shapes where bf16 is large, and with groups of 2 (16 KV heads).
  for (int hkv : {32, 16, 8})
    for (auto [batch, ctx] : {std::pair{1, 8192}, std::pair{16, 2048}, std::pair{64, 2048}, std::pair{64, 8192}, std::pair{256, 2048}})
      add("fp8", {batch, ctx, 16, 128, 32, hkv, 1, 0, 0});
  // Paged overhead: identity tables on the shapes above, and tables as an engine's
  // kv_cache_manager builds them (engine_tables), with a LIFO free list and with extents.
  for (int hkv : {32, 8})
    for (auto [batch, ctx] : {std::pair{1, 8192}, std::pair{16, 2048}, std::pair{64, 2048}, std::pair{64, 8192}}) {
      add("identity", {batch, ctx, 16, 128, 32, hkv, 0, int(table_order::identity), 0});
      add("engine_lifo", {batch, ctx, 16, 128, 32, hkv, 0, int(table_order::engine_lifo), 0});
      add("engine_extents", {batch, ctx, 16, 128, 32, hkv, 0, int(table_order::engine_extents), 0});
    }
  for (auto [batch, ctx] : {std::pair{64, 2048}, std::pair{64, 8192}})
    add("engine_extents", {batch, ctx, 16, 128, 32, 8, 1, int(table_order::engine_extents), 0});
  // HND layout (a block holds each head's tokens contiguously) on the same shapes, bf16 and fp8.
  for (int fp8 : {0, 1})
    for (int hkv : {32, 8})
      for (auto [batch, ctx] : {std::pair{1, 8192}, std::pair{16, 2048}, std::pair{64, 2048}, std::pair{64, 8192}, std::pair{256, 2048}})
        add("hnd", {batch, ctx, 16, 128, 32, hkv, fp8, 0, 1});
  // Whole waves: 132 SMs x 2 CTAs = 264 slots; MHA batch 66 and GQA 32/8 batch 66 fill 8 and
  // 2 waves exactly, where batch 64 leaves the last wave 76% / 94% full.
  for (int hkv : {32, 8}) add("waves", {66, 2048, 16, 128, 32, hkv, 0, 0, 0});
  add("waves", {66, 8192, 16, 128, 32, 8, 0, 0, 0});
  // Block sizes, GQA 32/8, batch 64, context 2k.
  for (int bs : {1, 8, 16, 32, 64, 128, 256}) add("block_size", {64, 2048, bs, 128, 32, 8, 0, 0, 0});
  // head_dim, GQA 32/8, batch 64, context 2k.
  for (int hd : {64, 80, 96, 128, 256}) add("head_dim", {64, 2048, 16, hd, 32, 8, 0, 0, 0});
  // Split-K: the planner's choice (max_splits 0) against caps, on the shapes that split.
  for (int hkv : {32, 8})
    for (auto [batch, ctx] : {std::pair{1, 8192}, std::pair{16, 2048}, std::pair{16, 512}})
      for (int cap : {0, 1, 2, 4, 8, 16, 32, 64}) add("split_cap", {batch, ctx, 16, 128, 32, hkv, 0, 0, 0, cap});
  // ALiBi against the same shapes without it.
  for (int hkv : {32, 8})
    for (auto [batch, ctx] : {std::pair{1, 8192}, std::pair{16, 2048}, std::pair{64, 2048}})
      add("alibi", {batch, ctx, 16, 128, 32, hkv, 0, 0, 0});
  // The same 512 units of 2048 tokens a KV head (GQA 32/8 batch 64 ctx 2k's grid) with groups of
  // 1, 2 and 4 over 8 KV heads, and MHA 32/32 batch 16: what the group costs at a fixed grid.
  for (int hq : {8, 16, 32}) add("group", {64, 2048, 16, 128, hq, 8, 0, int(table_order::engine_extents), 0});
  add("group", {16, 2048, 16, 128, 32, 32, 0, int(table_order::engine_extents), 0});
  // GQA ratios at batch 16, context 4k.
  for (int hkv : {32, 16, 8, 4, 2}) add("gqa", {16, 4096, 16, 128, 32, hkv, 0, 0, 0});
  // The engine's llama3-8b decode steps (run e1: 199 sequences of ~246 tokens, 128 of ~361) and
  // llama2-7b's MHA on them: engine LIFO tables, uniform and engine-spread lengths (in random
  // order and longest first), the library's plan and forced ones (forced_plan) in the same binary,
  // over NHD pools (the engine's) and HND ones (the library's plan).
  using fp = forced_plan;
  for (int hkv : {8, 32})
    for (auto [batch, ctx] : {std::pair{200, 250}, std::pair{128, 360}})
      for (int lengths : {0, 1, 2})
        for (int hnd : {0, 1})
          for (fp plan : {fp::automatic, fp::narrow, fp::shallow, fp::split_512, fp::paired}) {
            if (lengths == 0 && plan == fp::split_512) continue;  // one split of 512 already
            if (lengths == 2 && plan == fp::split_512) continue;
            if (hnd == 1 && plan != fp::automatic) continue;
            add("engine", {batch, ctx, 16, 128, 32, hkv, 0, int(table_order::engine_lifo), hnd, 0, lengths, int(plan)});
          }
  // Paired CTAs (two adjacent KV heads a CTA) against the library's plan on the decode table's
  // shapes where pairs fill the SMs (shuffled tables).
  for (int hkv : {8, 32})
    for (auto [batch, ctx] : {std::pair{16, 512}, std::pair{16, 2048}, std::pair{64, 128}, std::pair{64, 512},
                              std::pair{64, 2048}, std::pair{64, 8192}, std::pair{256, 128}, std::pair{256, 512},
                              std::pair{256, 2048}}) {
      if (std::int64_t(batch) * hkv / 2 < 132) continue;
      for (fp plan : {fp::automatic, fp::paired})
        add("pair", {batch, ctx, 16, 128, 32, hkv, 0, int(table_order::shuffled), 0, 0, 0, int(plan)});
    }
}

}  // namespace

int main(int argc, char** argv) { return run_gpu_benchmarks("bench_decode", argc, argv, register_all); }
