// The CUDA model's matrix products through cuBLASLt: y[n, out] = x[n, in] W[out, in]^T with bf16
// inputs, f32 accumulation and a bf16 or f32 output. One handle, one workspace and a cache of the
// heuristic's choice per shape (n changes every step; the weights' shapes are few).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime.h>

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

 private:
  struct plan;
  const plan& plan_for(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>, std::unique_ptr<plan>> plans_;
};

}  // namespace pagedkv::llama::cuda
