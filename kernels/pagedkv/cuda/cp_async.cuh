// Asynchronous global-to-shared copies (cp.async, sm_80+): loads that overlap with math; and
// L2 prefetches.
#pragma once

namespace pagedkv::kernels::cuda {

/// Copies 16 bytes from global src to shared dst, or writes 16 zero bytes when !valid (src is
/// then not read). Bypasses L1: KV is streamed once. The L2::128B hint has L2 fetch the whole
/// 128-byte line on a miss, which the large MHA shapes of the decode table need (decode-kernel.md,
/// "Copies").
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src), "r"(src_bytes)
               : "memory");
}

/// The same to the shared-memory address dst (a 32-bit shared-window address).
__device__ __forceinline__ void cp_async_16_to(unsigned dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

/// Asks L2 for the 128-byte line holding address p, with nothing to wait for and no register
/// written.
__device__ __forceinline__ void prefetch_line_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most Pending committed groups of this thread are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

}  // namespace pagedkv::kernels::cuda
