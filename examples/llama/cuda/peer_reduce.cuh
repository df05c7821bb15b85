// The all-reduce of a row-parallel product fused with the residual add and RMSNorm after it, over
// NVLink peer access (issue 24): every rank pushes its partial product into every other rank's
// buffer (remote stores), then each sums the parts in its own memory and goes on as add_rmsnorm
// does, in one kernel, where NCCL's ring runs its own kernel (9-25 us at a decode step's sizes on
// two H100s) and the add and norm another. One process drives every GPU (tp_backend), so peer
// access is all the sharing it needs; the buffers never move, so CUDA graphs capture the kernel
// like any other.
//
// The handshake (vLLM's one-shot custom all-reduce does the same): each CTA b, once its rows are
// pushed, bumps its own counter and stores it, with release semantics at system scope, into its
// slot of every other rank's flag array, then spins (acquire) until every other rank's CTA b has
// stored the same count into its own: then the rows CTA b sums are all there. Each rank keeps two
// buffers, used in turn (O's product, then down's): a rank pushes into buffer k again only after
// passing the handshake of the reduce of the other buffer, which every rank starts after its
// reduce of buffer k has ended, so no rank still reads what is overwritten. The grid (the same on
// every rank) is at most as many CTAs as fit on a GPU at once, each taking rows b, b + grid, ...:
// every CTA is resident, so none waits for a peer CTA that cannot start. A spinning CTA gives up
// when the rank's abort flag (host memory, mapped) is set: the abort path must end a kernel that
// waits for a rank that failed (NCCL 2.28's symmetric kernels did not,
// docs/journal/tensor-parallel.md).
//
// The sum: each element's partial products added in f32 in rank order and rounded to bf16 once,
// which for two ranks is exactly NCCL's bf16 sum (one addition either way), then added to the f32
// residual stream as add_rmsnorm adds a delta.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/model_kernels.cuh"

namespace pagedkv::llama::cuda {

/// The most ranks a peer reduce sums.
inline constexpr int peer_reduce_max_ranks = 8;

/// What one rank's reduce kernel reads and writes besides the rows. Each rank's buffer (one of its
/// two) holds [ranks, slot] bf16: part j (slot elements from j * slot) is rank j's partial product,
/// the rank's own written there by its product, the others' pushed there by their reduce kernels.
struct peer_reduce_params {
  __nv_bfloat16* buffers[peer_reduce_max_ranks] = {};     ///< every rank's buffer (the same one of its two)
  std::uint32_t* peer_flags[peer_reduce_max_ranks] = {};  ///< every rank's flag array, [ctas, ranks]
  std::uint32_t* counters = nullptr;                      ///< this rank's, [ctas]
  const volatile int* abort = nullptr;                    ///< this rank's abort flag (mapped host memory)
  std::int64_t slot = 0;                                  ///< elements of a part: rows x dim
  int rank = 0, ranks = 1;
};

__device__ __forceinline__ void store_release_system(std::uint32_t* at, std::uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(at), "r"(v) : "memory");
}

__device__ __forceinline__ std::uint32_t load_acquire_system(const std::uint32_t* at) {
  std::uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
  return v;
}

/// The handshake of CTA blockIdx.x with the same CTA of every other rank (see the file comment);
/// false when the rank's abort flag ended the wait.
__device__ inline bool peer_handshake(const peer_reduce_params& p) {
  __shared__ int passed;
  if (threadIdx.x == 0) {
    const std::uint32_t count = p.counters[blockIdx.x] + 1;
    p.counters[blockIdx.x] = count;
    for (int k = 0; k < p.ranks; ++k)
      if (k != p.rank) store_release_system(p.peer_flags[k] + std::size_t(blockIdx.x) * p.ranks + p.rank, count);
    const std::uint32_t* mine = p.peer_flags[p.rank] + std::size_t(blockIdx.x) * p.ranks;
    int ok = 1;
    for (int k = 0; k < p.ranks && ok; ++k) {
      if (k == p.rank) continue;
      for (std::uint32_t spins = 0; std::int32_t(load_acquire_system(mine + k) - count) < 0; ++spins)
        if ((spins & 1023u) == 1023u && *p.abort) {
          ok = 0;
          break;
        }
    }
    passed = ok;
  }
  __syncthreads();
  return passed != 0;
}

/// Per row r (CTA blockIdx.x takes r = blockIdx.x, + gridDim.x, ...), with s = rows[r] (or r):
/// x[s] += the sum over ranks of their buffers' row s, then out[r] = x[s] / rms * gain in bf16;
/// add_rmsnorm_vec_kernel's work with the all-reduce in front. dim a multiple of 4 up to
/// 4 * Vec * row_threads.
template <int Vec>
__global__ void __launch_bounds__(row_threads) peer_reduce_add_rmsnorm_kernel(
    const peer_reduce_params p, __nv_bfloat16* __restrict__ out, float* __restrict__ x, const float* __restrict__ gain,
    const std::int32_t* __restrict__ rows, std::int64_t num_rows, std::int64_t dim, float eps) {
  const int groups = int(dim / 4);
  float4 w[Vec];
  load_row_groups(w, gain, groups);
  wait_for_the_grid_before();  // this rank's product: complete before it is pushed
  // Push: this CTA's rows of the rank's part into its part of every other rank's buffer (remote
  // stores, which NVLink posts; remote loads waited about a microsecond each, a pull version of
  // this kernel ran no faster than NCCL's all-reduce and the norm apart).
  const __nv_bfloat16* mine = p.buffers[p.rank] + p.rank * p.slot;
  for (std::int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const std::int64_t src = rows ? std::int64_t(rows[r]) : r;
    const auto* from = reinterpret_cast<const uint2*>(mine + src * dim);
    uint2 raw[Vec];
#pragma unroll
    for (int k = 0; k < Vec; ++k)
      if (threadIdx.x + k * row_threads < groups) raw[k] = from[threadIdx.x + k * row_threads];
    for (int j = 0; j < p.ranks; ++j) {
      if (j == p.rank) continue;
      auto* to = reinterpret_cast<uint2*>(p.buffers[j] + p.rank * p.slot + src * dim);
#pragma unroll
      for (int k = 0; k < Vec; ++k)
        if (threadIdx.x + k * row_threads < groups) to[threadIdx.x + k * row_threads] = raw[k];
    }
  }
  __syncthreads();  // every thread's stores before thread 0's release
  if (!peer_handshake(p)) return;
  let_dependents_launch();
  const __nv_bfloat16* all = p.buffers[p.rank];
  for (std::int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const std::int64_t src = rows ? std::int64_t(rows[r]) : r;
    auto* xr = reinterpret_cast<float4*>(x + src * dim);
    float4 v[Vec];
    float sum[Vec][4];
#pragma unroll
    for (int k = 0; k < Vec; ++k) {
      const int g = threadIdx.x + k * row_threads;
      if (g < groups) v[k] = xr[g];
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[k][e] = 0.0f;
    }
    for (int j = 0; j < p.ranks; ++j) {  // rank order: every rank adds alike
      const auto* dr = reinterpret_cast<const uint2*>(all + j * p.slot + src * dim);
      uint2 raw[Vec];
#pragma unroll
      for (int k = 0; k < Vec; ++k) {
        const int g = threadIdx.x + k * row_threads;
        if (g < groups) raw[k] = dr[g];
      }
#pragma unroll
      for (int k = 0; k < Vec; ++k) {
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[k].x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[k].y));
        sum[k][0] += lo.x, sum[k][1] += lo.y, sum[k][2] += hi.x, sum[k][3] += hi.y;
      }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < Vec; ++k) {
      const int g = threadIdx.x + k * row_threads;
      if (g >= groups) continue;
      // The sum rounded to bf16, as the all-reduce's result would be, then added in f32.
      v[k].x += __bfloat162float(__float2bfloat16(sum[k][0]));
      v[k].y += __bfloat162float(__float2bfloat16(sum[k][1]));
      v[k].z += __bfloat162float(__float2bfloat16(sum[k][2]));
      v[k].w += __bfloat162float(__float2bfloat16(sum[k][3]));
      xr[g] = v[k];
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    store_rmsnorm_row(out + r * dim, v, w, ss, dim, eps);
  }
}

/// Whether peer_reduce_add_rmsnorm takes rows of dim elements.
inline bool peer_reduce_fits(std::int64_t dim) { return dim % 4 == 0 && (dim / 4 + row_threads - 1) / row_threads <= 8; }

/// The kernel instantiation for dim (peer_reduce_fits).
inline auto peer_reduce_kernel_for(std::int64_t dim) {
  const std::int64_t per_thread = (dim / 4 + row_threads - 1) / row_threads;
  return per_thread <= 1 ? &peer_reduce_add_rmsnorm_kernel<1>
         : per_thread <= 2 ? &peer_reduce_add_rmsnorm_kernel<2>
         : per_thread <= 4 ? &peer_reduce_add_rmsnorm_kernel<4>
                           : &peer_reduce_add_rmsnorm_kernel<8>;
}

/// Launches the reduce over num_rows rows on at most max_ctas CTAs (the flag arrays' length, every
/// one resident at once), a programmatic dependent of the grid before where `dependent`.
inline void peer_reduce_add_rmsnorm(const peer_reduce_params& p, int max_ctas, __nv_bfloat16* out, float* x,
                                    const float* gain, const std::int32_t* rows, std::int64_t num_rows,
                                    std::int64_t dim, float eps, bool dependent, cudaStream_t stream) {
  const dim3 grid{unsigned(std::min<std::int64_t>(num_rows, max_ctas))};
  launch_model_kernel(dependent, peer_reduce_kernel_for(dim), grid, dim3(row_threads), stream, p, out, x, gain, rows,
                      num_rows, dim, eps);
}

}  // namespace pagedkv::llama::cuda
