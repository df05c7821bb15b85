// Hopper's bulk tensor copy (TMA, sm_90) for the paged prefill: a 4-D tensor map over one layer's
// K or V ([block][kv head][token in block][dim] with the pool's strides, so NHD and HND alike),
// copies of a box of (64 dims, `rows` tokens of one page, one head) into shared memory in the
// 128-byte swizzle; 3-D maps over q and o ([token][query head][dim]) whose box is a KV head's
// group of query heads over some tokens (the wgmma CTA's packed rows: token fastest outside the
// group); the mbarrier that counts their bytes, and the bulk store of a box of o.
// The device functions are empty below sm_90 (the kernels using them trap there).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <pagedkv/error.hpp>

#include "../attention_params.hpp"
#include "../prefill_plan.hpp"
#include "check.cuh"

namespace pagedkv::kernels::cuda {

/// The tensor maps of a layer's K and V and the page rows a copy takes (0: no K/V maps, the kernel
/// copies K and V by cp.async), q's map with the tokens its box takes (0: no map, Q by cp.async)
/// and o's with the tokens of a computing warp's box (0: no map, O stored by each thread).
/// Passed by value as a __grid_constant__ kernel parameter.
struct prefill_tensor_maps {
  CUtensorMap k;
  CUtensorMap v;
  CUtensorMap q;
  CUtensorMap o;
  std::int32_t rows = 0;
  std::int32_t q_tokens = 0;
  std::int32_t o_tokens = 0;
};

namespace detail {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    PAGEDKV_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
      pagedkv::detail::fail(errc::invalid_argument, "prefill: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

/// A tensor map of one of K or V at base: dims (dim, token in block, kv head, block), box
/// (64, rows, 1, 1), 128-byte swizzle; rows out of the map's bounds (none in use) read as zeros.
inline CUtensorMap kv_tensor_map(const attention_params& p, const void* base, std::int32_t rows) {
  const std::size_t es = 2;
  const cuuint64_t dims[4] = {cuuint64_t(p.head_dim), cuuint64_t(p.table.block_size), cuuint64_t(p.num_kv_heads),
                              cuuint64_t(0x7fffffff)};
  const cuuint64_t strides[3] = {cuuint64_t(p.token_stride) * es, cuuint64_t(p.head_stride) * es,
                                 cuuint64_t(p.block_stride) * es};
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(
      &map, p.kv_dtype == dtype::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    pagedkv::detail::fail(errc::invalid_argument, "prefill: cuTensorMapEncodeTiled failed (", int(r),
                          ") for block_size ", p.table.block_size, " and strides ", p.token_stride, "/",
                          p.head_stride, "/", p.block_stride);
  return map;
}

/// The tensor map of q or o (base): dims (dim, query head, token), box (64, group, tokens),
/// 128-byte swizzle. A box is copied only where its tokens lie within its sequence's (so within q
/// and o).
inline CUtensorMap qo_tensor_map(const attention_params& p, const void* base, std::int32_t tokens) {
  const std::size_t es = 2;
  const cuuint64_t dims[3] = {cuuint64_t(p.head_dim), cuuint64_t(p.num_qo_heads), cuuint64_t(0x7fffffff)};
  const cuuint64_t strides[2] = {cuuint64_t(p.head_dim) * es, cuuint64_t(p.num_qo_heads) * p.head_dim * es};
  const cuuint32_t box[3] = {64, cuuint32_t(p.group_size()), cuuint32_t(tokens)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(
      &map, p.q_dtype == dtype::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    pagedkv::detail::fail(errc::invalid_argument, "prefill: cuTensorMapEncodeTiled failed (", int(r),
                          ") for q or o of ", p.num_qo_heads, " heads, a box of ", p.group_size(),
                          " heads and ", tokens, " tokens");
  return map;
}

/// The maps of p's K and V for tiles of tile_tokens tokens (kv: wanted; rows 0 where p does not fit
/// them), of q for tiles of q_rows packed rows (q_tokens 0 where the group does not fit them), and
/// of o for o_rows packed rows (o: wanted, as where the output goes to o and not to a split's
/// partials; o_tokens 0 where the group does not fit them).
inline prefill_tensor_maps make_prefill_tensor_maps(const attention_params& p, std::int32_t tile_tokens,
                                                    std::int32_t q_rows, std::int32_t o_rows, bool kv, bool o) {
  prefill_tensor_maps m{};
  m.rows = kv && p.k && p.v ? prefill_tma_page_rows(p.table.block_size, p.head_dim, p.kv_dtype, tile_tokens) : 0;
  if (m.rows > 0) {
    m.k = kv_tensor_map(p, p.k, m.rows);
    m.v = kv_tensor_map(p, p.v, m.rows);
  }
  m.q_tokens = p.q ? prefill_tma_q_tokens(p.group_size(), p.head_dim, p.q_dtype, q_rows) : 0;
  if (m.q_tokens > 0) m.q = qo_tensor_map(p, p.q, m.q_tokens);
  m.o_tokens = o && p.o ? prefill_tma_q_tokens(p.group_size(), p.head_dim, p.q_dtype, o_rows) : 0;
  if (m.o_tokens > 0) m.o = qo_tensor_map(p, p.o, m.o_tokens);
  return m;
}

}  // namespace detail

/// Initialises the mbarrier at smem_addr for one arrival a phase (one thread, before a barrier).
__device__ __forceinline__ void mbarrier_init(unsigned smem_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/// Initialises the mbarrier at smem_addr for `count` arrivals a phase (one thread, before a barrier).
__device__ __forceinline__ void mbarrier_init(unsigned smem_addr, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/// One arrival of this thread on the mbarrier's current phase.
__device__ __forceinline__ void mbarrier_arrive(unsigned smem_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr) : "memory");
#endif
}

/// One arrival on the mbarrier once this thread's earlier cp.async copies have landed, counted
/// among the arrivals the phase expects (.noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive(unsigned smem_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr) : "memory");
#endif
}

/// The phase's one arrival, expecting `bytes` of copies to complete on it.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned smem_addr, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr), "r"(bytes) : "memory");
#endif
}

/// Waits until the phase of parity `parity` of the mbarrier has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned smem_addr, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr),
      "r"(parity)
      : "memory");
#endif
}

/// Copies the box at (dim0, head, token) of the 3-D tensor map into shared memory at dst,
/// completing its bytes on the mbarrier at bar.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const CUtensorMap* map, int dim0, int head, int token,
                                            unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(dim0), "r"(head), "r"(token), "r"(bar)
      : "memory");
#endif
}

/// Stores the box at (dim0, head, token) of the 3-D tensor map from shared memory at src, in this
/// thread's bulk group.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, unsigned src, int dim0, int head, int token) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(dim0), "r"(head), "r"(token), "r"(src)
               : "memory");
#endif
}

/// Commits this thread's bulk stores as a group and waits until every group has read its shared
/// memory (their writes to global memory may still be in flight).
__device__ __forceinline__ void tma_store_commit_and_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

/// Copies the box at (dim0, token, head, block) of the tensor map into shared memory at dst,
/// completing its bytes on the mbarrier at bar.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const CUtensorMap* map, int dim0, int token, int head,
                                            int block, unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(dim0), "r"(token), "r"(head), "r"(block), "r"(bar)
      : "memory");
#endif
}

}  // namespace pagedkv::kernels::cuda
