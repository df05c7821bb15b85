// The CUDA model's matrix products through cuBLASLt: y[n, out] = x[n, in] W[out, in]^T with bf16
// inputs, f32 accumulation and a bf16 or f32 output. One handle, one workspace and a cache of the
// algorithm per shape (n changes every step; the weights' shapes are few): the heuristic's first
// choice, unless another candidate was chosen for the shape (choose, or set_choices before its
// first product): what whole-step tuning (cuda_backend_options) sets. A shape's candidates are the
// heuristic's first few and any full configs added (add_candidates), each listed once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "gemm_choice.hpp"

namespace pagedkv::llama::cuda {

class gemm {
 public:
  /// workspace_bytes of device memory for cuBLASLt (32 MiB is what it asks for on Hopper).
  explicit gemm(std::size_t workspace_bytes = std::size_t(32) << 20);
  ~gemm();
  gemm(const gemm&) = delete;
  gemm& operator=(const gemm&) = delete;

  /// y = x W^T: x [n, in] bf16, w [out, in] bf16, y [n, out] bf16 (f32_out false) or f32.
  /// Throws pagedkv::error naming the cuBLASLt call and the shape on failure.
  void run(void* y, const void* x, const void* w, std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
           cudaStream_t stream);

  /// How many candidates the shape has after the heuristic's first `wanted` are among them (the
  /// heuristic's first is candidate 0; the list only grows, so indices stay).
  int num_candidates(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int wanted);
  /// The configs of the heuristic's first `count` candidates for the shape (fewer where it lists
  /// fewer).
  std::vector<gemm_config> heuristic_configs(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int count);
  /// Adds the configs that cuBLASLt accepts for the shape (cublasLtMatmulAlgoCheck, within the
  /// workspace) and that are not candidates yet; returns how many candidates the shape has.
  int add_candidates(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
                     const std::vector<gemm_config>& configs);
  /// Runs the shape's products with candidate `index` (< num_candidates) from now on.
  void choose(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int index);
  /// The candidate the shape's products run with (0 for a shape not planned yet).
  [[nodiscard]] int chosen(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out) const;
  /// Choices made for shapes planned later (or now): the heuristic's own candidate where one of
  /// its first 16 has the config, else the config built; a config cuBLASLt refuses for the shape
  /// runs the heuristic's first. Errors: pagedkv::error (invalid_argument) for a negative algorithm
  /// id or a split-K below 1, before any choice is set.
  void set_choices(const std::vector<gemm_choice>& choices);
  /// The shapes planned with a candidate other than the heuristic's first, in shape order.
  [[nodiscard]] std::vector<gemm_choice> choices() const;
  /// Host time spent in cuBLASLt's heuristic so far (a new shape's first product asks it).
  [[nodiscard]] double heuristic_seconds() const noexcept { return heuristic_seconds_; }

 private:
  struct plan;
  using key = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>;
  plan& plan_for(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out);
  void ask_heuristic(plan& p, const key& k, int count);
  int find_or_add(plan& p, const key& k, const gemm_config& config);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<key, std::unique_ptr<plan>> plans_;
  std::map<key, gemm_config> preset_;  // set_choices for shapes not planned yet
  double heuristic_seconds_ = 0.0;
};

}  // namespace pagedkv::llama::cuda
