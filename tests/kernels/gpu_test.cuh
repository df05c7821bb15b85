// What the GPU tests share: a visible skip where there is no GPU, so that the test binaries still
// build and run in CI (their host-only tests run there), and KV pools to and from host bytes.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include <pagedkv/cuda/device_buffer.cuh>
#include <pagedkv/cuda/kv_pool.cuh>
#include <pagedkv/kv_layout.hpp>

/// Skips the test, visibly, where there is no GPU (CI).
#define PAGEDKV_SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                          \
    if (!::pagedkv::kernels::cuda::have_gpu()) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

namespace pagedkv::kernels::testing {

/// A device KV pool of `layout` holding `host` (a host reference's pool of the same bytes).
inline cuda::device_kv_pool device_pool_of(const kv_cache_layout& layout, const std::vector<unsigned char>& host) {
  cuda::device_kv_pool pool(layout);
  pool.copy_from(host);
  return pool;
}

/// Every byte of `pool`, on the host.
inline std::vector<unsigned char> host_bytes_of(const cuda::device_kv_pool& pool) {
  std::vector<unsigned char> host(pool.size_bytes());
  pool.copy_to(host);
  return host;
}

}  // namespace pagedkv::kernels::testing
