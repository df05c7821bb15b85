// The cache operations on the GPU: time per launch, and bytes moved (read + written) / time as
// GB/s and as a percentage of a copy ceiling that this binary measures first, in the same run
// (the faster of a 16-byte load/store copy kernel and cudaMemcpyAsync, 1 GiB each way).
//
//   copy_blocks  copy-on-write pairs of random distinct blocks, every layer, K and V; Llama-3-8B
//                (32 layers, 8 KV heads) and Llama-2-7B (32 layers, 32 KV heads) pools, bf16,
//                head_dim 128, block 16; 1 to 1024 pairs a launch
//   write_kv     one layer's new K and V rows into random distinct slots, 1 to 4096 tokens (a
//                decode step to a prefill chunk); bf16 pools, and fp8 pools from bf16 rows
//   merge_states bf16 attention states of head_dim 128 merged by their LSEs (cascade attention
//                over a shared prefix): 32 to 262144 rows (query token x head), 2 and 8 states
//   launch       an empty kernel launched the same way (a dependent launch that waits for the
//                grid before it): the floor of every small launch above
//
// Each row is a CUDA graph of at least 8 launches that rotates over disjoint sets of blocks,
// slots and source rows, at least 512 MB of them where the shape allows, so that small launches
// are not served from the 50 MB L2. CUDA-event manual timing; --benchmark_out=<file>
// --benchmark_out_format=json for JSON.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <pagedkv/cuda/cache_ops.cuh>
#include <pagedkv/cuda/device_buffer.cuh>
#include <pagedkv/cuda/kv_pool.cuh>
#include <pagedkv/cuda/merge.cuh>

#include "gpu_bench.cuh"

namespace pk = pagedkv::kernels;
using pk::cuda::device_buffer;

namespace {

double g_ceiling_gbps = 0.0;

/// 16-byte loads and stores, a persistent grid-stride loop, four of each in flight a thread.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

/// What every launch of the library costs before it moves a byte.
__global__ void empty_kernel(int) {
  pk::cuda::detail::wait_for_the_grid_before();
  pk::cuda::detail::let_dependents_launch();
}

/// The copy ceiling: 1 GiB copied by copy_kernel (8 CTAs of 256 threads an SM) and by
/// cudaMemcpyAsync, each every iteration; the faster one's bytes read + written per second.
void bm_copy_ceiling(benchmark::State& state) {
  const std::size_t bytes = std::size_t(1) << 30;
  const device_buffer src(bytes, 0x5a), dst(bytes, 0);
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::vector<double> seconds = seconds_of_each(state, 2, [&](int which) {
    if (which == 0) copy_kernel<<<sms * 8, 256>>>(src.as<uint4>(), dst.as<uint4>(), bytes / 16);
    else PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice));
  });
  const auto gbps = [&](int which) { return 2.0 * double(bytes) / seconds[std::size_t(which)] / 1e9; };
  g_ceiling_gbps = std::max(gbps(0), gbps(1));
  state.counters["GBps"] = g_ceiling_gbps;
  state.counters["kernel_GBps"] = gbps(0);
  state.counters["memcpy_GBps"] = gbps(1);
  state.counters["pct_ceiling"] = 100.0;
}

/// Times a CUDA graph of `reps` calls of launch(k) (the caller rotates its sets by k) and
/// reports time per launch and `bytes` moved per launch against the ceiling.
void time_graph(benchmark::State& state, int reps, double bytes, const std::function<void(int, cudaStream_t)>& launch) {
  const double seconds = seconds_per_launch(state, reps, launch);
  const double gbps = seconds > 0 ? bytes / seconds / 1e9 : 0.0;
  state.counters["us"] = seconds * 1e6;
  state.counters["MB"] = bytes / 1e6;
  state.counters["GBps"] = gbps;
  state.counters["pct_ceiling"] = g_ceiling_gbps > 0 ? 100.0 * gbps / g_ceiling_gbps : 0.0;
}

/// copy_blocks of `pairs` pairs over a pool of 32 layers, `heads` KV heads, bf16.
void bm_copy_blocks(benchmark::State& state) {
  const int pairs = int(state.range(0)), heads = int(state.range(1));
  const pk::kv_cache_shape shape{32, 1, 16, heads, 128};
  const double block_bytes = double(pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::bf16).bytes_per_block());
  const rotation r(pairs * block_bytes * 2);
  auto sized = shape;
  sized.num_blocks = 2 * pairs * r.sets;
  const auto layout = pk::make_kv_cache_layout(sized, pk::kv_layout::nhd, pk::dtype::bf16);
  pk::cuda::device_kv_pool pool(layout);
  pool.fill(0x3c);
  std::vector<pagedkv::block_id> ids(std::size_t(sized.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(42));
  const device_buffer pair_ids = device_buffer::from(ids);  // set k: pairs (ids[2 pairs k + 2 i], ids[.. + 1])
  time_graph(state, r.reps, 2 * pairs * block_bytes, [&](int k, cudaStream_t stream) {
    const auto* set = pair_ids.as<pagedkv::block_id>() + std::size_t(k % r.sets) * 2 * pairs;
    pk::cuda::copy_blocks({set, pool.data(), layout, pairs}, stream);
  });
}

/// write_kv of `tokens` tokens of one layer, `heads` KV heads of head_dim 128, bf16 rows into a
/// bf16 pool, or an fp8 one.
void bm_write_kv(benchmark::State& state) {
  const int tokens = int(state.range(0)), heads = int(state.range(1));
  const bool fp8 = state.range(2) != 0;
  const pk::dtype pool_t = fp8 ? pk::dtype::fp8_e4m3 : pk::dtype::bf16;
  const double row_bytes = double(heads) * 128 * 2;  // bf16, K or V
  const double bytes = double(tokens) * 2 * (row_bytes + row_bytes * double(pk::size_of(pool_t)) / 2);
  const rotation r(bytes);
  const int slots_needed = tokens * r.sets;
  const auto layout = pk::make_kv_cache_layout({1, (slots_needed + 15) / 16, 16, heads, 128}, pk::kv_layout::nhd, pool_t);
  pk::cuda::device_kv_pool pool(layout);
  pool.fill(0x3c);
  std::vector<pagedkv::slot_id> slots(std::size_t(layout.shape.num_blocks) * 16);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(42));
  const device_buffer slot_ids = device_buffer::from(slots);  // set k: slots [tokens k, tokens (k + 1))
  const std::size_t set_elems = std::size_t(tokens) * heads * 128;
  const device_buffer k_rows(set_elems * 2 * std::size_t(r.sets), 0x3c), v_rows(set_elems * 2 * std::size_t(r.sets), 0x3c);
  time_graph(state, r.reps, bytes, [&](int k, cudaStream_t stream) {
    const std::size_t set = std::size_t(k % r.sets);
    pk::write_kv_params p;
    p.k_new = k_rows.as<__nv_bfloat16>() + set * set_elems;
    p.v_new = v_rows.as<__nv_bfloat16>() + set * set_elems;
    p.slot_mapping = slot_ids.as<pagedkv::slot_id>() + set * std::size_t(tokens);
    p.pool = pool.data();
    p.layout = layout;
    p.num_tokens = tokens;
    p.src_dtype = pk::dtype::bf16;
    pk::cuda::write_kv(p, stream);
  });
}

/// merge_states of `states` bf16 states of `rows` rows of head_dim 128 (a row: a query token's
/// query head; a decode batch of 64 with 32 heads is 2048 rows), with the merged LSE.
void bm_merge_states(benchmark::State& state) {
  const std::int64_t rows = state.range(0);
  const int states = int(state.range(1));
  constexpr int d = 128;
  const double o_bytes = double(rows) * d * 2;
  const double bytes = (states + 1) * o_bytes + (states + 1) * double(rows) * 4;  // read + written
  const rotation r(bytes);
  const std::size_t in_elems = std::size_t(states) * std::size_t(rows) * d;
  const device_buffer o_in(in_elems * 2 * std::size_t(r.sets), 0x3c), o(std::size_t(rows) * d * 2 * std::size_t(r.sets), 0);
  const device_buffer lse_in(std::size_t(states) * std::size_t(rows) * 4 * std::size_t(r.sets), 0x3c);
  const device_buffer lse(std::size_t(rows) * 4 * std::size_t(r.sets), 0);
  time_graph(state, r.reps, bytes, [&](int k, cudaStream_t stream) {
    const std::size_t set = std::size_t(k % r.sets);
    pk::merge_states_params p;
    p.o_in = o_in.as<__nv_bfloat16>() + set * in_elems;
    p.lse_in = lse_in.as<float>() + set * std::size_t(states) * std::size_t(rows);
    p.o = o.as<__nv_bfloat16>() + set * std::size_t(rows) * d;
    p.lse = lse.as<float>() + set * std::size_t(rows);
    p.num_rows = rows;
    p.num_states = states;
    p.head_dim = d;
    p.o_dtype = pk::dtype::bf16;
    pk::cuda::merge_states(p, stream);
  });
}

/// An empty dependent launch of `ctas` CTAs of 128 threads, in the same kind of graph.
void bm_launch(benchmark::State& state) {
  const int ctas = int(state.range(0));
  time_graph(state, 8, 0.0, [&](int, cudaStream_t stream) {
    pk::cuda::detail::launch_dependent(empty_kernel, dim3(unsigned(ctas)), 128, 0, stream, 0);
  });
}

void register_all() {
  benchmark::RegisterBenchmark("copy_ceiling", bm_copy_ceiling)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  const auto add = [](const char* name, void (*fn)(benchmark::State&), std::vector<std::vector<std::int64_t>> args,
                      std::vector<std::string> names) {
    benchmark::RegisterBenchmark(name, fn)->ArgsProduct(std::move(args))->ArgNames(std::move(names))->UseManualTime()
        ->Unit(benchmark::kMicrosecond)->MinTime(0.1);
  };
  add("launch", bm_launch, {{1, 132, 4096}}, {"ctas"});
  add("copy_blocks", bm_copy_blocks, {{1, 4, 16, 64, 256, 1024}, {8, 32}}, {"pairs", "hkv"});
  add("write_kv", bm_write_kv, {{1, 16, 64, 256, 1024, 4096}, {8, 32}, {0, 1}}, {"tokens", "hkv", "fp8"});
  add("merge_states", bm_merge_states, {{32, 2048, 8192, 65536, 262144}, {2, 8}}, {"rows", "states"});
}

}  // namespace

int main(int argc, char** argv) { return run_gpu_benchmarks("bench_cache_ops", argc, argv, register_all); }
