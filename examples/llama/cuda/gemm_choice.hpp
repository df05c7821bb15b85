// One matrix product's algorithm choice (cuda/gemm.hpp), in a header without CUDA so that the
// backend's options (cuda_backend.hpp) and the command line can hold it.
#pragma once

#include <cstdint>

namespace pagedkv::llama::cuda {

/// A cuBLASLt algorithm in full: its id and every configuration attribute
/// (cublasLtMatmulAlgoConfigAttributes_t), which cublasLtMatmulAlgoInit and
/// cublasLtMatmulAlgoConfigSetAttribute rebuild it from. The ids are cuBLASLt's enums (tile,
/// stages, reduction scheme, inner and cluster shape) and hold for the GPU and cuBLASLt that
/// listed them.
struct gemm_config {
  std::int32_t algo = 0;
  std::uint32_t tile = 0, stages = 0;
  std::int32_t splitk = 1;
  std::uint32_t reduction = 0, swizzle = 0, custom = 0;
  std::uint16_t inner = 0, cluster = 0;
  friend bool operator==(const gemm_config&, const gemm_config&) = default;
};

/// A product's shape, y[n, out] = x[n, in] W^T, and the algorithm it runs with.
struct gemm_choice {
  std::int64_t n = 0, in = 0, out = 0;
  bool f32_out = false;
  gemm_config config;
  friend bool operator==(const gemm_choice&, const gemm_choice&) = default;
};

/// An algorithm for whole-step tuning to try on products of a shape (cuda_backend_options::
/// gemm_candidates), found best for `rows` rows by bench/engine/gemm_space.cu.
struct gemm_candidate {
  std::int64_t in = 0, out = 0;
  bool f32_out = false;
  std::int64_t rows = 0;
  gemm_config config;
  friend bool operator==(const gemm_candidate&, const gemm_candidate&) = default;
};

}  // namespace pagedkv::llama::cuda
