// Warp-level tensor-core instructions (mma.sync, ldmatrix; sm_80 and later, Hopper included).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace pagedkv::kernels::cuda {

/// c[16x8] += a[16x16] * b[16x8], fp32 accumulators, 16-bit operands of type T.
template <class T>
__device__ __forceinline__ void mma_16816(float* c, const std::uint32_t* a, std::uint32_t b0, std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// Four 8x8 16-bit matrices from shared memory: lanes 8j to 8j + 7 give the row addresses of
/// matrix j (with rows 0-15 at columns 0-7 then 8-15, a m16n8k16 A fragment).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t* r, const void* row) {
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

/// ldmatrix_x4 from a shared-space address (the kernel keeps its tile bases as such, so that an
/// address is one add).
__device__ __forceinline__ void ldmatrix_x4_at(std::uint32_t* r, unsigned smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

/// ldmatrix_x4_trans from a shared-space address.
__device__ __forceinline__ void ldmatrix_x4_trans_at(std::uint32_t* r, unsigned smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

/// 2^x by the special-function unit (ex2.approx, relative error about 2^-22), denormal results
/// flushed to zero: what exp2f compiles to without its denormal fix-up instructions.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// The transpose of an 8x8 16-bit matrix held as a fragment (lane l: row l / 4, columns
/// 2 (l % 4) and 2 (l % 4) + 1), in the same fragment layout.
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

/// Four transposed 8x8 16-bit matrices from shared memory: lanes 8j to 8j + 7 give the row
/// addresses of matrix j.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t* r, const void* row) {
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

/// Two floats as a packed pair of T, the first in the low half.
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

/// Two fp8 e4m3 values (the first in the low byte) widened exactly to a packed pair of T.
template <class T>
__device__ __forceinline__ std::uint32_t fp8x2_to(std::uint16_t raw) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(raw), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return std::uint32_t(h.x) | (std::uint32_t(h.y) << 16);
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    return pack2<T>(f.x, f.y);
  }
}

}  // namespace pagedkv::kernels::cuda
