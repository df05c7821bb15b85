// CUDA error checking: every runtime call and every launch goes through PAGEDKV_CUDA_CHECK, which
// throws pagedkv::kernels::cuda_error naming the call, the file and the line.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace pagedkv::kernels {

class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, const char* what, const char* file, int line)
      : std::runtime_error(std::string("pagedkv: CUDA error ") + cudaGetErrorName(code) + " (" +
                           cudaGetErrorString(code) + ") in " + what + " at " + file + ":" + std::to_string(line)),
        code_(code) {}
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

}  // namespace pagedkv::kernels

#define PAGEDKV_CUDA_CHECK(call)                                                                  \
  do {                                                                                            \
    const cudaError_t pagedkv_status_ = (call);                                                   \
    if (pagedkv_status_ != cudaSuccess)                                                           \
      throw ::pagedkv::kernels::cuda_error(pagedkv_status_, #call, __FILE__, __LINE__);           \
  } while (0)
