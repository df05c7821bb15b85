// Element types of the KV cache and of queries/outputs, as runtime values (dispatch turns them
// into compile-time types) and as host storage types that are bit-compatible with CUDA's
// __half, __nv_bfloat16 and __nv_fp8_e4m3, so host and device share buffers byte for byte.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "kernels_config.hpp"

namespace pagedkv::kernels {

enum class dtype : std::uint8_t { f32, f16, bf16, fp8_e4m3 };

constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::fp8_e4m3: return 1;
  }
  return 0;
}

constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

namespace host {

/// IEEE binary16, stored as its bits.
struct f16 {
  std::uint16_t bits;
};
/// bfloat16 (the top half of a binary32), stored as its bits.
struct bf16 {
  std::uint16_t bits;
};
/// OCP fp8 E4M3 ("fn": no infinities, one NaN pattern per sign, largest finite 448).
struct fp8_e4m3 {
  std::uint8_t bits;
};

inline float to_float(float x) noexcept { return x; }

inline float to_float(f16 h) noexcept {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in binary32
    const float magnitude = std::ldexp(float(mantissa), -24);
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline float to_float(bf16 b) noexcept { return std::bit_cast<float>(std::uint32_t(b.bits) << 16); }

inline float to_float(fp8_e4m3 e) noexcept {
  const bool negative = (e.bits & 0x80u) != 0;
  const int exponent = (e.bits >> 3) & 0xf;
  const int mantissa = e.bits & 0x7;
  if (exponent == 15 && mantissa == 7) return std::nanf("");
  const float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9)
                                        : std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
  return negative ? -magnitude : magnitude;
}

/// Round to nearest even, like __float2half_rn.
inline f16 to_f16(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = std::uint16_t((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return {std::uint16_t(sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (magnitude >= 0x477ff000u) return {std::uint16_t(sign | 0x7c00u)};  // rounds past 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half, count of 2^-24 units
    const float units = std::bit_cast<float>(magnitude) * 16777216.0f;  // exact: power-of-two scale
    return {std::uint16_t(sign | std::uint16_t(std::nearbyint(units)))};
  }
  const std::uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return {std::uint16_t(sign | ((rounded - (112u << 23)) >> 13))};
}

/// Round to nearest even, like __float2bfloat16_rn.
inline bf16 to_bf16(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {std::uint16_t((bits >> 16) | 0x40u)};
  return {std::uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16)};
}

/// Round to nearest even and saturate to +-448, like __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
/// __NV_E4M3). NaN becomes 0x7f.
inline fp8_e4m3 to_fp8_e4m3(float x) noexcept {
  if (std::isnan(x)) return {0x7f};
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float magnitude = std::fabs(x);
  if (magnitude >= 448.0f) return {std::uint8_t(sign | 0x7e)};
  if (magnitude < 0.015625f) {  // below 2^-6: subnormal, count of 2^-9 units (8 = smallest normal)
    return {std::uint8_t(sign | std::uint8_t(std::nearbyint(magnitude * 512.0f)))};
  }
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(magnitude);
  const std::uint32_t rounded = bits + 0x7ffffu + ((bits >> 20) & 1u);
  const int exponent = int((rounded >> 23) & 0xffu) - 127 + 7;
  const int code = (exponent << 3) | int((rounded >> 20) & 0x7u);
  return {std::uint8_t(sign | (code > 0x7e ? 0x7e : code))};
}

template <class T>
inline T from_float(float x) noexcept {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, f16>) return to_f16(x);
  else if constexpr (std::is_same_v<T, bf16>) return to_bf16(x);
  else return to_fp8_e4m3(x);
}

/// Calls f.template operator()<T>() with the host storage type of t.
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f16: return f.template operator()<f16>();
    case dtype::bf16: return f.template operator()<bf16>();
    case dtype::fp8_e4m3: return f.template operator()<fp8_e4m3>();
    case dtype::f32: break;
  }
  return f.template operator()<float>();
}

}  // namespace host
}  // namespace pagedkv::kernels
