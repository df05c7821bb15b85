// The CUDA model's matrix products through cuBLASLt: y[n, out] = x[n, in] W[out, in]^T with bf16
// inputs, f32 accumulation and a bf16 or f32 output. One handle, one workspace and a cache of the
// algorithm per shape (n changes every step; the weights' shapes are few): the heuristic's first
// choice, unless a choice among its first candidates was made for the shape (choose, or
// set_choices before its first product): what whole-step tuning (cuda_backend_options) sets.
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

  /// How many of the heuristic's candidates for the shape there are, asking for up to `wanted`.
  int num_candidates(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int wanted);
  /// Runs the shape's products with candidate `index` (< num_candidates) from now on.
  void choose(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int index);
  /// The candidate the shape's products run with (0 for a shape not planned yet).
  [[nodiscard]] int chosen(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out) const;
  /// Choices made for shapes planned later (or now): a shape whose heuristic has fewer candidates
  /// than the index runs with its first. Errors: pagedkv::error (invalid_argument) for a negative
  /// index, before any choice is set.
  void set_choices(const std::vector<gemm_choice>& choices);
  /// The shapes planned with a candidate other than the first, in shape order.
  [[nodiscard]] std::vector<gemm_choice> choices() const;
  /// Host time spent in cuBLASLt's heuristic so far (a new shape's first product asks it).
  [[nodiscard]] double heuristic_seconds() const noexcept { return heuristic_seconds_; }

 private:
  struct plan;
  using key = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>;
  plan& plan_for(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out);
  void ask_heuristic(plan& p, const key& k, int count);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<key, std::unique_ptr<plan>> plans_;
  std::map<key, int> preset_;  // set_choices for shapes not planned yet
  double heuristic_seconds_ = 0.0;
};

}  // namespace pagedkv::llama::cuda
