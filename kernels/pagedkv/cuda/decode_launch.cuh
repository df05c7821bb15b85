// The launch of a decode body: per-device launch facts, the shared-memory limit, the decode grid
// over (sequence x KV heads, split) and, with several splits, the merge kernel that combines them.
//
// Graph safety: the grid depends only on host values (num_seqs, num_kv_heads, max_kv_len, the
// SM count); lengths and tables are read on the device. A graph captured with a capacity
// max_kv_len stays valid while sequences grow below it.
#pragma once

#include <cmath>
#include <cstdint>

#include <cub/cub.cuh>
#include <cuda/functional>

#include <pagedkv/error.hpp>

#include "../attention_params.hpp"
#include "../decode_plan.hpp"
#include "check.cuh"
#include "decode_common.cuh"
#include "dependent_launch.cuh"
#include "launch_facts.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

template <int D>
__global__ void __launch_bounds__(128)
    merge_splits_kernel(const attention_params p, const decode_plan plan, const float* part_o, const float* part_lse) {
  using block_reduce = cub::BlockReduce<float, 128>;
  __shared__ typename block_reduce::TempStorage storage;
  __shared__ float shared_max, shared_sum;
  __shared__ float weight_s[max_decode_splits];
  wait_for_the_grid_before();  // the decode's partial rows
  let_dependents_launch();     // the next decode may start waiting beside this merge
  const int seq = blockIdx.x / p.num_qo_heads;
  const int head = blockIdx.x % p.num_qo_heads;
  const std::int64_t stride = std::int64_t(p.num_seqs) * p.num_qo_heads;
  const std::int64_t row0 = std::int64_t(seq) * p.num_qo_heads + head;
  float local_max = -INFINITY;
  for (int s = threadIdx.x; s < plan.num_splits; s += 128) local_max = fmaxf(local_max, part_lse[s * stride + row0]);
  const float max_all = block_reduce(storage).Reduce(local_max, ::cuda::maximum<float>{});
  if (threadIdx.x == 0) shared_max = max_all;
  __syncthreads();
  const float m = shared_max;
  float local_sum = 0.0f;
  for (int s = threadIdx.x; s < plan.num_splits; s += 128) {
    const float lse = part_lse[s * stride + row0];
    const float w = lse == -INFINITY ? 0.0f : exp2f(lse - m);
    weight_s[s] = w;
    local_sum += w;
  }
  const float sum_all = block_reduce(storage).Sum(local_sum);
  if (threadIdx.x == 0) shared_sum = sum_all;
  __syncthreads();
  const float sum = shared_sum;
  const std::int64_t out_row = std::int64_t(p.q_begin(seq)) * p.num_qo_heads + head;
  for (int d = threadIdx.x; d < D; d += 128) {
    // No branch: empty splits wrote zeros, so the loads can all be in flight at once.
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < plan.num_splits; ++s) acc += weight_s[s] * part_o[(s * stride + row0) * D + d];
    store_out(p.q_dtype, p.o, out_row * D + d, sum > 0.0f ? acc / sum : 0.0f);
  }
  if (p.lse && threadIdx.x == 0) p.lse[out_row] = sum > 0.0f ? (m + log2f(sum)) * ln2 : -INFINITY;
}

/// Launches a decode kernel over (sequence x KV head, split) and, with several splits, the merge.
template <int D, class Kernel>
void launch_with_merge(Kernel kernel, const attention_params& p, const decode_plan& plan, int threads,
                       std::size_t smem_bytes, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < plan.workspace_bytes)
    pagedkv::detail::fail(errc::buffer_too_small, "decode workspace of ", workspace_bytes, " bytes, ",
                          plan.workspace_bytes, " needed");
  float* part_o = static_cast<float*>(workspace);
  float* part_lse = part_o + std::size_t(plan.num_splits) * p.num_seqs * p.num_qo_heads * D;
  const dim3 grid(unsigned(p.num_seqs * plan.units_per_seq(p)), unsigned(plan.num_splits));
  launch_dependent(kernel, grid, threads, smem_bytes, stream, p, plan, part_o, part_lse);
  if (plan.num_splits > 1) {
    const float* const_part_o = part_o;
    const float* const_part_lse = part_lse;
    launch_dependent(merge_splits_kernel<D>, dim3(unsigned(p.num_seqs * p.num_qo_heads)), 128, 0, stream, p, plan,
                     const_part_o, const_part_lse);
  }
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
