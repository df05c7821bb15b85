// Decode for GQA groups of 3 to 16 query heads over 16-bit or fp8 KV, on tensor cores. The CUDA-core
// body (decode.cuh) computes group * head_dim FMAs per KV element pair; at group 4 and beyond
// that made it arithmetic-bound on the H100 (about 50% of the read ceiling). Here the group's
// heads are the 16 rows of mma.sync m16n8k16: QK^T with q fragments held in registers and K
// fragments read straight from the cp.async tiles, PV with the probabilities as the A operand
// (rounded to the KV type, as flash attention does) and V through ldmatrix.trans. Same pipeline,
// split-K, merge and graph safety as decode.cuh. fp8 e4m3 KV is widened to q's 16-bit type
// (exactly: e4m3 values are representable in both) as the fragments are formed.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cub/cub.cuh>
#include <cuda/functional>

#include "../attention_params.hpp"
#include "check.cuh"
#include "cp_async.cuh"
#include "decode.cuh"
#include "decode_tuning.cuh"
#include "mma.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

/// What both tensor-core bodies' shared-memory maps have: the pipeline's K/V tiles and q.
template <class T, class TKV, int D>
struct decode_mma_tiles {
  using policy = decode_mma_policy<TKV, D>;
  static constexpr int threads = policy::threads;
  static constexpr int warps = threads / 32;
  static constexpr int tile = policy::tile_tokens;
  static constexpr int stages = policy::stages;
  static constexpr int vec = vec16<TKV>;
  static constexpr int pitch = D + vec;   // 16 bytes of padding: conflict-free fragments
  static constexpr int q_pitch = D + 8;
  static constexpr int heads = 16;        // the mma's M
  static constexpr int octets = D / 8;    // PV output columns, 8 a mma
  static_assert(D % 16 == 0 && tile % 16 == 0, "mma tiles");
  static constexpr std::size_t kv_bytes = std::size_t(2) * stages * tile * pitch * sizeof(TKV);
  static constexpr std::size_t q_bytes = std::size_t(heads) * q_pitch * sizeof(T);
};

/// Shared-memory map of the CTA-synchronised body (head_dim 256): scores and softmax state shared.
template <class T, class TKV, int D>
struct decode_mma_smem : decode_mma_tiles<T, TKV, D> {
  using base = decode_mma_tiles<T, TKV, D>;
  static constexpr int score_pitch = base::heads + 4;  // conflict-free C stores and A loads
  static constexpr int octets_per_warp = (base::octets + base::warps - 1) / base::warps;
  static constexpr std::size_t score_bytes = std::size_t(base::tile) * score_pitch * sizeof(float);
  static constexpr std::size_t state_bytes = std::size_t(3) * base::heads * sizeof(float);
  static constexpr std::size_t bytes = base::kv_bytes + base::q_bytes + score_bytes + state_bytes;
};

/// Two adjacent KV elements as a packed pair of T (the mma operand type).
template <class T, class TKV>
__device__ __forceinline__ std::uint32_t kv_pair(const TKV* p) {
  if constexpr (sizeof(TKV) == 2) {
    return *reinterpret_cast<const std::uint32_t*>(p);
  } else {
    return fp8x2_to<T>(*reinterpret_cast<const std::uint16_t*>(p));
  }
}

/// q of the unit's group as stored (exact) into 16 shared rows, zeros past the group; the logit
/// scale is applied to the fp32 products instead, so q is not rounded twice.
template <class T, int D, int QPitch>
__device__ __forceinline__ void stage_q_rows(const attention_params& p, const decode_unit& u, T* q_s) {
  const auto* q_g = static_cast<const T*>(p.q);
  for (int i = int(threadIdx.x); i < 16 * D; i += int(blockDim.x)) {
    const int g = i / D, d = i % D;
    q_s[g * QPitch + d] = g < u.group ? q_g[(u.q_row + g) * D + d] : from_float<T>(0.0f);
  }
}

template <class T, class TKV, int D>
__global__ void __launch_bounds__(decode_mma_policy<TKV, D>::threads)
    decode_mma_kernel(const attention_params p, const decode_plan plan, float* part_o, float* part_lse) {
  using smem_t = decode_mma_smem<T, TKV, D>;
  constexpr int threads = smem_t::threads, warps = smem_t::warps, tile = smem_t::tile, stages = smem_t::stages;
  constexpr int pitch = smem_t::pitch;
  constexpr int heads = smem_t::heads, sp = smem_t::score_pitch, q_pitch = smem_t::q_pitch;
  constexpr int octets = smem_t::octets, opw = smem_t::octets_per_warp;
  constexpr int ksteps = D / 16;

  extern __shared__ __align__(16) unsigned char smem[];
  TKV* k_s = reinterpret_cast<TKV*>(smem);
  TKV* v_s = k_s + stages * tile * pitch;
  T* q_s = reinterpret_cast<T*>(smem + smem_t::kv_bytes);
  float* score_s = reinterpret_cast<float*>(smem + smem_t::kv_bytes + smem_t::q_bytes);
  float* m_s = score_s + tile * sp;
  float* l_s = m_s + heads;
  float* alpha_s = l_s + heads;
  using warp_reduce = cub::WarpReduce<float>;
  __shared__ typename warp_reduce::TempStorage reduce_storage[warps];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // the mma fragment coordinates of this lane
  const decode_unit u = decode_unit_of(p, plan);
  const int kv_head = u.kv_head, group = u.group, begin = u.begin, end = u.end;
  const std::int64_t q_row = u.q_row;

  if (begin >= end) {  // nothing to attend to in this split
    write_empty_unit<D>(p, plan, u, part_o, part_lse);
    return;
  }

  const int num_tiles = (end - begin + tile - 1) / tile;
  const auto issue_tile = [&](int t) {
    issue_kv_rows<TKV, D, pitch, tile, threads>(p, u, k_s, v_s, begin + t * tile, (t % stages) * tile, tid);
  };
#pragma unroll
  for (int t = 0; t < stages - 1; ++t) {
    if (t < num_tiles) issue_tile(t);
    cp_async_commit();
  }
  let_dependents_launch();

  stage_q_rows<T, D, q_pitch>(p, u, q_s);
  if (tid < heads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    alpha_s[tid] = 1.0f;
  }
  __syncthreads();
  std::uint32_t q_frag[ksteps][4];
#pragma unroll
  for (int ks = 0; ks < ksteps; ++ks) {
    const int col = ks * 16 + tig * 2;
    q_frag[ks][0] = *reinterpret_cast<const std::uint32_t*>(q_s + gid * q_pitch + col);
    q_frag[ks][1] = *reinterpret_cast<const std::uint32_t*>(q_s + (gid + 8) * q_pitch + col);
    q_frag[ks][2] = *reinterpret_cast<const std::uint32_t*>(q_s + gid * q_pitch + col + 8);
    q_frag[ks][3] = *reinterpret_cast<const std::uint32_t*>(q_s + (gid + 8) * q_pitch + col + 8);
  }
  const float logit_scale = p.sm_scale * p.k_scale_of(kv_head) * (p.logit_soft_cap > 0.0f ? 1.0f : log2e);

  float acc[opw][4];
#pragma unroll
  for (int o = 0; o < opw; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[o][e] = 0.0f;

  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<stages - 2>();
    __syncthreads();
    if (t + stages - 1 < num_tiles) issue_tile(t + stages - 1);
    cp_async_commit();
    const TKV* k_tile = k_s + (t % stages) * tile * pitch;
    const TKV* v_tile = v_s + (t % stages) * tile * pitch;
    const int valid_rows = end - (begin + t * tile);

    // QK^T: each warp 8 tokens at a time, all 16 heads.
    for (int oct = warp; oct < tile / 8; oct += warps) {
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const TKV* k_row = k_tile + (oct * 8 + gid) * pitch + tig * 2;
#pragma unroll
      for (int ks = 0; ks < ksteps; ++ks) {
        const std::uint32_t b0 = kv_pair<T>(k_row + ks * 16);
        const std::uint32_t b1 = kv_pair<T>(k_row + ks * 16 + 8);
        mma_16816<T>(c, q_frag[ks], b0, b1);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int g = gid + (e >= 2 ? 8 : 0);
        const int r = oct * 8 + tig * 2 + (e & 1);
        float s = c[e] * logit_scale;
        if (p.logit_soft_cap > 0.0f) s = p.logit_soft_cap * tanhf(s / p.logit_soft_cap) * log2e;
        score_s[r * sp + g] = g >= group ? 0.0f : r < valid_rows ? s : -INFINITY;
      }
    }
    __syncthreads();

    for (int g = warp; g < group; g += warps) {
      float tile_max = -INFINITY;
      for (int r = lane; r < tile; r += 32) tile_max = fmaxf(tile_max, score_s[r * sp + g]);
      tile_max = warp_reduce(reduce_storage[warp]).Reduce(tile_max, ::cuda::maximum<float>{});
      tile_max = __shfl_sync(0xffffffffu, tile_max, 0);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int r = lane; r < tile; r += 32) {
        const float s = score_s[r * sp + g];
        const float prob = s == -INFINITY ? 0.0f : exp2f(s - m_new);
        score_s[r * sp + g] = prob;
        sum += prob;
      }
      __syncwarp();
      sum = warp_reduce(reduce_storage[warp]).Sum(sum);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : exp2f(m_old - m_new);
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
      __syncwarp();
    }
    __syncthreads();

    // PV: each warp its octets of head_dim, all 16 heads, every token of the tile.
    const float alpha_lo = alpha_s[gid], alpha_hi = alpha_s[gid + 8];
#pragma unroll
    for (int o = 0; o < opw; ++o) {
      acc[o][0] *= alpha_lo; acc[o][1] *= alpha_lo;
      acc[o][2] *= alpha_hi; acc[o][3] *= alpha_hi;
    }
#pragma unroll 2
    for (int ks = 0; ks < tile / 16; ++ks) {
      const int r = ks * 16 + tig * 2;
      std::uint32_t a[4];
      a[0] = pack2<T>(score_s[r * sp + gid], score_s[(r + 1) * sp + gid]);
      a[1] = pack2<T>(score_s[r * sp + gid + 8], score_s[(r + 1) * sp + gid + 8]);
      a[2] = pack2<T>(score_s[(r + 8) * sp + gid], score_s[(r + 9) * sp + gid]);
      a[3] = pack2<T>(score_s[(r + 8) * sp + gid + 8], score_s[(r + 9) * sp + gid + 8]);
#pragma unroll
      for (int o = 0; o < opw; ++o) {
        const int oct = warp + o * warps;
        if (oct < octets) {
          std::uint32_t b0, b1;
          if constexpr (sizeof(TKV) == 2) {
            ldmatrix_x2_trans(b0, b1, v_tile + (ks * 16 + (lane & 15)) * pitch + oct * 8);
          } else {  // fp8: gather the column pairs bytewise, then widen
            const auto* v8 = reinterpret_cast<const std::uint8_t*>(v_tile) + oct * 8 + gid;
            b0 = fp8x2_to<T>(std::uint16_t(v8[r * pitch] | (v8[(r + 1) * pitch] << 8)));
            b1 = fp8x2_to<T>(std::uint16_t(v8[(r + 8) * pitch] | (v8[(r + 9) * pitch] << 8)));
          }
          mma_16816<T>(acc[o], a, b0, b1);
        }
      }
    }
  }
  cp_async_wait<0>();

  const float v_scale = p.v_scale_of(kv_head);
#pragma unroll
  for (int o = 0; o < opw; ++o) {
    const int oct = warp + o * warps;
    if (oct >= octets) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int g = gid + (e >= 2 ? 8 : 0);
      const int d = oct * 8 + tig * 2 + (e & 1);
      if (g >= group) continue;
      const float l = l_s[g];
      const float out = l > 0.0f ? acc[o][e] / l * v_scale : 0.0f;
      if (plan.num_splits == 1) {
        store_out(p.q_dtype, p.o, (q_row + g) * D + d, out);
      } else {
        part_o[u.partial_row(p, g) * D + d] = out;
      }
    }
  }
  for (int g = tid; g < group; g += threads) {
    const float l = l_s[g];
    const float lse2 = l > 0.0f ? m_s[g] + log2f(l) : -INFINITY;
    if (plan.num_splits == 1) {
      if (p.lse) p.lse[q_row + g] = lse2 * ln2;
    } else {
      part_lse[u.partial_row(p, g)] = lse2;
    }
  }
}

/// Shared-memory map of the per-warp tensor-core body: warp w owns token octet w of every tile.
template <class T, class TKV, int D>
struct decode_mma_warp_smem : decode_mma_tiles<T, TKV, D> {
  using base = decode_mma_tiles<T, TKV, D>;
  static_assert(base::tile == 8 * base::warps, "each warp owns one octet of tokens a tile");
  /// After the last tile: every warp's (m, l) and accumulators, merged across warps.
  static constexpr std::size_t reduce_bytes = std::size_t(base::warps) * base::heads * (D + 2) * sizeof(float);
  static constexpr std::size_t kv_region = base::kv_bytes > reduce_bytes ? base::kv_bytes : reduce_bytes;
  static constexpr std::size_t bytes = kv_region + base::q_bytes;
};

/// The tensor-core body with per-warp ownership (head_dim <= 128): warp w copies token octet w of
/// every tile, computes its 16 x 8 logits with m16n8k16 (q fragments in registers), keeps the
/// online-softmax state of its rows in registers (a quad of lanes per head row), and multiplies
/// the probabilities, still in the accumulator's registers, by V with m16n8k8 (the accumulator
/// layout is the A fragment's). Warps meet once, after the last tile, to merge their states.
template <class T, class TKV, int D>
__global__ void __launch_bounds__(decode_mma_policy<TKV, D>::threads)
    decode_mma_warp_kernel(const attention_params p, const decode_plan plan, float* part_o, float* part_lse) {
  using smem_t = decode_mma_warp_smem<T, TKV, D>;
  constexpr int warps = smem_t::warps, tile = smem_t::tile, stages = smem_t::stages;
  constexpr int pitch = smem_t::pitch;
  constexpr int heads = smem_t::heads, q_pitch = smem_t::q_pitch, octets = smem_t::octets;
  constexpr int ksteps = D / 16;

  extern __shared__ __align__(16) unsigned char smem[];
  TKV* k_s = reinterpret_cast<TKV*>(smem);
  TKV* v_s = k_s + stages * tile * pitch;
  T* q_s = reinterpret_cast<T*>(smem + smem_t::kv_region);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // the mma fragment coordinates of this lane
  const decode_unit u = decode_unit_of(p, plan);
  const int kv_head = u.kv_head, group = u.group, begin = u.begin, end = u.end;

  if (begin >= end) {  // nothing to attend to in this split
    write_empty_unit<D>(p, plan, u, part_o, part_lse);
    return;
  }

  const int num_tiles = (end - begin + tile - 1) / tile;
  const int row0 = warp * 8;  // this warp's first row in a tile
  const auto issue_tile = [&](int t) {
    issue_kv_rows<TKV, D, pitch, 8, 32>(p, u, k_s, v_s, begin + t * tile + row0, (t % stages) * tile + row0, lane);
  };
#pragma unroll
  for (int t = 0; t < stages - 1; ++t) {
    if (t < num_tiles) issue_tile(t);
    cp_async_commit();
  }
  let_dependents_launch();

  stage_q_rows<T, D, q_pitch>(p, u, q_s);
  __syncthreads();  // q is read by every warp; the only barrier before the merge
  // q's A fragments: held in registers up to head_dim 96; at 128 they and the 64 accumulators
  // would not leave room for two CTAs an SM, so they are re-read from shared memory each tile.
  constexpr bool q_in_registers = D <= 96;
  const auto q_fragment = [&](int ks, std::uint32_t* f) {
    const int col = ks * 16 + tig * 2;
    f[0] = *reinterpret_cast<const std::uint32_t*>(q_s + gid * q_pitch + col);
    f[1] = *reinterpret_cast<const std::uint32_t*>(q_s + (gid + 8) * q_pitch + col);
    f[2] = *reinterpret_cast<const std::uint32_t*>(q_s + gid * q_pitch + col + 8);
    f[3] = *reinterpret_cast<const std::uint32_t*>(q_s + (gid + 8) * q_pitch + col + 8);
  };
  std::uint32_t q_frag[q_in_registers ? ksteps : 1][4];
  if constexpr (q_in_registers)
#pragma unroll
    for (int ks = 0; ks < ksteps; ++ks) q_fragment(ks, q_frag[ks]);
  const float logit_scale = p.sm_scale * p.k_scale_of(kv_head) * (p.logit_soft_cap > 0.0f ? 1.0f : log2e);

  // Softmax state of head rows gid (lo) and gid + 8 (hi), the same in the quad's four lanes.
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  float acc[octets][4];
#pragma unroll
  for (int o = 0; o < octets; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[o][e] = 0.0f;

  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<stages - 2>();
    __syncwarp();  // this warp's rows of tile t landed; its stage (t - 1) % stages is free again
    if (t + stages - 1 < num_tiles) issue_tile(t + stages - 1);
    cp_async_commit();
    const TKV* k_rows = k_s + ((t % stages) * tile + row0) * pitch;
    const TKV* v_rows = v_s + ((t % stages) * tile + row0) * pitch;
    const int valid_rows = end - (begin + t * tile + row0);  // of this warp's 8

    // QK^T: 16 heads x this warp's 8 tokens. c[0..1]: head gid, tokens 2 tig, 2 tig + 1;
    // c[2..3]: head gid + 8, the same tokens.
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const TKV* k_row = k_rows + gid * pitch + tig * 2;
#pragma unroll
    for (int ks = 0; ks < ksteps; ++ks) {
      std::uint32_t f[4];
      if constexpr (!q_in_registers) q_fragment(ks, f);
      mma_16816<T>(c, q_in_registers ? q_frag[ks] : f, kv_pair<T>(k_row + ks * 16), kv_pair<T>(k_row + ks * 16 + 8));
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float s = c[e] * logit_scale;
      if (p.logit_soft_cap > 0.0f) s = p.logit_soft_cap * tanhf(s / p.logit_soft_cap) * log2e;
      const int g = gid + (e >= 2 ? 8 : 0);
      c[e] = g >= group ? 0.0f : tig * 2 + (e & 1) < valid_rows ? s : -INFINITY;
    }

    // Online softmax of each head row over the warp's 8 tokens (the quad holds them, 2 a lane).
    const auto update = [&](float& s0, float& s1, float& m, float& l) {
      float mx = fmaxf(s0, s1);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m, mx);
      s0 = s0 == -INFINITY ? 0.0f : exp2f(s0 - m_new);
      s1 = s1 == -INFINITY ? 0.0f : exp2f(s1 - m_new);
      float sum = s0 + s1;
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float alpha = m == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : exp2f(m - m_new);
      l = l * alpha + sum;
      m = m_new;
      return alpha;
    };
    const float alpha_lo = update(c[0], c[1], m_lo, l_lo);
    const float alpha_hi = update(c[2], c[3], m_hi, l_hi);
    const std::uint32_t a_lo = pack2<T>(c[0], c[1]), a_hi = pack2<T>(c[2], c[3]);

    // PV: every octet of head_dim, over the warp's 8 tokens; B[k = token][n = dim].
#pragma unroll
    for (int o = 0; o < octets; ++o) {
      acc[o][0] *= alpha_lo; acc[o][1] *= alpha_lo;
      acc[o][2] *= alpha_hi; acc[o][3] *= alpha_hi;
    }
    if constexpr (sizeof(TKV) == 2) {
#pragma unroll
      for (int o = 0; o < octets; o += 4) {
        std::uint32_t b[4] = {0u, 0u, 0u, 0u};
        if (o + 4 <= octets) {
          ldmatrix_x4_trans(b, v_rows + (lane & 7) * pitch + (o + lane / 8) * 8);
        } else {  // head_dim 80: the last two octets
          ldmatrix_x2_trans(b[0], b[1], v_rows + (lane & 7) * pitch + (o + (lane / 8) % 2) * 8);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (o + j < octets) mma_1688<T>(acc[o + j], a_lo, a_hi, b[j]);
      }
    } else {  // fp8: gather the column pairs bytewise, then widen
      const auto* v8 = reinterpret_cast<const std::uint8_t*>(v_rows) + tig * 2 * pitch + gid;
#pragma unroll
      for (int o = 0; o < octets; ++o)
        mma_1688<T>(acc[o], a_lo, a_hi, fp8x2_to<T>(std::uint16_t(v8[o * 8] | (v8[pitch + o * 8] << 8))));
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its tiles: the KV region becomes the merge buffer

  // Merge the warps: o = sum_w 2^(m_w - M) acc_w / sum_w 2^(m_w - M) l_w.
  float* acc_s = reinterpret_cast<float*>(smem);  // [warps, heads, D]
  float* ml_s = acc_s + warps * heads * D;          // [warps, heads, 2]
#pragma unroll
  for (int o = 0; o < octets; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc_s[(warp * heads + gid + (e >= 2 ? 8 : 0)) * D + o * 8 + tig * 2 + (e & 1)] = acc[o][e];
  if (tig == 0) {
    ml_s[(warp * heads + gid) * 2] = m_lo;
    ml_s[(warp * heads + gid) * 2 + 1] = l_lo;
    ml_s[(warp * heads + gid + 8) * 2] = m_hi;
    ml_s[(warp * heads + gid + 8) * 2 + 1] = l_hi;
  }
  __syncthreads();

  merge_warps_and_store<D, heads, warps>(p, plan, u, acc_s, ml_s, part_o, part_lse);
}

}  // namespace detail

/// Plans and launches the tensor-core decode: q of 16-bit type T, KV of T or fp8, group <= 16.
template <class T, class TKV, int D>
decode_plan launch_decode_mma(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream, bool launch) {
  // head_dim 256 keeps the CTA-shared body: one warp's accumulators for 16 heads x 256 dims
  // would not fit its registers.
  constexpr bool per_warp = D <= 128 && decode_mma_policy<TKV, D>::tile_tokens == 8 * (decode_mma_policy<TKV, D>::threads / 32);
  using smem_t = std::conditional_t<per_warp, detail::decode_mma_warp_smem<T, TKV, D>, detail::decode_mma_smem<T, TKV, D>>;
  using policy = decode_mma_policy<TKV, D>;
  const auto kernel = [] {
    if constexpr (per_warp) return detail::decode_mma_warp_kernel<T, TKV, D>;
    else return detail::decode_mma_kernel<T, TKV, D>;
  }();
  const detail::launch_facts& f = detail::facts_of<smem_t>(kernel, policy::threads, smem_t::bytes);
  const decode_plan plan = plan_decode(p, f.num_sms, f.ctas_per_sm, policy::tile_tokens, policy::min_chunk_tokens);
  if (!launch || p.num_seqs == 0) return plan;
  detail::launch_with_merge<D>(kernel, p, plan, policy::threads, smem_t::bytes, workspace, workspace_bytes, stream);
  return plan;
}

}  // namespace pagedkv::kernels::cuda
