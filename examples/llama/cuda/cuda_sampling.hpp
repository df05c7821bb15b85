// Sampling on the GPU (sampling.hpp's definition, cuda/sampling_kernels.cuh) for rows of logits that
// are already there: what the CUDA backend's execute_sampled runs after its forward. This header
// needs no CUDA compiler; cuda_sample_rows, which takes rows from the host, exists in every build
// (refusing without CUDA) so that tests can compare the GPU with the host definition on any rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sampling.hpp"

namespace pagedkv::llama {

namespace cuda {

/// Samples rows of logits on the device: launch() enqueues the copies and the kernel on a stream,
/// collect() (after the stream is synchronized) returns what came back. Owns its buffers, device
/// and pinned host, which grow on demand. Built only with CUDA.
class row_sampler {
 public:
  row_sampler();
  ~row_sampler();
  row_sampler(const row_sampler&) = delete;
  row_sampler& operator=(const row_sampler&) = delete;

  /// logits: device rows [batch.rows.size(), vocab]; stream: a cudaStream_t.
  /// Errors: pagedkv::error (invalid_argument) for a batch check_sampling_batch refuses or a vocab
  /// over 2^20 tokens (the fixed-point weights' limit); kernels::cuda_error naming a failed call.
  void launch(const float* logits, std::int64_t vocab, const sampling_batch& batch, void* stream);
  /// Sizes the buffers for `rows` rows of one draw and no candidates each, so that launches of
  /// up to that many do not grow them; or for rows with `draws` draws and `candidates` candidates
  /// in all. Returns whether they grew (a free and an allocation, each waiting for the GPU).
  bool reserve(std::size_t rows) { return reserve(rows, rows, 0); }
  bool reserve(std::size_t rows, std::size_t draws, std::size_t candidates);
  /// The last launch's draws and candidates, once its stream has finished.
  step_samples collect();
  /// Enqueues on `stream`, after the last launch: tokens[i] = that launch's draw sources[i] where
  /// sources[i] >= 0, for i < n (device arrays): the next step's inputs taken where they were
  /// drawn, without a round trip to the host. The caller checks the sources against the draws.
  void take_drawn_tokens(std::int32_t* tokens, const std::int32_t* sources, std::int32_t n, void* stream) const;

 private:
  struct buffers;
  std::unique_ptr<buffers> buffers_;
  std::vector<sampled_token> draws_, candidates_;
};

}  // namespace cuda

/// For tests: uploads logits [rows, vocab] from the host, samples them on the GPU as the CUDA
/// backend does, and returns the draws and candidates (into the vectors given).
/// Errors: as row_sampler::launch; pagedkv::error (invalid_argument) in a build without CUDA.
step_samples cuda_sample_rows(std::span<const float> logits, std::int64_t vocab, const sampling_batch& batch,
                              std::vector<sampled_token>& draws, std::vector<sampled_token>& candidates);

}  // namespace pagedkv::llama
