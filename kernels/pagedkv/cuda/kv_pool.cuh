// The storage of a paged KV cache: a layout (kv_layout.hpp) and one owned allocation that holds
// every element the layout maps, in device memory (what the kernels read) or pinned host memory
// (what swap_blocks moves blocks to). The block pool, tables and prefix cache deal in block ids;
// this is where those blocks' bytes live, and the engine owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>

#include <cuda_runtime.h>

#include <pagedkv/error.hpp>

#include "../kv_dtype.hpp"
#include "../kv_layout.hpp"
#include "check.cuh"
#include "memory.cuh"

namespace pagedkv::kernels::cuda {

namespace detail {

/// Bytes of the allocation that `layout` needs: one past its last element. Throws
/// errc::invalid_argument naming the layout when its shape is not positive, a stride is negative,
/// or the size overflows.
inline std::size_t kv_pool_bytes(const kv_cache_layout& layout) {
  kernels::detail::check_shape(layout.shape, true);
  const kv_cache_shape& s = layout.shape;
  const std::int64_t strides[] = {layout.layer_stride, layout.kv_stride, layout.block_stride, layout.token_stride,
                                  layout.head_stride};
  const std::int64_t extents[] = {s.num_layers, 2, s.num_blocks, s.block_size, s.num_kv_heads};
  // The last element is at sum (extent - 1) * stride + head_dim - 1; each term checked for overflow.
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t elems = std::uint64_t(s.head_dim);
  for (int i = 0; i < 5; ++i) {
    if (strides[i] < 0)
      pagedkv::detail::fail(errc::invalid_argument, "kv_pool: layout ", to_string(layout), " has a negative stride");
    const auto term_max = std::uint64_t(extents[i] - 1), stride = std::uint64_t(strides[i]);
    if (stride != 0 && term_max > (max - elems) / stride)
      pagedkv::detail::fail(errc::invalid_argument, "kv_pool: layout ", to_string(layout), " overflows 64 bits");
    elems += term_max * stride;
  }
  const std::uint64_t element_bytes = size_of(layout.kv_dtype);
  if (elems > std::uint64_t(std::numeric_limits<std::size_t>::max()) / element_bytes)
    pagedkv::detail::fail(errc::invalid_argument, "kv_pool: layout ", to_string(layout), " overflows ",
                          sizeof(std::size_t) * 8, " bits of bytes");
  return std::size_t(elems * element_bytes);
}

}  // namespace detail

/// A KV pool in Memory (device_memory or pinned_host_memory): the layout and the bytes that hold
/// every element it maps (for a packed layout from make_kv_cache_layout, layout.size_bytes()).
/// RAII and move-only; a moved-from or default-constructed pool is empty (data() null, 0 bytes).
template <kv_memory Memory = device_memory>
class kv_pool {
 public:
  kv_pool() = default;

  /// Allocates the pool of `layout`; its bytes are not initialised. Throws errc::invalid_argument
  /// naming the layout when it maps no element or overflows, cuda_error naming the call
  /// (cudaMalloc, cudaMallocHost) and the size when the allocation fails.
  explicit kv_pool(const kv_cache_layout& layout)
      : layout_(layout), bytes_(detail::kv_pool_bytes(layout)), data_(allocate<Memory>(bytes_)) {}

  /// The same, but an empty optional where Memory is short of bytes (the throwing form's
  /// cudaErrorMemoryAllocation); other errors still throw. For an engine that sizes its pool to
  /// what the GPU has.
  [[nodiscard]] static std::optional<kv_pool> try_allocate(const kv_cache_layout& layout) {
    const std::size_t bytes = detail::kv_pool_bytes(layout);
    owned_bytes<Memory> data = cuda::try_allocate<Memory>(bytes);
    if (!data) return std::nullopt;
    return kv_pool(layout, bytes, std::move(data));
  }

  kv_pool(kv_pool&& other) noexcept
      : layout_(other.layout_), bytes_(std::exchange(other.bytes_, 0)), data_(std::move(other.data_)) {}
  kv_pool& operator=(kv_pool&& other) noexcept {
    layout_ = other.layout_;
    bytes_ = std::exchange(other.bytes_, 0);
    data_ = std::move(other.data_);
    return *this;
  }

  [[nodiscard]] const kv_cache_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] void* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return bytes_; }
  [[nodiscard]] bool empty() const noexcept { return bytes_ == 0; }

  /// Sets every byte to `byte` (0xff: NaN in every KV type), synchronously.
  void fill(int byte) {
    if (bytes_) Memory::fill(data(), byte, bytes_);
  }
  /// Copies the whole pool from host memory of size_bytes() bytes, synchronously. Throws
  /// errc::invalid_argument naming both sizes when `host` is of another size.
  void copy_from(std::span<const unsigned char> host) {
    check_size(host.size(), "copy_from");
    if (bytes_) PAGEDKV_CUDA_CHECK(cudaMemcpy(data(), host.data(), bytes_, cudaMemcpyDefault));
  }
  /// Copies the whole pool to host memory of size_bytes() bytes, synchronously (same errors).
  void copy_to(std::span<unsigned char> host) const {
    check_size(host.size(), "copy_to");
    if (bytes_) PAGEDKV_CUDA_CHECK(cudaMemcpy(host.data(), data(), bytes_, cudaMemcpyDefault));
  }

 private:
  kv_pool(const kv_cache_layout& layout, std::size_t bytes, owned_bytes<Memory> data)
      : layout_(layout), bytes_(bytes), data_(std::move(data)) {}

  void check_size(std::size_t host_bytes, const char* call) const {
    if (host_bytes != bytes_)
      pagedkv::detail::fail(errc::invalid_argument, "kv_pool::", call, ": ", host_bytes, " host bytes for a ",
                            Memory::name, " pool of ", bytes_);
  }

  kv_cache_layout layout_;
  std::size_t bytes_ = 0;
  owned_bytes<Memory> data_;
};

using device_kv_pool = kv_pool<device_memory>;
using pinned_host_kv_pool = kv_pool<pinned_host_memory>;

}  // namespace pagedkv::kernels::cuda
