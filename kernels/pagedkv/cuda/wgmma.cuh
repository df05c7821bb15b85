// Hopper warpgroup matrix multiply-accumulate (wgmma, sm_90a only): the shared-memory matrix
// descriptors of the 128-byte swizzle, the fences and groups that order wgmma against other
// instructions, and m64n128k16 with fp32 accumulators (A from shared memory or from registers, B
// from shared memory). Each function is one warpgroup-wide instruction: all 128 threads of a
// warpgroup (4 consecutive warps from a warp index divisible by 4) call it together.
// Compiled only where __CUDA_ARCH_FEAT_SM90_ALL is defined (-gencode arch=compute_90a); elsewhere
// the bodies are empty and PAGEDKV_WGMMA_COMPILED is 0 (the kernels using them trap there).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGEDKV_WGMMA_COMPILED 1
#else
#define PAGEDKV_WGMMA_COMPILED 0
#endif

namespace pagedkv::kernels::cuda {

/// A descriptor of a matrix in shared memory laid out in 128-byte swizzle atoms (8 rows of 128
/// bytes; 16-byte chunk c of row r stored at chunk c ^ (r % 8); atoms 1024-byte aligned).
/// lbo_bytes, sbo_bytes: the leading and stride byte offsets (PTX ISA, "Matrix Descriptor").
__device__ __forceinline__ std::uint64_t wgmma_desc_sw128(unsigned smem_addr, unsigned lbo_bytes, unsigned sbo_bytes) {
  return std::uint64_t((smem_addr & 0x3FFFFu) >> 4) | (std::uint64_t((lbo_bytes & 0x3FFFFu) >> 4) << 16) |
         (std::uint64_t((sbo_bytes & 0x3FFFFu) >> 4) << 32) | (std::uint64_t(1) << 62);
}

/// Orders this thread's earlier register writes (accumulators, A fragments) before the wgmma after it.
__device__ __forceinline__ void wgmma_fence() {
#if PAGEDKV_WGMMA_COMPILED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if PAGEDKV_WGMMA_COMPILED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/// Waits until at most Pending committed wgmma groups of the warpgroup are in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
#if PAGEDKV_WGMMA_COMPILED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}
/// Makes this thread's ordinary and cp.async writes to shared memory visible to the async proxy
/// (wgmma's operand reads); a barrier after it extends that to the other threads' writes.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if PAGEDKV_WGMMA_COMPILED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/// Keeps the compiler from moving r's uses across this point: after wgmma_wait, an accumulator's
/// new value is read only below it.
__device__ __forceinline__ void wgmma_pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wgmma_pin(std::uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

/// A barrier of `count` threads (whole warps) on named barrier `id` (1-15; 0 is __syncthreads'):
/// sync waits for the count, arrive counts this warp and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// The warpgroup's registers a thread raised or lowered to N (sm_90a; takes effect only where the
/// kernel has a register cap at entry, __launch_bounds__(threads, 1), and the roles are the two
/// branches of one if/else).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if PAGEDKV_WGMMA_COMPILED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if PAGEDKV_WGMMA_COMPILED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// The 64 accumulator operands of an m64n128 wgmma, and their register list.
#define PAGEDKV_WGMMA_ACC64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define PAGEDKV_WGMMA_REGS64 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
  "}"
/// d (+)= A B, m64n128k16, fp32 accumulators in mma.sync's m16n8 layout: d[4 j + e] is row
/// 16 (warp % 4) + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2. A: 64 x 16 from shared
/// memory, K-major; B: 16 x 128 from shared memory, K-major (128 rows of 16 k each, as K's
/// [key][dim] tiles are for S = Q K^T). accumulate 0: d = A B.
template <class T>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b,
                                                    int accumulate) {
#if PAGEDKV_WGMMA_COMPILED
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PAGEDKV_WGMMA_REGS64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : PAGEDKV_WGMMA_ACC64(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " PAGEDKV_WGMMA_REGS64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : PAGEDKV_WGMMA_ACC64(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
}

/// d += A B, m64n128k16: A 64 x 16 from registers (mma.sync's m16n8k16 A fragment for each warp's
/// 16 rows), B 16 x 128 from shared memory as k rows of 128 contiguous n (MN-major: the transpose
/// bit set), as V's [key][dim] tiles are for O = P V.
template <class T>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
#if PAGEDKV_WGMMA_COMPILED
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PAGEDKV_WGMMA_REGS64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : PAGEDKV_WGMMA_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " PAGEDKV_WGMMA_REGS64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : PAGEDKV_WGMMA_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  }
#else
  (void)d, (void)a, (void)desc_b;
#endif
}

#undef PAGEDKV_WGMMA_ACC64
#undef PAGEDKV_WGMMA_REGS64

}  // namespace pagedkv::kernels::cuda
