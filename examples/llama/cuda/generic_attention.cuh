// A plain CUDA paged attention for any query length and any head_dim up to 256: the CUDA
// backend's prefill path until kernels/pagedkv has a paged prefill kernel (issue 21), and its
// whole attention for head dims the decode kernel does not compile (the tiny test models).
// Correct, not fast: one CTA a (query token, query head), its warps taking every fourth key with
// an online softmax each, merged at the end. Same semantics as kernels::reference::attention
// (causal, the sequence's cached tokens first, a sliding window where window_left >= 0, whose
// table entries before the window may be null_block and are never read), without soft-cap or
// ALiBi.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <pagedkv/attention_params.hpp>

namespace pagedkv::llama::cuda {

inline constexpr int generic_attention_warps = 4;
inline constexpr int generic_attention_max_head_dim = 256;

__device__ inline float load_kv(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load_kv(const __nv_fp8_e4m3* p) { return float(*p); }

/// o[t, h] for every query token t = first_token + blockIdx.x and query head h = blockIdx.y.
/// seq_of_token[t]: the sequence of token t. q and o rows are q_pitch and o_pitch elements apart.
template <class TKV>
__global__ void generic_attention_kernel(kernels::attention_params p, const std::int32_t* seq_of_token,
                                         std::int64_t q_pitch, std::int64_t o_pitch, int first_token) {
  constexpr int per_lane = generic_attention_max_head_dim / 32;
  const int t = first_token + blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = seq_of_token[t];
  const int kv_len = p.kv_len(seq);
  const int pos = kv_len - p.q_len(seq) + (t - p.q_begin(seq));  // the query's own position
  const int kv_head = h / p.group_size(), d = p.head_dim;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + std::int64_t(t) * q_pitch + std::int64_t(h) * d;
  const auto* k = static_cast<const TKV*>(p.k);
  const auto* v = static_cast<const TKV*>(p.v);
  const float k_scale = p.k_scale_of(kv_head), v_scale = p.v_scale_of(kv_head);

  float qr[per_lane], acc[per_lane];
  for (int e = 0; e < per_lane; ++e) {
    const int i = lane + 32 * e;
    qr[e] = i < d ? __bfloat162float(q[i]) * p.sm_scale * k_scale : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int first = p.window_left >= 0 ? max(0, pos - p.window_left) : 0;  // a warp may get no key: l stays 0
  for (int j = first + warp; j <= pos; j += generic_attention_warps) {
    const std::int64_t off = p.kv_offset(p.table.block(seq, j / p.table.block_size), j % p.table.block_size, kv_head);
    float s = 0.0f;
    for (int e = 0; e < per_lane; ++e) {
      const int i = lane + 32 * e;
      if (i < d) s += qr[e] * load_kv(k + off + i);
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float m_new = fmaxf(m, s);
    const float correction = __expf(m - m_new), w = __expf(s - m_new);
    l = l * correction + w;
    for (int e = 0; e < per_lane; ++e) {
      const int i = lane + 32 * e;
      acc[e] = acc[e] * correction + (i < d ? w * load_kv(v + off + i) : 0.0f);
    }
    m = m_new;
  }

  __shared__ float warp_m[generic_attention_warps], warp_l[generic_attention_warps];
  __shared__ float warp_acc[generic_attention_warps][generic_attention_max_head_dim];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  for (int e = 0; e < per_lane; ++e) warp_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
  float m_all = -INFINITY;
  for (int w = 0; w < generic_attention_warps; ++w) m_all = fmaxf(m_all, warp_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < generic_attention_warps; ++w)
    if (warp_l[w] > 0.0f) l_all += warp_l[w] * __expf(warp_m[w] - m_all);
  auto* o = static_cast<__nv_bfloat16*>(p.o) + std::int64_t(t) * o_pitch + std::int64_t(h) * d;
  for (int e = 0; e < per_lane; ++e) {
    const int i = lane + 32 * e;
    if (i >= d) continue;
    float sum = 0.0f;
    for (int w = 0; w < generic_attention_warps; ++w)
      if (warp_l[w] > 0.0f) sum += warp_acc[w][i] * __expf(warp_m[w] - m_all);
    o[i] = __float2bfloat16(sum / l_all * v_scale);
  }
}

}  // namespace pagedkv::llama::cuda
