// An owned device buffer for the GPU tests and benchmarks: bytes filled on allocation (0xff by
// default: NaN in every float type, so that an output never written shows), copies from and to
// host vectors; and whether this machine has a GPU at all.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "check.cuh"
#include "memory.cuh"

namespace pagedkv::kernels::cuda {

/// `bytes` of device memory, each set to `fill`. Move-only; empty (null) when bytes is 0.
/// Throws cuda_error naming the call and the size when an allocation or copy fails.
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(device_buffer&& other) noexcept
      : ptr_(std::move(other.ptr_)), bytes_(std::exchange(other.bytes_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    ptr_ = std::move(other.ptr_);
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
  }
  explicit device_buffer(std::size_t bytes, int fill = 0xff) : bytes_(bytes) {
    if (bytes == 0) return;
    ptr_ = allocate<device_memory>(bytes);
    device_memory::fill(ptr_.get(), fill, bytes);
  }
  template <class T>
  static device_buffer from(const std::vector<T>& host) {
    device_buffer b(host.size() * sizeof(T));
    if (!host.empty()) PAGEDKV_CUDA_CHECK(cudaMemcpy(b.get(), host.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }
  template <class T>
  void to(std::vector<T>& host) const {
    host.resize(bytes_ / sizeof(T));
    if (bytes_) PAGEDKV_CUDA_CHECK(cudaMemcpy(host.data(), get(), bytes_, cudaMemcpyDeviceToHost));
  }
  [[nodiscard]] void* get() const { return ptr_.get(); }
  template <class T>
  [[nodiscard]] T* as() const { return static_cast<T*>(ptr_.get()); }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  owned_bytes<device_memory> ptr_;
  std::size_t bytes_ = 0;
};

/// Whether the CUDA runtime sees a device (CI has none: the GPU tests skip, the benchmarks say so).
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace pagedkv::kernels::cuda
