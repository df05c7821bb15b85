// staged_swap: moves blocks between a device pool (either layer order) and a block_major pinned
// host pool through device staging buffers, so that every PCIe copy is whole blocks (8 MiB a
// block for LLaMA-2-7B) rather than a block's 2 * num_layers pieces.
//
// Offload (to_host), per chunk of blocks (plan_staged_swap): pack_blocks gathers the chunk into a
// staging buffer on the caller's stream, then one cudaMemcpyAsync per run of consecutive host
// blocks takes it to the host on the swap's own copy stream. Load (to_device) runs the other way:
// copies into a staging buffer on the copy stream, unpack_blocks on the caller's stream. With
// several buffers, chunk i's gather (or scatter) overlaps chunk i-1's copy: a gather reads and
// writes its bytes at HBM speed, some 50 times the PCIe rate, so the copies are nearly the whole
// time and run back to back.
//
// Ordering: the copies start after everything enqueued on the caller's stream before the call,
// and the caller's stream waits for the last of them, so the swap behaves as one stream-ordered
// operation. Every event a call waits on is recorded in the same call, so a call can be captured
// into a CUDA graph (the copy stream joins the capture through the first event).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <pagedkv/error.hpp>

#include "../cache_ops_params.hpp"
#include "cache_ops.cuh"
#include "check.cuh"
#include "memory.cuh"

namespace pagedkv::kernels::cuda {

class staged_swap {
 public:
  /// Staging of 3 x 64 MiB: 8 LLaMA-2-7B blocks a chunk, 3 so that a gather never waits for the
  /// copy before last (bench_tier_copy's staged rows: docs/benchmarks.md, "Host tier copies").
  static constexpr std::size_t default_buffer_bytes = std::size_t(64) << 20;
  static constexpr int default_num_buffers = 3;
  static constexpr int max_num_buffers = 8;

  /// Allocates num_buffers device staging buffers of buffer_bytes each, a copy stream and events.
  /// Errors: invalid_argument for num_buffers outside [1, max_num_buffers] or buffer_bytes below
  /// 16; cuda_error naming the call when an allocation fails.
  explicit staged_swap(std::size_t buffer_bytes = default_buffer_bytes, int num_buffers = default_num_buffers)
      : buffer_bytes_(buffer_bytes), num_buffers_(num_buffers) {
    if (num_buffers < 1 || num_buffers > max_num_buffers)
      pagedkv::detail::fail(errc::invalid_argument, "staged_swap: num_buffers ", num_buffers, " outside [1, ",
                            max_num_buffers, "]");
    if (buffer_bytes < 16)
      pagedkv::detail::fail(errc::invalid_argument, "staged_swap: buffer_bytes ", buffer_bytes, " below 16");
    for (int b = 0; b < num_buffers; ++b) buffers_[std::size_t(b)] = allocate<device_memory>(buffer_bytes);
    try {
      PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
      PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&entry_, cudaEventDisableTiming));
      PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      for (int b = 0; b < num_buffers; ++b) {
        PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[std::size_t(b)], cudaEventDisableTiming));
        PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&free_[std::size_t(b)], cudaEventDisableTiming));
      }
    } catch (...) {
      release();
      throw;
    }
  }
  staged_swap(const staged_swap&) = delete;
  staged_swap& operator=(const staged_swap&) = delete;
  ~staged_swap() { release(); }

  [[nodiscard]] std::size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  [[nodiscard]] int num_buffers() const noexcept { return num_buffers_; }
  /// Blocks of `layout` one staging buffer holds, at most max_stage_blocks; 0 if not even one.
  [[nodiscard]] std::int32_t blocks_per_chunk(const kv_cache_layout& layout) const {
    return std::int32_t(std::min<std::size_t>(buffer_bytes_ / layout.bytes_per_block(), max_stage_blocks));
  }

  /// Copies device blocks pairs[i].first of `pool` to host blocks pairs[i].second of `host` (a
  /// block_major pinned pool of the same geometry). Enqueued; the caller's stream waits for the
  /// copies. Returns the number of cudaMemcpyAsync calls. Throws what plan_staged_swap throws,
  /// and errc::invalid_argument when one block is larger than a staging buffer.
  std::size_t to_host(const kv_cache_layout& pool_layout, const void* pool, const kv_cache_layout& host_layout,
                      void* host, std::span<const std::pair<block_id, block_id>> pairs, cudaStream_t stream) {
    const std::vector<staged_chunk> chunks = plan_staged_swap(pool_layout, host_layout, pairs, chunk_blocks(pool_layout));
    if (chunks.empty()) return 0;
    std::size_t copies = 0;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const std::size_t b = i % std::size_t(num_buffers_);
      // The buffer's last copy out must be done before the gather overwrites it; within the first
      // num_buffers chunks the previous call's copies are, since the stream waited for them.
      if (i >= std::size_t(num_buffers_)) PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(stream, free_[b], 0));
      pack_blocks(params(pool_layout, const_cast<void*>(pool), b, chunks[i]), stream);
      PAGEDKV_CUDA_CHECK(cudaEventRecord(ready_[b], stream));
      PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, ready_[b], 0));
      for (const staging_range& r : chunks[i].ranges) {
        PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(host) + r.host_offset_bytes,
                                           static_cast<const unsigned char*>(buffers_[b].get()) + r.staging_offset_bytes,
                                           r.bytes, cudaMemcpyDeviceToHost, copy_stream_));
        ++copies;
      }
      PAGEDKV_CUDA_CHECK(cudaEventRecord(free_[b], copy_stream_));
    }
    PAGEDKV_CUDA_CHECK(cudaEventRecord(done_, copy_stream_));
    PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
    return copies;
  }

  /// Copies host blocks pairs[i].first of `host` (block_major, pinned) to device blocks
  /// pairs[i].second of `pool`. Enqueued after the caller's stream's work so far; the caller's
  /// stream holds the scatters. Returns the number of cudaMemcpyAsync calls; errors as to_host.
  std::size_t to_device(const kv_cache_layout& host_layout, const void* host, const kv_cache_layout& pool_layout,
                        void* pool, std::span<const std::pair<block_id, block_id>> pairs, cudaStream_t stream) {
    std::vector<std::pair<block_id, block_id>> pool_host;
    pool_host.reserve(pairs.size());
    for (const auto& [h, p] : pairs) pool_host.emplace_back(p, h);
    const std::vector<staged_chunk> chunks = plan_staged_swap(pool_layout, host_layout, pool_host, chunk_blocks(pool_layout));
    if (chunks.empty()) return 0;
    PAGEDKV_CUDA_CHECK(cudaEventRecord(entry_, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, entry_, 0));
    std::size_t copies = 0;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const std::size_t b = i % std::size_t(num_buffers_);
      if (i >= std::size_t(num_buffers_)) PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, free_[b], 0));
      for (const staging_range& r : chunks[i].ranges) {
        PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(buffers_[b].get()) + r.staging_offset_bytes,
                                           static_cast<const unsigned char*>(host) + r.host_offset_bytes, r.bytes,
                                           cudaMemcpyHostToDevice, copy_stream_));
        ++copies;
      }
      PAGEDKV_CUDA_CHECK(cudaEventRecord(ready_[b], copy_stream_));
      PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_[b], 0));
      unpack_blocks(params(pool_layout, pool, b, chunks[i]), stream);
      PAGEDKV_CUDA_CHECK(cudaEventRecord(free_[b], stream));
    }
    return copies;
  }

 private:
  std::int32_t chunk_blocks(const kv_cache_layout& layout) const {
    const std::int32_t n = blocks_per_chunk(layout);
    if (n < 1)
      pagedkv::detail::fail(errc::invalid_argument, "staged_swap: a block of ", layout.bytes_per_block(),
                            " bytes is larger than a staging buffer of ", buffer_bytes_);
    return n;
  }
  stage_blocks_params params(const kv_cache_layout& layout, void* pool, std::size_t buffer,
                             const staged_chunk& chunk) const {
    stage_blocks_params p;
    p.pool = pool;
    p.staging = buffers_[buffer].get();
    p.layout = layout;
    p.num_blocks = std::int32_t(chunk.pool_blocks.size());
    std::copy(chunk.pool_blocks.begin(), chunk.pool_blocks.end(), p.blocks);
    return p;
  }
  void release() noexcept {
    for (cudaEvent_t& e : ready_)
      if (e) cudaEventDestroy(std::exchange(e, nullptr));
    for (cudaEvent_t& e : free_)
      if (e) cudaEventDestroy(std::exchange(e, nullptr));
    if (entry_) cudaEventDestroy(std::exchange(entry_, nullptr));
    if (done_) cudaEventDestroy(std::exchange(done_, nullptr));
    if (copy_stream_) cudaStreamDestroy(std::exchange(copy_stream_, nullptr));
  }

  std::size_t buffer_bytes_;
  int num_buffers_;
  std::array<owned_bytes<device_memory>, max_num_buffers> buffers_{};
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t entry_ = nullptr, done_ = nullptr;
  std::array<cudaEvent_t, max_num_buffers> ready_{}, free_{};
};

}  // namespace pagedkv::kernels::cuda
