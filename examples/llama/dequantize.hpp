// Tensor element types of GGUF (ggml's numbering) and safetensors, and their conversion to float32.
// The runner dequantizes every weight once at load time, so the model code sees only floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace pagedkv::llama {

/// ggml's type ids as stored in a GGUF tensor info. Only the ones the runner can dequantize are
/// named; any other id is rejected with its number.
enum class ggml_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 8,
  bf16 = 30,
};

/// How a type packs elements: `block_elements` values stored in `block_bytes` bytes.
struct type_layout {
  std::string_view name;
  std::uint64_t block_elements;
  std::uint64_t block_bytes;
};

/// The layout of a supported type, or nullopt for an id the runner cannot read.
std::optional<type_layout> layout_of(ggml_type type) noexcept;

float f16_to_f32(std::uint16_t half) noexcept;
float bf16_to_f32(std::uint16_t bfloat) noexcept;

/// Converts `out.size()` elements of `type` stored in `bytes` to float32. Preconditions:
/// out.size() is a multiple of the block size and bytes.size() is exactly the packed size.
void dequantize(ggml_type type, std::span<const std::uint8_t> bytes, std::span<float> out);

}  // namespace pagedkv::llama
