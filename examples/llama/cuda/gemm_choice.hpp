// One matrix product's algorithm choice (cuda/gemm.hpp), in a header without CUDA so that the
// backend's options (cuda_backend.hpp) and the command line can hold it.
#pragma once

#include <cstdint>

namespace pagedkv::llama::cuda {

/// A product's shape, y[n, out] = x[n, in] W^T, and the index of its algorithm among cuBLASLt's
/// heuristic candidates for it (0: the heuristic's first choice). Indices hold for the GPU and the
/// cuBLASLt that chose them.
struct gemm_choice {
  std::int64_t n = 0, in = 0, out = 0;
  bool f32_out = false;
  int index = 0;
  friend bool operator==(const gemm_choice&, const gemm_choice&) = default;
};

}  // namespace pagedkv::llama::cuda
