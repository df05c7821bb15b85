// Prefill attention throughput on the GPU: causal FLOPs (counted exactly: 4 * head_dim * query
// heads * the keys each query attends) / kernel time, as TFLOP/s and as a percentage of the dense
// bf16 GEMM rate that cuBLASLt reaches in this binary first, in the same run (8192^3, fp32
// accumulation). Shapes of issue 21, bf16, head_dim 128, under LLaMA-2-7B heads (32/32) and
// Llama-3-8B heads (32/8): one 4k prompt, one 16k prompt, 16 prompts of 1k, a 512-token chunk over
// 8k cached tokens at batch 1 and 8; block size 16 over shuffled pages, the 4k prompt also at
// block sizes 1, 64 and 256 and over an identity table. CUDA-graph timing (gpu_bench.cuh); use
// --benchmark_out=<file> --benchmark_out_format=json for JSON. Variant 0 is the shipped
// prefill() (the planner's body: a wgmma body on an H100/H200); variant 1 the mma.sync body on
// the same shapes; 2 and 3 other CTA shapes of the mma.sync body (prefill_config: warps, m-tiles
// a warp, KV tile tokens), the measurements that choose prefill_policy (prefill_tuning.hpp); 4
// the wgmma body with every K/V tile by cp.async (the shipped body where pages are too small for
// TMA; at block sizes 16, 64 and 256 the comparison with the TMA copies); 7 the shipped launch of
// the wgmma body in the other CTA order (prefill_plan::tiles_across_heads flipped: head by head
// on the 4k prompt, every head's longest tiles first elsewhere; a persistent grid, more KV
// splits, the split rule before ctas_per_sm, the copier's first block ids read ahead and three
// K/V stages were measured as variants 5, 6 and 8 and removed: docs/journal/prefill-kernel.md,
// sessions 4 and 5; so were a persistent grid on a schedule planned on the host, session 6, whose
// variants are on branch wip/gpu-persistent-static, and a last KV tile computed over its first 64
// keys where a warpgroup's rows stop there, session 6, variants on branch wip/gpu-narrow).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cublasLt.h>

#include <pagedkv/cuda/device_buffer.cuh>
#include <pagedkv/cuda/kv_pool.cuh>
#include <pagedkv/cuda/prefill.cuh>

#include "gpu_bench.cuh"

namespace pk = pagedkv::kernels;
using pk::cuda::device_buffer;

namespace {

double g_gemm_tflops = 0.0;

__global__ void fill_bf16_kernel(__nv_bfloat16* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 27;
    p[i] = __float2bfloat16_rn((float(x >> 40) / float(1ull << 24) * 2.0f - 1.0f) * scale);
  }
}

void fill_bf16(void* p, std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  fill_bf16_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

#define PAGEDKV_CUBLAS_CHECK(call)                                                           \
  do {                                                                                       \
    const cublasStatus_t status_ = (call);                                                   \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                    \
      throw std::runtime_error(std::string(#call) + " failed: " + cublasLtGetStatusString(status_)); \
  } while (0)

/// The compute ceiling: D = A B in bf16 (fp32 accumulation), 8192^3, cuBLASLt's first heuristic
/// algorithm with a 64 MiB workspace.
void bm_gemm_ceiling(benchmark::State& state) {
  constexpr int n = 8192;
  const std::size_t elems = std::size_t(n) * n;
  device_buffer a(elems * 2, 0), b(elems * 2, 0), d(elems * 2, 0), workspace(std::size_t(64) << 20, 0);
  fill_bf16(a.get(), elems, 1);
  fill_bf16(b.get(), elems, 2);
  cublasLtHandle_t lt;
  PAGEDKV_CUBLAS_CHECK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op;
  PAGEDKV_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t layout;
  PAGEDKV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  PAGEDKV_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::size_t ws_bytes = workspace.bytes();
  PAGEDKV_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                            sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  PAGEDKV_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(lt, op, layout, layout, layout, layout, pref, 1, &heuristic, &found));
  if (found == 0) {
    state.SkipWithError("cuBLASLt found no algorithm");
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const std::vector<double> seconds = seconds_of_each(state, 1, [&](int) {
    PAGEDKV_CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, a.get(), layout, b.get(), layout, &beta, d.get(), layout, d.get(),
                                        layout, &heuristic.algo, workspace.get(), ws_bytes, nullptr));
  });
  g_gemm_tflops = 2.0 * double(n) * n * n / seconds[0] / 1e12;
  state.counters["TFLOPs"] = g_gemm_tflops;
  state.counters["pct_gemm"] = 100.0;
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
}

enum class shape_id { prompt_4k, prompt_16k, prompts_16x1k, chunk_512_over_8k };

struct prefill_shape {
  shape_id shape;
  int batch, kv_heads, block_size;
  bool identity;  ///< blocks in order (contiguous KV) instead of shuffled
  int variant;    ///< 0: the shipped prefill(); else a prefill_variant
};

/// Candidate CTA shapes of the mma.sync body for head_dim 128 (warps, m-tiles a warp, KV tokens),
/// besides its shipped prefill_policy<128> (variant 1: 8 warps of one m-tile, 64 keys). Other
/// loops tried (the next tile's S overlapped with the softmax, three stages, a lazy rescale of
/// O): docs/journal/prefill-kernel.md.
using variant_2 = pk::cuda::prefill_config<4, 1, 64>;  // the first measurement's shape: 64 rows
using variant_3 = pk::cuda::prefill_config<8, 2, 64>;  // 256 rows

template <class Policy>
void launch_variant(const pk::attention_params& p, const pk::cuda::prefill_plan& plan, void* workspace,
                    cudaStream_t stream) {
  pk::cuda::detail::launch_prefill_kernel<__nv_bfloat16, __nv_bfloat16, 128, Policy>(p, plan, workspace, stream, true);
}

pk::cuda::prefill_tile_shape variant_tile(int variant) {
  switch (variant) {
    case 2: return variant_2::tile();
    case 3: return variant_3::tile();
    default: return pk::cuda::prefill_tile_of(128);
  }
}

/// Causal attention FLOPs of a sequence of kv_len tokens whose last q_len are queries, per query
/// head and head_dim: 4 (two GEMMs, a multiply and an add) for each key a query attends.
double causal_flops(std::int64_t kv_len, std::int64_t q_len, int qo_heads, int head_dim) {
  const std::int64_t first = kv_len - q_len + 1;  // keys of the first query
  const std::int64_t keys = (first + kv_len) * q_len / 2;
  return 4.0 * double(keys) * qo_heads * head_dim;
}

void bm_prefill(benchmark::State& state) {
  const prefill_shape s{shape_id(state.range(0)), int(state.range(1)), int(state.range(2)), int(state.range(3)),
                        state.range(4) != 0, int(state.range(5))};
  constexpr int head_dim = 128, qo_heads = 32;
  int q_len = 0, kv_len = 0;
  switch (s.shape) {
    case shape_id::prompt_4k: q_len = kv_len = 4096; break;
    case shape_id::prompt_16k: q_len = kv_len = 16384; break;
    case shape_id::prompts_16x1k: q_len = kv_len = 1024; break;
    case shape_id::chunk_512_over_8k: q_len = 512; kv_len = 8192 + 512; break;
  }
  const int blocks_per_seq = (kv_len + s.block_size - 1) / s.block_size;
  const auto blocks = std::int32_t(std::int64_t(s.batch) * blocks_per_seq);
  const auto layout =
      pk::make_kv_cache_layout({1, blocks, s.block_size, s.kv_heads, head_dim}, pk::kv_layout::nhd, pk::dtype::bf16);
  pk::cuda::device_kv_pool pool(layout);
  fill_bf16(pool.data(), std::size_t(layout.size()), 3);
  std::vector<pagedkv::block_id> table(static_cast<std::size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  if (!s.identity) std::shuffle(table.begin(), table.end(), std::mt19937_64(42));
  std::vector<std::int32_t> q_indptr = {0};
  for (int i = 0; i < s.batch; ++i) q_indptr.push_back(q_indptr.back() + q_len);
  const device_buffer d_table = device_buffer::from(table), d_q_indptr = device_buffer::from(q_indptr),
                      d_lens = device_buffer::from(std::vector<std::int32_t>(std::size_t(s.batch), kv_len));
  const std::size_t q_elems = std::size_t(q_indptr.back()) * qo_heads * head_dim;
  device_buffer q(q_elems * 2, 0), o(q_elems * 2, 0);
  fill_bf16(q.get(), q_elems, 4);

  pk::attention_params p;
  p.set_kv(pool.layout(), pool.data(), 0);
  p.q = q.get();
  p.o = o.get();
  p.q_indptr = d_q_indptr.as<std::int32_t>();
  p.q_dtype = pk::dtype::bf16;
  p.num_seqs = s.batch;
  p.num_qo_heads = qo_heads;
  p.table.indices = d_table.as<pagedkv::block_id>();
  p.table.kv_lens = d_lens.as<std::int32_t>();
  p.table.max_blocks_per_seq = blocks_per_seq;
  p.max_kv_len = kv_len;
  p.sm_scale = 1.0f / std::sqrt(float(head_dim));
  pk::cuda::prefill_plan plan;
  try {
    const pk::cuda::prefill_kernel body = s.variant == 1   ? pk::cuda::prefill_kernel::mma
                                          : s.variant == 4 || s.variant == 7 ? pk::cuda::prefill_kernel::wgmma
                                                           : pk::cuda::prefill_kernel::automatic;
    plan = pk::cuda::plan_prefill(p, q_indptr, body);
    if (s.variant == 2 || s.variant == 3) plan = pk::cuda::plan_prefill(p, q_indptr, pk::cuda::detail::current_device_sms(),
                                                     variant_tile(s.variant), 2);
    if (s.variant == 7) plan.tiles_across_heads = !plan.tiles_across_heads;
  } catch (const pagedkv::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  device_buffer workspace(plan.workspace_bytes, 0);
  const double seconds = seconds_per_launch(state, 8, [&](int, cudaStream_t stream) {
    switch (s.variant) {
      case 2: launch_variant<variant_2>(p, plan, workspace.get(), stream); break;
      case 3: launch_variant<variant_3>(p, plan, workspace.get(), stream); break;
      case 4:
        pk::cuda::detail::launch_prefill_wgmma_kernel<__nv_bfloat16>(p, plan, workspace.get(), stream, true, false);
        break;
      default: pk::cuda::prefill(p, plan, workspace.get(), workspace.bytes(), stream);
    }
  });
  if (seconds == 0) return;
  const double tflops = causal_flops(kv_len, q_len, qo_heads, head_dim) * s.batch / seconds / 1e12;
  state.counters["TFLOPs"] = tflops;
  state.counters["pct_gemm"] = g_gemm_tflops > 0 ? 100.0 * tflops / g_gemm_tflops : 0.0;
  state.counters["splits"] = plan.num_splits;
  state.counters["ctas"] = double(plan.live_ctas);
  state.counters["us"] = seconds * 1e6;
  state.counters["body"] = int(plan.kernel);  // prefill_kernel: 1 mma.sync, 2 wgmma
  if (s.variant != 0) {  // a variant's output against the shipped kernel's: largest |difference|
    std::vector<std::uint16_t> variant_o, shipped_o;
    o.to(variant_o);
    const pk::cuda::prefill_plan shipped = pk::cuda::plan_prefill(p, q_indptr);
    device_buffer shipped_workspace(shipped.workspace_bytes, 0);
    pk::cuda::prefill(p, shipped, shipped_workspace.get(), shipped_workspace.bytes());
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    o.to(shipped_o);
    const auto as_float = [](std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); };
    double max_diff = 0.0;
    for (std::size_t i = 0; i < shipped_o.size(); ++i)
      max_diff = std::max(max_diff, double(std::fabs(as_float(variant_o[i]) - as_float(shipped_o[i]))));
    state.counters["max_diff_vs_shipped"] = max_diff;
  }
}

void add(std::vector<std::int64_t> args) {
  benchmark::RegisterBenchmark("prefill", bm_prefill)
      ->Args(args)
      ->ArgNames({"shape", "batch", "hkv", "bs", "identity", "variant"})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(0.2);
}

void register_all() {
  benchmark::RegisterBenchmark("gemm_ceiling", bm_gemm_ceiling)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  for (int hkv : {32, 8}) {
    add({int(shape_id::prompt_4k), 1, hkv, 16, 0, 0});
    add({int(shape_id::prompt_16k), 1, hkv, 16, 0, 0});
    add({int(shape_id::prompts_16x1k), 16, hkv, 16, 0, 0});
    add({int(shape_id::chunk_512_over_8k), 1, hkv, 16, 0, 0});
    add({int(shape_id::chunk_512_over_8k), 8, hkv, 16, 0, 0});
    for (int bs : {1, 64, 256}) add({int(shape_id::prompt_4k), 1, hkv, bs, 0, 0});
    add({int(shape_id::prompt_4k), 1, hkv, 16, 1, 0});  // paged against an identity table
  }
  for (int hkv : {32, 8}) {  // the mma.sync body on every shape of the shipped rows
    add({int(shape_id::prompt_4k), 1, hkv, 16, 0, 1});
    add({int(shape_id::prompt_16k), 1, hkv, 16, 0, 1});
    add({int(shape_id::prompts_16x1k), 16, hkv, 16, 0, 1});
    add({int(shape_id::chunk_512_over_8k), 1, hkv, 16, 0, 1});
    add({int(shape_id::chunk_512_over_8k), 8, hkv, 16, 0, 1});
    for (int bs : {1, 64, 256}) add({int(shape_id::prompt_4k), 1, hkv, bs, 0, 1});
    add({int(shape_id::prompt_4k), 1, hkv, 16, 1, 1});
  }
  for (int variant : {4, 7})  // 2 and 3: measured in the runs of 2026-11-25 (journal)
    for (int hkv : {32, 8}) {
      add({int(shape_id::prompt_4k), 1, hkv, 16, 0, variant});
      add({int(shape_id::prompt_16k), 1, hkv, 16, 0, variant});
      add({int(shape_id::prompts_16x1k), 16, hkv, 16, 0, variant});
      if (variant == 7) add({int(shape_id::chunk_512_over_8k), 1, hkv, 16, 0, variant});
      add({int(shape_id::chunk_512_over_8k), 8, hkv, 16, 0, variant});
      for (int bs : {64, 256}) add({int(shape_id::prompt_4k), 1, hkv, bs, 0, variant});
    }
}

}  // namespace

int main(int argc, char** argv) { return run_gpu_benchmarks("bench_prefill", argc, argv, register_all); }
