// row_sampler (cuda_sampling.hpp): packs a step's sampling into one pinned buffer, copies it up,
// runs sample_kernel a CTA a row, and copies back only the chosen tokens and candidates.
#include "cuda/cuda_sampling.hpp"

#include <algorithm>
#include <cstring>

#include <cuda_runtime.h>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/cuda/memory.cuh>
#include <pagedkv/error.hpp>

#include "cuda/sampling_kernels.cuh"

namespace pagedkv::llama {

namespace cuda {

using kernels::cuda::device_memory;
using kernels::cuda::owned_bytes;
using kernels::cuda::pinned_host_memory;

/// One pinned and one device buffer of the same layout: [specs | uniforms] up, [draws | candidates] down.
struct row_sampler::buffers {
  owned_bytes<pinned_host_memory> host;
  owned_bytes<device_memory> device;
  std::size_t capacity = 0;
  std::size_t num_draws = 0, num_candidates = 0, down_offset = 0;

  bool reserve(std::size_t bytes) {
    if (bytes <= capacity) return false;
    host.reset();
    device.reset();
    capacity = 0;  // until both allocations succeed: a throw leaves no capacity the pointers lack
    host = kernels::cuda::allocate<pinned_host_memory>(bytes);
    device = kernels::cuda::allocate<device_memory>(bytes);
    capacity = bytes;
    return true;
  }
};

row_sampler::row_sampler() : buffers_(std::make_unique<buffers>()) {}
row_sampler::~row_sampler() = default;

namespace {
constexpr std::size_t align16(std::size_t n) { return (n + 15) / 16 * 16; }

/// The buffers' layout for `rows` rows of `draws` draws and `candidates` candidates in all: the
/// rows' specs, then the uniforms (both sent down), then the draws and candidates (sent up).
struct sampler_layout {
  std::size_t specs_bytes, down_offset, down_bytes;
  sampler_layout(std::size_t rows, std::size_t draws, std::size_t candidates)
      : specs_bytes(align16(rows * sizeof(row_sample_spec))),
        down_offset(specs_bytes + align16(draws * sizeof(double))),
        down_bytes((draws + candidates) * sizeof(device_sampled_token)) {}
  [[nodiscard]] std::size_t total() const { return down_offset + down_bytes; }
};
}  // namespace

bool row_sampler::reserve(std::size_t rows, std::size_t draws, std::size_t candidates) {
  return buffers_->reserve(sampler_layout(rows, draws, candidates).total());
}

void row_sampler::launch(const float* logits, std::int64_t vocab, const sampling_batch& batch, void* stream_handle) {
  const std::size_t rows = batch.rows.size();
  check_sampling_batch(batch, rows, vocab);
  if (vocab > sample_max_vocab)
    detail::fail(errc::invalid_argument, "GPU sampling takes rows of at most ", sample_max_vocab, " tokens, not ", vocab);
  static_assert(sample_max_candidates >= max_sampling_candidates);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  buffers& b = *buffers_;
  b.num_draws = batch.uniforms.size();
  b.num_candidates = 0;
  for (const row_sampling& s : batch.rows) b.num_candidates += std::size_t(s.num_candidates);
  const sampler_layout layout(rows, b.num_draws, b.num_candidates);
  const std::size_t specs_bytes = layout.specs_bytes, down_bytes = layout.down_bytes;
  b.down_offset = layout.down_offset;
  b.reserve(layout.total());
  if (rows == 0) return;

  auto* host = static_cast<unsigned char*>(b.host.get());
  auto* specs = reinterpret_cast<row_sample_spec*>(host);
  std::int32_t draw = 0, candidate = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const row_sampling& s = batch.rows[r];
    specs[r] = {s.temperature, s.top_k, s.top_p, s.num_draws, s.num_candidates, draw, candidate};
    draw += s.num_draws;
    candidate += s.num_candidates;
  }
  std::memcpy(host + specs_bytes, batch.uniforms.data(), b.num_draws * sizeof(double));
  auto* device = static_cast<unsigned char*>(b.device.get());
  PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(device, host, b.down_offset, cudaMemcpyHostToDevice, stream));
  auto* down = reinterpret_cast<device_sampled_token*>(device + b.down_offset);
  const sample_params p{.logits = logits,
                        .vocab = vocab,
                        .specs = reinterpret_cast<const row_sample_spec*>(device),
                        .uniforms = reinterpret_cast<const double*>(device + specs_bytes),
                        .draws = down,
                        .candidates = down + b.num_draws};
  sample_kernel<><<<unsigned(rows), sample_threads, 0, stream>>>(p);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  if (down_bytes > 0)
    PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(host + b.down_offset, down, down_bytes, cudaMemcpyDeviceToHost, stream));
}

namespace {
__global__ void take_drawn_tokens_kernel(std::int32_t* tokens, const std::int32_t* sources,
                                         const device_sampled_token* draws, std::int32_t n) {
  const std::int32_t i = std::int32_t(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n && sources[i] >= 0) tokens[i] = draws[sources[i]].token;
}
}  // namespace

void row_sampler::take_drawn_tokens(std::int32_t* tokens, const std::int32_t* sources, std::int32_t n,
                                    void* stream_handle) const {
  if (n <= 0) return;
  const buffers& b = *buffers_;
  const auto* draws = reinterpret_cast<const device_sampled_token*>(static_cast<const unsigned char*>(b.device.get()) +
                                                                    b.down_offset);
  constexpr int threads = 256;
  take_drawn_tokens_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, static_cast<cudaStream_t>(stream_handle)>>>(
      tokens, sources, draws, n);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

step_samples row_sampler::collect() {
  const buffers& b = *buffers_;
  const auto* down =
      reinterpret_cast<const device_sampled_token*>(static_cast<const unsigned char*>(b.host.get()) + b.down_offset);
  draws_.resize(b.num_draws);
  candidates_.resize(b.num_candidates);
  for (std::size_t i = 0; i < b.num_draws; ++i) draws_[i] = {down[i].token, double(down[i].logprob)};
  for (std::size_t i = 0; i < b.num_candidates; ++i)
    candidates_[i] = {down[b.num_draws + i].token, double(down[b.num_draws + i].logprob)};
  return {draws_, candidates_};
}

}  // namespace cuda

step_samples cuda_sample_rows(std::span<const float> logits, std::int64_t vocab, const sampling_batch& batch,
                              std::vector<sampled_token>& draws, std::vector<sampled_token>& candidates) {
  if (vocab < 1 || logits.size() != batch.rows.size() * std::size_t(vocab))
    detail::fail(errc::invalid_argument, "cuda_sample_rows: ", logits.size(), " logits for ", batch.rows.size(),
                 " rows of ", vocab);
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct stream_guard {
    cudaStream_t s;
    ~stream_guard() { cudaStreamDestroy(s); }
  } guard{stream};
  const auto rows_on_device = kernels::cuda::allocate<cuda::device_memory>(std::max<std::size_t>(logits.size(), 1) * sizeof(float));
  PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(rows_on_device.get(), logits.data(), logits.size() * sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
  cuda::row_sampler sampler;
  sampler.launch(static_cast<const float*>(rows_on_device.get()), vocab, batch, stream);
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  const step_samples got = sampler.collect();
  draws.assign(got.draws.begin(), got.draws.end());
  candidates.assign(got.candidates.begin(), got.candidates.end());
  return {draws, candidates};
}

}  // namespace pagedkv::llama
