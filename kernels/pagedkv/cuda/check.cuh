// CUDA error checking: every runtime call and every launch goes through PAGEDKV_CUDA_CHECK, which
// throws pagedkv::kernels::cuda_error naming the call, the file and the line; and owned_event, so
// that a throw between an event's creation and its last use leaks nothing.
#pragma once

#include <memory>
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

namespace pagedkv::kernels::cuda {

namespace detail {
struct destroy_event {
  void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
}  // namespace detail

/// A CUDA event, destroyed with its owner.
using owned_event = std::unique_ptr<CUevent_st, detail::destroy_event>;

/// A new event (cudaEventCreateWithFlags: timing on unless flags turn it off).
inline owned_event make_event(unsigned flags = cudaEventDefault) {
  cudaEvent_t e = nullptr;
  PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  return owned_event(e);
}

}  // namespace pagedkv::kernels::cuda
