// Small helpers of the GPU tests and benchmarks: an owning device buffer and a skip when no GPU.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include <pagedkv/cuda/check.cuh>

namespace pagedkv::kernels::testing {

struct cuda_free {
  void operator()(void* p) const noexcept { cudaFree(p); }
};

/// Device memory of `bytes`, filled with `fill` bytes (0xff: NaN in every float type).
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes, int fill = 0xff) : bytes_(bytes) {
    void* p = nullptr;
    if (bytes) PAGEDKV_CUDA_CHECK(cudaMalloc(&p, bytes));
    ptr_.reset(p);
    if (bytes) PAGEDKV_CUDA_CHECK(cudaMemset(p, fill, bytes));
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
  std::unique_ptr<void, cuda_free> ptr_;
  std::size_t bytes_ = 0;
};

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace pagedkv::kernels::testing

/// Skips the test, visibly, where there is no GPU (CI): the test binaries still compile there.
#define PAGEDKV_SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                            \
    if (!::pagedkv::kernels::testing::have_gpu()) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)
