// Element types on the device and the conversions the kernels use: 16-byte shared-memory loads
// that widen to fp32, and narrow stores.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "../kv_dtype.hpp"

namespace pagedkv::kernels::cuda {

/// The CUDA type of each dtype.
template <dtype T> struct type_of;
template <> struct type_of<dtype::f32> { using type = float; };
template <> struct type_of<dtype::f16> { using type = __half; };
template <> struct type_of<dtype::bf16> { using type = __nv_bfloat16; };
template <> struct type_of<dtype::fp8_e4m3> { using type = __nv_fp8_e4m3; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return float(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return r;
}

namespace detail {
__device__ __forceinline__ float2 bf16x2_to_float2(std::uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 f16x2_to_float2(std::uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
__device__ __forceinline__ void fp8x4_to_float(std::uint32_t w, float* out) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
template <class T>
__device__ __forceinline__ void word_to_float(std::uint32_t w, float* out) {
  if constexpr (sizeof(T) == 4) {
    out[0] = __uint_as_float(w);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const float2 f = bf16x2_to_float2(w); out[0] = f.x; out[1] = f.y;
  } else if constexpr (std::is_same_v<T, __half>) {
    const float2 f = f16x2_to_float2(w); out[0] = f.x; out[1] = f.y;
  } else {
    fp8x4_to_float(w, out);
  }
}
}  // namespace detail

/// Elements of T in 16 bytes.
template <class T> inline constexpr int vec16 = int(16 / sizeof(T));

/// out[0, 16 / sizeof(T)) = the 16 bytes `raw` (elements of T), widened to fp32.
template <class T>
__device__ __forceinline__ void chunk16_to_float(const uint4& raw, float* out) {
  constexpr int per_word = 4 / int(sizeof(T));
  detail::word_to_float<T>(raw.x, out + 0 * per_word);
  detail::word_to_float<T>(raw.y, out + 1 * per_word);
  detail::word_to_float<T>(raw.z, out + 2 * per_word);
  detail::word_to_float<T>(raw.w, out + 3 * per_word);
}

/// out[0, 16 / sizeof(T)) = the 16 bytes at p (16-byte aligned), widened to fp32.
template <class T>
__device__ __forceinline__ void load16_as_float(const T* p, float* out) {
  chunk16_to_float<T>(*reinterpret_cast<const uint4*>(p), out);
}

/// Global loads issued where the call stands, on every path: volatile, so neither the compiler
/// nor ptxas may sink one past a branch that skips its use, as both did with ordinary loads and
/// with a plain load in volatile asm (write_kv issues its row loads before it knows, from the
/// slot, whether it stores them, so that the rows and the slot come in one round trip).
__device__ __forceinline__ uint4 load16_here(const void* p) {  // 16-byte aligned
  uint4 r;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ std::int64_t load8_here(const std::int64_t* p) {
  std::int64_t r;
  asm volatile("ld.volatile.global.s64 %0, [%1];\n" : "=l"(r) : "l"(p));
  return r;
}

/// out[0, 4) = the four elements at p (aligned to 4 * sizeof(T)), widened to fp32.
template <class T>
__device__ __forceinline__ void load4_as_float(const T* p, float* out) {
  if constexpr (sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
  } else if constexpr (sizeof(T) == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    detail::word_to_float<T>(v.x, out);
    detail::word_to_float<T>(v.y, out + 2);
  } else {
    detail::word_to_float<T>(*reinterpret_cast<const std::uint32_t*>(p), out);
  }
}

}  // namespace pagedkv::kernels::cuda
