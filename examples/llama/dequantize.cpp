#include "dequantize.hpp"

#include <bit>
#include <cassert>
#include <cstring>

namespace pagedkv::llama {
namespace {

std::uint16_t load_u16(const std::uint8_t* p) noexcept { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

// The block formats are ggml's (ggml-common.h): a float16 scale `d` (and for Q4_1 a float16 minimum
// `m`) followed by the quants of 32 values. 4-bit blocks keep value j in the low nibble of byte j
// and value j + 16 in its high nibble.
constexpr std::uint64_t quant_block = 32;

void dequantize_q4_0(const std::uint8_t* block, float* out) noexcept {
  const float d = f16_to_f32(load_u16(block));
  const std::uint8_t* quants = block + 2;
  for (std::uint64_t j = 0; j < quant_block / 2; ++j) {
    out[j] = static_cast<float>((quants[j] & 0x0F) - 8) * d;
    out[j + quant_block / 2] = static_cast<float>((quants[j] >> 4) - 8) * d;
  }
}

void dequantize_q4_1(const std::uint8_t* block, float* out) noexcept {
  const float d = f16_to_f32(load_u16(block));
  const float m = f16_to_f32(load_u16(block + 2));
  const std::uint8_t* quants = block + 4;
  for (std::uint64_t j = 0; j < quant_block / 2; ++j) {
    out[j] = static_cast<float>(quants[j] & 0x0F) * d + m;
    out[j + quant_block / 2] = static_cast<float>(quants[j] >> 4) * d + m;
  }
}

void dequantize_q8_0(const std::uint8_t* block, float* out) noexcept {
  const float d = f16_to_f32(load_u16(block));
  for (std::uint64_t j = 0; j < quant_block; ++j)
    out[j] = static_cast<float>(static_cast<std::int8_t>(block[2 + j])) * d;
}

}  // namespace

std::optional<type_layout> layout_of(ggml_type type) noexcept {
  switch (type) {
    case ggml_type::f32: return type_layout{"F32", 1, 4};
    case ggml_type::f16: return type_layout{"F16", 1, 2};
    case ggml_type::bf16: return type_layout{"BF16", 1, 2};
    case ggml_type::q4_0: return type_layout{"Q4_0", quant_block, 2 + quant_block / 2};
    case ggml_type::q4_1: return type_layout{"Q4_1", quant_block, 4 + quant_block / 2};
    case ggml_type::q8_0: return type_layout{"Q8_0", quant_block, 2 + quant_block};
  }
  return std::nullopt;
}

float f16_to_f32(std::uint16_t half) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1F;
  std::uint32_t mantissa = half & 0x03FF;
  std::uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // infinity or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: shift the mantissa up until its leading one is the implicit bit.
    std::uint32_t shifted_exponent = 113;
    while ((mantissa & 0x0400) == 0) {
      mantissa <<= 1;
      --shifted_exponent;
    }
    bits = sign | (shifted_exponent << 23) | ((mantissa & 0x03FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(std::uint16_t bfloat) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(bfloat) << 16); }

void dequantize(ggml_type type, std::span<const std::uint8_t> bytes, std::span<float> out) {
  const auto layout = layout_of(type);
  assert(layout && out.size() % layout->block_elements == 0 &&
         bytes.size() == out.size() / layout->block_elements * layout->block_bytes);
  if (out.empty()) return;  // an empty tensor: bytes.data() may be null, which memcpy must not see
  const std::uint8_t* in = bytes.data();
  switch (type) {
    case ggml_type::f32: std::memcpy(out.data(), in, out.size_bytes()); return;
    case ggml_type::f16:
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = f16_to_f32(load_u16(in + 2 * i));
      return;
    case ggml_type::bf16:
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(load_u16(in + 2 * i));
      return;
    case ggml_type::q4_0:
    case ggml_type::q4_1:
    case ggml_type::q8_0: {
      const auto block = type == ggml_type::q4_0   ? dequantize_q4_0
                         : type == ggml_type::q4_1 ? dequantize_q4_1
                                                   : dequantize_q8_0;
      for (std::size_t b = 0; b < out.size() / quant_block; ++b)
        block(in + b * layout->block_bytes, out.data() + b * quant_block);
      return;
    }
  }
}

}  // namespace pagedkv::llama
