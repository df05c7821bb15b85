// Where the bytes of a KV pool or a buffer live: small policy types, one for device memory and one
// for pinned host memory (the kv_memory concept says what they provide), and owned_bytes<Memory>,
// one allocation of either. A failed allocation throws cuda_error naming the call and the size.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "check.cuh"

namespace pagedkv::kernels::cuda {

/// Device memory (cudaMalloc): what the kernels read and write.
struct device_memory {
  static constexpr const char* name = "device";
  static constexpr const char* allocate_call = "cudaMalloc";
  static cudaError_t allocate_raw(void** p, std::size_t bytes) noexcept { return cudaMalloc(p, bytes); }
  static void deallocate(void* p) noexcept { cudaFree(p); }
  static void fill(void* p, int byte, std::size_t bytes) { PAGEDKV_CUDA_CHECK(cudaMemset(p, byte, bytes)); }
};

/// Pinned (page-locked) host memory (cudaMallocHost): a host pool that swap_blocks copies to and
/// from at the bus's speed, and that the host reads directly.
struct pinned_host_memory {
  static constexpr const char* name = "pinned host";
  static constexpr const char* allocate_call = "cudaMallocHost";
  static cudaError_t allocate_raw(void** p, std::size_t bytes) noexcept { return cudaMallocHost(p, bytes); }
  static void deallocate(void* p) noexcept { cudaFreeHost(p); }
  static void fill(void* p, int byte, std::size_t bytes) { std::memset(p, byte, bytes); }
};

/// What a memory policy provides: names for messages, the runtime's allocation, a deallocation
/// that cannot fail, and a fill of every byte.
template <class M>
concept kv_memory = requires(void** out, std::size_t bytes, void* p, int byte) {
  { M::name } -> std::convertible_to<const char*>;
  { M::allocate_call } -> std::convertible_to<const char*>;
  { M::allocate_raw(out, bytes) } noexcept -> std::same_as<cudaError_t>;
  { M::deallocate(p) } noexcept;
  M::fill(p, byte, bytes);
};

namespace detail {

[[noreturn]] inline void fail_allocation(cudaError_t status, const char* call, std::size_t bytes) {
  throw cuda_error(status, (std::string(call) + " of " + std::to_string(bytes) + " bytes").c_str(), __FILE__,
                   __LINE__);
}

template <kv_memory Memory>
struct deallocate {
  void operator()(void* p) const noexcept { Memory::deallocate(p); }
};

}  // namespace detail

/// One owned allocation of Memory; null when empty. Move-only.
template <kv_memory Memory>
using owned_bytes = std::unique_ptr<void, detail::deallocate<Memory>>;

/// bytes (> 0) of Memory, or null when that memory is short (the runtime's error cleared, so that
/// the next launch check does not report it). Throws cuda_error naming the call and the size on
/// any other failure.
template <kv_memory Memory>
owned_bytes<Memory> try_allocate(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t status = Memory::allocate_raw(&p, bytes);
  if (status == cudaSuccess) return owned_bytes<Memory>(p);
  (void)cudaGetLastError();
  if (status != cudaErrorMemoryAllocation) detail::fail_allocation(status, Memory::allocate_call, bytes);
  return nullptr;
}

/// The same, throwing cuda_error (cudaErrorMemoryAllocation, naming the call and the size) when
/// the memory is short.
template <kv_memory Memory>
owned_bytes<Memory> allocate(std::size_t bytes) {
  owned_bytes<Memory> p = try_allocate<Memory>(bytes);
  if (!p) detail::fail_allocation(cudaErrorMemoryAllocation, Memory::allocate_call, bytes);
  return p;
}

}  // namespace pagedkv::kernels::cuda
