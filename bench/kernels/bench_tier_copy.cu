// The host tier's copies on the GPU (issue 23, measurement 2): offload (device -> pinned host) and
// load (pinned host -> device) of 256 blocks of the LLaMA-2-7B shape (32 layers, 32 KV heads,
// head_dim 128, block 16, bf16, K and V: 8 MiB a block, 2 GiB a batch), as the engine runs a plan's
// offload and load lists: pagedkv::merge_copies' runs through kernels::cuda::swap_blocks (one
// cudaMemcpyAsync per contiguous range: per (layer, K/V) and run in the layer-major pool the engine
// uses, per run in a block-major pool), or the same ranges in one cudaMemcpyBatchAsync. Against a
// ceiling measured first in the same run: one cudaMemcpyAsync of the same 2 GiB between the same
// two buffers, in the same direction.
//
//   copy_ceiling/dir:D          one 2 GiB cudaMemcpyAsync, D = 0 offload (D2H), 1 load (H2D)
//   tier_copy/dir:D/order:O/ids:I/batch:B
//                               O = 0 layer-major pool (the engine's), 1 block-major;
//                               I = 0 shuffled block ids (a sample of 256 of 512 device and 512
//                               host blocks, as a busy cache hands them out), 1 consecutive ids;
//                               B = 0 swap_blocks, 1 cudaMemcpyBatchAsync of the same ranges
//   staged_copy/dir:D/ids:I/stage_mib:M/buffers:N
//                               kernels::cuda::staged_swap (the engine's swap path): the layer-major
//                               device pool to a block-major host pool and back, through N device
//                               staging buffers of M MiB (M / 8 blocks a chunk)
//
// Counters: GBps (bytes / time), pct_ceiling (of the same direction's ceiling), ranges (copies
// issued), runs (merged runs of the block list), chunks (staging buffers filled, staged rows). Every chunk (layer, K/V, block) of the source pool
// is stamped with its coordinates first, and a row whose destination chunks do not hold their
// sources' stamps afterwards fails (SkipWithError) instead of reporting a rate. CUDA-event manual timing of each batch from its
// first enqueue to its completion; --benchmark_out=<file> --benchmark_out_format=json for JSON.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <pagedkv/cuda/cache_ops.cuh>
#include <pagedkv/cuda/memory.cuh>
#include <pagedkv/cuda/staged_swap.cuh>
#include <pagedkv/host_tier.hpp>

#include "gpu_bench.cuh"

namespace pk = pagedkv::kernels;

namespace {

constexpr std::int32_t num_layers = 32, num_kv_heads = 32, head_dim = 128, block_size = 16;
constexpr std::int32_t pool_blocks = 512;  // on each side; 4 GiB each
constexpr std::int32_t batch_blocks = 256;

pk::kv_cache_layout layout(pk::layer_order order) {
  return pk::make_kv_cache_layout({.num_layers = num_layers, .num_blocks = pool_blocks, .block_size = block_size,
                                   .num_kv_heads = num_kv_heads, .head_dim = head_dim},
                                  pk::kv_layout::nhd, pk::dtype::bf16, order);
}

/// The two pools, allocated once: the order changes how block ids map to bytes, not the bytes.
struct pools {
  pk::cuda::owned_bytes<pk::cuda::device_memory> device;
  pk::cuda::owned_bytes<pk::cuda::pinned_host_memory> host;
  std::size_t bytes = 0;
  /// A blocking stream: cudaMemcpyBatchAsync refuses the legacy default stream, and the timing
  /// events on the legacy stream wait for a blocking stream's work.
  cudaStream_t stream = nullptr;
  double ceiling_gbps[2] = {0, 0};
  pools() {
    bytes = layout(pk::layer_order::layer_major).size_bytes();
    device = pk::cuda::allocate<pk::cuda::device_memory>(bytes);
    host = pk::cuda::allocate<pk::cuda::pinned_host_memory>(bytes);
    PAGEDKV_CUDA_CHECK(cudaMemset(device.get(), 0x5a, bytes));
    pk::cuda::pinned_host_memory::fill(host.get(), 0xa5, bytes);
    PAGEDKV_CUDA_CHECK(cudaStreamCreate(&stream));
  }
};

pools& the_pools() {
  static pools p;
  return p;
}

std::size_t batch_bytes() { return std::size_t(batch_blocks) * layout(pk::layer_order::layer_major).bytes_per_block(); }

/// What chunk (layer, kv, block) of a source pool holds in every 32-bit word: the check after a
/// batch that each destination chunk is its source's.
PAGEDKV_HOST_DEVICE std::uint32_t stamp(std::int32_t layer, std::int32_t kv, std::int32_t block) {
  return 0x80000000u | (std::uint32_t(block) << 8) | (std::uint32_t(layer) << 1) | std::uint32_t(kv);
}

/// Stamps every (layer, kv, block) chunk of a device pool laid out as `l`: one CTA a chunk.
__global__ void stamp_kernel(std::uint32_t* pool, pk::kv_cache_layout l) {
  const auto chunk = std::int32_t(blockIdx.x);
  const std::int32_t block = chunk / (2 * l.shape.num_layers), layer = chunk / 2 % l.shape.num_layers, kv = chunk % 2;
  std::uint32_t* p = pool + l.offset(layer, kv, block, 0, 0) * 2 / 4;  // bf16 elements to words
  const std::int64_t words = l.block_elems() * 2 / 4;
  for (std::int64_t i = threadIdx.x; i < words; i += blockDim.x) p[i] = stamp(layer, kv, block);
}

/// Stamps the source pool and poisons the destination pool, so that a copy that does not happen
/// fails the check.
void stamp_source(pools& p, const pk::kv_cache_layout& device_layout, const pk::kv_cache_layout& host_layout,
                  bool load) {
  const pk::kv_cache_layout& l = load ? host_layout : device_layout;
  if (load) {
    PAGEDKV_CUDA_CHECK(cudaMemset(p.device.get(), 0x5a, p.bytes));
  } else {
    pk::cuda::pinned_host_memory::fill(p.host.get(), 0xa5, p.bytes);
  }
  if (!load) {
    stamp_kernel<<<unsigned(2 * num_layers * pool_blocks), 256>>>(static_cast<std::uint32_t*>(p.device.get()), l);
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  auto* host = static_cast<std::uint32_t*>(p.host.get());
  const std::int64_t words = l.block_elems() * 2 / 4;
  for (std::int32_t b = 0; b < pool_blocks; ++b)
    for (std::int32_t layer = 0; layer < num_layers; ++layer)
      for (std::int32_t kv = 0; kv < 2; ++kv)
        std::fill_n(host + l.offset(layer, kv, b, 0, 0) * 2 / 4, words, stamp(layer, kv, b));
}

/// The first and last word of every destination chunk of the batch, against its source's stamp.
/// Returns an empty string when all hold.
std::string check_batch(pools& p, const pk::kv_cache_layout& device_layout, const pk::kv_cache_layout& host_layout,
                        bool load, const std::vector<pagedkv::block_copy>& copies) {
  const pk::kv_cache_layout& l = load ? device_layout : host_layout;  // the destination's
  const std::int64_t words = l.block_elems() * 2 / 4;
  for (const pagedkv::block_copy& c : copies)
    for (std::int32_t layer = 0; layer < num_layers; ++layer)
      for (std::int32_t kv = 0; kv < 2; ++kv)
        for (const std::int64_t word : {std::int64_t(0), words - 1}) {
          const std::size_t at = std::size_t(l.offset(layer, kv, c.dst, 0, 0) * 2 / 4 + word);
          std::uint32_t got = 0;
          if (load) {
            PAGEDKV_CUDA_CHECK(cudaMemcpy(&got, static_cast<std::uint32_t*>(p.device.get()) + at, 4,
                                          cudaMemcpyDeviceToHost));
          } else {
            got = static_cast<const std::uint32_t*>(p.host.get())[at];
          }
          if (got != stamp(layer, kv, c.src))
            return "block " + std::to_string(c.src) + " -> " + std::to_string(c.dst) + ", layer " +
                   std::to_string(layer) + ", kv " + std::to_string(kv) + ": wrong bytes";
        }
  return {};
}

/// The block list of one batch, as a plan carries it: (src, dst) pairs, device -> host for an
/// offload, host -> device for a load.
std::vector<pagedkv::block_copy> batch(bool shuffled, bool load) {
  std::vector<pagedkv::block_id> device(pool_blocks), host(pool_blocks);
  std::iota(device.begin(), device.end(), 0);
  std::iota(host.begin(), host.end(), 0);
  if (shuffled) {
    std::mt19937_64 rng(23);
    std::shuffle(device.begin(), device.end(), rng);
    std::shuffle(host.begin(), host.end(), rng);
  }
  std::vector<pagedkv::block_copy> copies;
  for (std::int32_t i = 0; i < batch_blocks; ++i) {
    const auto d = device[std::size_t(i)], h = host[std::size_t(i)];
    copies.push_back(load ? pagedkv::block_copy{h, d} : pagedkv::block_copy{d, h});
  }
  return copies;
}

/// One 2 GiB copy between the same buffers, the same direction.
void bm_copy_ceiling(benchmark::State& state) {
  pools& p = the_pools();
  const bool load = state.range(0) == 1;
  void* dst = load ? p.device.get() : p.host.get();
  const void* src = load ? p.host.get() : p.device.get();
  const auto copy = [&](int) { PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dst, src, batch_bytes(), cudaMemcpyDefault, p.stream)); };
  copy(0);  // untimed: first touch of the pages
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> sec = seconds_of_each(state, 1, copy);
  const double gbps = double(batch_bytes()) / sec[0] * 1e-9;
  p.ceiling_gbps[load] = gbps;
  state.counters["GBps"] = gbps;
  state.counters["pct_ceiling"] = 100.0;
  state.counters["ranges"] = 1;
}

void bm_tier_copy(benchmark::State& state) {
  pools& p = the_pools();
  const bool load = state.range(0) == 1;
  const auto order = state.range(1) == 1 ? pk::layer_order::block_major : pk::layer_order::layer_major;
  const bool shuffled = state.range(2) == 0;
  const bool batched = state.range(3) == 1;
  const pk::kv_cache_layout l = layout(order);
  const std::vector<pagedkv::block_copy> copies = batch(shuffled, load);
  // What the engine does with plan.offload / plan.load: the merged runs, as (src, dst) pairs.
  const std::vector<pagedkv::copy_run> runs = pagedkv::merge_copies(copies);
  std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> pairs;
  for (const pagedkv::copy_run& r : runs)
    for (std::int32_t b = 0; b < r.num_blocks; ++b) pairs.emplace_back(r.src + b, r.dst + b);
  void* dst = load ? p.device.get() : p.host.get();
  const void* src = load ? p.host.get() : p.device.get();
  const std::vector<pk::copy_range> ranges = pk::plan_swap(l, l, pairs);
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes;
  for (const pk::copy_range& r : ranges) {
    dsts.push_back(static_cast<unsigned char*>(dst) + r.dst_offset_bytes);
    srcs.push_back(static_cast<const unsigned char*>(src) + r.src_offset_bytes);
    sizes.push_back(r.bytes);
  }
  std::size_t moved = 0;
  for (std::size_t b : sizes) moved += b;
  if (moved != batch_bytes()) {
    state.SkipWithError("the ranges do not cover the batch");
    return;
  }
  stamp_source(p, l, l, load);
  const auto copy = [&](int) {
    if (!batched) {
      pk::cuda::swap_blocks(l, src, l, dst, pairs, p.stream);
      return;
    }
#if CUDART_VERSION >= 13000
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t attr_index = 0;
    PAGEDKV_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), sizes.size(), &attr, &attr_index,
                                            1, p.stream));
#else
    for (std::size_t i = 0; i < sizes.size(); ++i)
      PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, p.stream));
#endif
  };
  copy(0);  // untimed
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> sec = seconds_of_each(state, 1, copy);
  if (const std::string wrong = check_batch(p, l, l, load, copies); !wrong.empty()) {
    state.SkipWithError(wrong.c_str());
    return;
  }
  const double gbps = double(moved) / sec[0] * 1e-9;
  state.counters["GBps"] = gbps;
  state.counters["pct_ceiling"] = p.ceiling_gbps[load] > 0 ? 100.0 * gbps / p.ceiling_gbps[load] : 0.0;
  state.counters["ranges"] = double(ranges.size());
  state.counters["runs"] = double(runs.size());
}

/// The engine's swap path: staged_swap between the layer-major device pool and a block-major
/// host pool over the same two allocations.
void bm_staged_copy(benchmark::State& state) {
  pools& p = the_pools();
  const bool load = state.range(0) == 1;
  const bool shuffled = state.range(1) == 0;
  const std::size_t buffer_bytes = std::size_t(state.range(2)) << 20;
  const int num_buffers = int(state.range(3));
  const pk::kv_cache_layout device_layout = layout(pk::layer_order::layer_major);
  const pk::kv_cache_layout host_layout = layout(pk::layer_order::block_major);
  const std::vector<pagedkv::block_copy> copies = batch(shuffled, load);
  std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> pairs;
  for (const pagedkv::block_copy& c : copies) pairs.emplace_back(c.src, c.dst);
  pk::cuda::staged_swap swap(buffer_bytes, num_buffers);
  stamp_source(p, device_layout, host_layout, load);
  std::size_t ranges = 0;
  const auto copy = [&](int) {
    ranges = load ? swap.to_device(host_layout, p.host.get(), device_layout, p.device.get(), pairs, p.stream)
                  : swap.to_host(device_layout, p.device.get(), host_layout, p.host.get(), pairs, p.stream);
  };
  copy(0);  // untimed
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> sec = seconds_of_each(state, 1, copy);
  if (const std::string wrong = check_batch(p, device_layout, host_layout, load, copies); !wrong.empty()) {
    state.SkipWithError(wrong.c_str());
    return;
  }
  const double gbps = double(batch_bytes()) / sec[0] * 1e-9;
  state.counters["GBps"] = gbps;
  state.counters["pct_ceiling"] = p.ceiling_gbps[load] > 0 ? 100.0 * gbps / p.ceiling_gbps[load] : 0.0;
  state.counters["ranges"] = double(ranges);
  const std::int32_t per_chunk = swap.blocks_per_chunk(device_layout);
  state.counters["chunks"] = double((batch_blocks + per_chunk - 1) / per_chunk);
}

void register_all() {
  // The ceilings first: every tier_copy row is a ratio to its direction's.
  benchmark::RegisterBenchmark("copy_ceiling", bm_copy_ceiling)
      ->ArgsProduct({{0, 1}})->ArgNames({"dir"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
  benchmark::RegisterBenchmark("tier_copy", bm_tier_copy)
      ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {0, 1}})->ArgNames({"dir", "order", "ids", "batch"})->UseManualTime()
      ->Unit(benchmark::kMillisecond)->Iterations(10);
  benchmark::RegisterBenchmark("staged_copy", bm_staged_copy)
      ->ArgsProduct({{0, 1}, {0, 1}, {16, 64}, {2, 3}})->ArgNames({"dir", "ids", "stage_mib", "buffers"})
      ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
}

}  // namespace

int main(int argc, char** argv) { return run_gpu_benchmarks("bench_tier_copy", argc, argv, register_all); }
