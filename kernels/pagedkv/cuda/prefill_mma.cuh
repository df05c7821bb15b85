// Paged prefill on tensor cores: FlashAttention-2's scheme on mma.sync m16n8k16. A CTA computes
// one query tile of one sequence for one KV head (and one KV split): its rows are the (query
// token, query head of the group) pairs of the tile, row r of the sequence being token r / group
// and head r % group, so that a GQA group shares every K/V tile it loads and a decode token (one
// row a head) still fills group rows of the m-tile. Each warp owns Policy::m_tiles m-tiles of 16
// rows: S = Q K^T (Q fragments by ldmatrix, kept in registers where they fit, K^T by ldmatrix
// from the row-major K tile, each K fragment feeding every m-tile of the warp), an online softmax
// in fp32 per row in log2 units with the logit scale folded into the exponent's FFMA, O += P V
// (P from S's accumulators rounded to the 16-bit type, as the A operand; V by ldmatrix.trans).
// The causal mask is applied only on tiles that reach past a row's position; soft-cap and ALiBi
// take a separate pass only when set. K/V tiles come through the block table in a two-stage
// cp.async pipeline whose block-table reads for tile t + 2 are in flight during tile t's math;
// fp8 e4m3 KV lands in a byte staging tile and is widened exactly to q's 16-bit type before the
// math, so one body of fragment code serves both.
#pragma once

#include <cstdint>

#include "../attention_params.hpp"
#include "../prefill_plan.hpp"
#include "../prefill_tuning.hpp"
#include "cp_async.cuh"
#include "dependent_launch.cuh"
#include "mma.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

inline constexpr float prefill_log2e = 1.4426950408889634f;
inline constexpr float prefill_ln2 = 0.6931471805599453f;

/// Shared rows of D 16-bit elements: 16-byte chunk c of row r. Rows of whole 128-byte segments
/// (D 64, 128, 256) XOR the chunk with r % 8, rows of 160 and 192 bytes are padded by one chunk:
/// both make the 8 row addresses of an ldmatrix fall in 8 distinct bank groups.
template <int D>
struct prefill_rows {
  static constexpr int chunks = D / 8;
  static constexpr bool swizzled = (D * 2) % 128 == 0;
  static constexpr int pitch = swizzled ? D : D + 8;
  __device__ __forceinline__ static int at(int row, int chunk) {
    return row * pitch + (swizzled ? chunk ^ (row & 7) : chunk) * 8;
  }
};

/// Shared-memory map: the query tile (reused for the output rows), K and V tiles of 16-bit
/// elements (a stage each, or one where fp8 is staged), the fp8 byte staging stages, and each
/// stage's row offsets into the pool (-1: past the range, zero-filled).
template <class T, class TKV, int D, class Policy>
struct prefill_smem {
  using rows = prefill_rows<D>;
  static constexpr bool staged = sizeof(TKV) == 1;
  static constexpr int tile16 = Policy::kv_tokens * rows::pitch;  // elements of one K or V tile
  static constexpr int tiles16 = staged ? 1 : Policy::stages;
  static constexpr int tile8 = Policy::kv_tokens * D;             // bytes of one staged fp8 tile
  static constexpr std::size_t q_bytes = std::size_t(Policy::q_rows) * rows::pitch * 2;
  static constexpr std::size_t k_offset = q_bytes;
  static constexpr std::size_t v_offset = k_offset + std::size_t(tiles16) * tile16 * 2;
  static constexpr std::size_t k8_offset = v_offset + std::size_t(tiles16) * tile16 * 2;
  static constexpr std::size_t v8_offset = k8_offset + (staged ? std::size_t(Policy::stages) * tile8 : 0);
  static constexpr std::size_t rows_offset = v8_offset + (staged ? std::size_t(Policy::stages) * tile8 : 0);
  static constexpr std::size_t bytes = rows_offset + std::size_t(Policy::stages) * Policy::kv_tokens * sizeof(std::int64_t);
  static_assert(k_offset % 16 == 0 && v_offset % 16 == 0 && k8_offset % 16 == 0 && rows_offset % 16 == 0);
};

/// The prefill body for one (sequence, query tile, KV head, split). With plan.num_splits > 1 it
/// writes its rows' partial output (type T) and LSE to part_o and part_lse for merge_states,
/// zeros and -inf where its split holds none of a row's keys.
template <class T, class TKV, int D, class Policy>
__global__ void __launch_bounds__(Policy::threads)
    prefill_mma_kernel(const attention_params p, const prefill_plan plan, T* part_o, float* part_lse) {
  using rows = prefill_rows<D>;
  using smem_t = prefill_smem<T, TKV, D, Policy>;
  constexpr int BM = Policy::q_rows, BN = Policy::kv_tokens, threads = Policy::threads, stages = Policy::stages;
  constexpr int MT = Policy::m_tiles;
  constexpr int ksteps = D / 16, s_tiles = BN / 8, o_tiles = D / 8;
  // At most 32 registers of Q fragments; more (head_dim 256, or two m-tiles of 128) re-read Q
  // from shared memory every k-step.
  constexpr bool q_in_registers = MT * ksteps <= 8;

  wait_for_the_grid_before();
  let_dependents_launch();
  const int seq = int(blockIdx.x) % plan.num_seqs;
  const int tile = plan.q_tiles_per_seq - 1 - int(blockIdx.x) / plan.num_seqs;  // the longest causal ranges first
  const int kv_head = int(blockIdx.y), split = int(blockIdx.z);
  const int group = p.group_size();
  const int q_len = p.q_len(seq);
  const int rows_total = q_len * group, row0 = tile * BM;
  if (row0 >= rows_total) return;
  const int kv_len = p.kv_len(seq), q_begin = p.q_begin(seq);
  const int first_pos = kv_len - q_len + row0 / group;
  const int last_pos = kv_len - q_len + (min(row0 + BM, rows_total) - 1) / group;
  int begin = p.window_left >= 0 ? max(0, first_pos - p.window_left) : 0;
  int end = last_pos + 1;
  if (plan.num_splits > 1) {
    begin = max(begin, split * plan.split_tokens);
    end = min(end, (split + 1) * plan.split_tokens);
  }
  const int num_tiles = end > begin ? (end - begin + BN - 1) / BN : 0;

  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + smem_t::k_offset);
  T* v_s = reinterpret_cast<T*>(smem + smem_t::v_offset);
  auto* k8_s = reinterpret_cast<std::uint8_t*>(smem + smem_t::k8_offset);
  auto* v8_s = reinterpret_cast<std::uint8_t*>(smem + smem_t::v8_offset);
  auto* offsets_s = reinterpret_cast<std::int64_t*>(smem + smem_t::rows_offset);
  const unsigned q_addr = static_cast<unsigned>(__cvta_generic_to_shared(q_s));
  const unsigned k_addr = static_cast<unsigned>(__cvta_generic_to_shared(k_s));
  const unsigned v_addr = static_cast<unsigned>(__cvta_generic_to_shared(v_s));
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int warp_row0 = warp * 16 * MT;  // the warp's first row of the tile

  // Pool offset of row tid (< BN) of KV tile t, -1 past the range: one block-table read a token.
  const block_id* seq_blocks = p.table.is_csr() ? p.table.indices + p.table.indptr[seq]
                                                : p.table.indices + std::int64_t(seq) * p.table.max_blocks_per_seq;
  const auto row_offset = [&](int t) -> std::int64_t {
    const int token = begin + t * BN + tid;
    if (tid >= BN || token >= end) return -1;
    const int j = token / p.table.block_size;
    return p.kv_offset(seq_blocks[j], token - j * p.table.block_size, kv_head);
  };
  const auto* k_g = static_cast<const TKV*>(p.k);
  const auto* v_g = static_cast<const TKV*>(p.v);
  const auto issue_kv = [&](int st) {
    constexpr int vec = vec16<TKV>, row_chunks = D / vec, total = BN * row_chunks;
#pragma unroll
    for (int i = 0; i < (total + threads - 1) / threads; ++i) {
      const int c = tid + i * threads;
      if (total % threads != 0 && c >= total) break;
      const int r = c / row_chunks, ch = c % row_chunks;
      const std::int64_t off = offsets_s[st * BN + r];
      const bool valid = off >= 0;
      const std::int64_t src = (valid ? off : 0) + ch * vec;
      if constexpr (smem_t::staged) {
        const int dst = st * smem_t::tile8 + r * D + ch * 16;
        cp_async_16(k8_s + dst, k_g + src, valid);
        cp_async_16(v8_s + dst, v_g + src, valid);
      } else {
        const int dst = st * smem_t::tile16 + rows::at(r, ch);
        cp_async_16(k_s + dst, k_g + src, valid);
        cp_async_16(v_s + dst, v_g + src, valid);
      }
    }
  };

  // The query tile: row r is token (row0 + r) / group, head (row0 + r) % group; zeros past the rows.
  const auto* q_g = static_cast<const T*>(p.q);
  const int qo_heads = p.num_qo_heads;
  const auto out_row = [&](int r) {  // (token, query head) row of q and o
    const int packed = row0 + r;
    return std::int64_t(q_begin + packed / group) * qo_heads + std::int64_t(kv_head) * group + packed % group;
  };
  if (num_tiles > 0) {
    for (int c = tid; c < BM * rows::chunks; c += threads) {
      const int r = c / rows::chunks, ch = c % rows::chunks;
      const bool valid = row0 + r < rows_total;
      cp_async_16(q_s + rows::at(r, ch), q_g + (valid ? out_row(r) * D + ch * 8 : 0), valid);
    }
    if (tid < BN) {
      offsets_s[tid] = row_offset(0);
      offsets_s[BN + tid] = num_tiles > 1 ? row_offset(1) : -1;
    }
    __syncthreads();
    issue_kv(0);
  }
  cp_async_commit();  // Q and tile 0

  // This lane's rows (gid and gid + 8 of each of its warp's m-tiles): position, ALiBi slope,
  // lowest key.
  int pos[MT][2], lowest[MT][2];
  float slope[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int packed = row0 + warp_row0 + mt * 16 + gid + 8 * r;
      pos[mt][r] = kv_len - q_len + packed / group;
      lowest[mt][r] = p.window_left >= 0 ? pos[mt][r] - p.window_left : -(1 << 30);  // the mask subtracts from it
      slope[mt][r] = p.alibi_slopes && packed < rows_total
                         ? p.alibi_slopes[kv_head * group + packed % group] * prefill_log2e
                         : 0.0f;
    }
  // Logits in log2 units. The plain case keeps S unscaled and folds the scale into the
  // exponent's FFMA (exp2(s * scale - m)); soft-cap and ALiBi (or a scale that is not positive,
  // which the fold would turn -inf into NaN for) scale S first, in a pass of their own.
  const float cap = p.logit_soft_cap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;  // no division in the loop
  const float scale = p.sm_scale * p.k_scale_of(kv_head) * (cap > 0.0f ? 1.0f : prefill_log2e);
  const bool transform = cap > 0.0f || p.alibi_slopes != nullptr || !(scale > 0.0f);
  const float fold = transform ? 1.0f : scale;

  float m[MT][2], l[MT][2];
  float o[MT][o_tiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[mt][r] = -INFINITY;
      l[mt][r] = 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < o_tiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
  }
  [[maybe_unused]] std::uint32_t q_frag[q_in_registers ? MT : 1][q_in_registers ? ksteps : 1][4];
  // ldmatrix rows of this lane: Q's (per m-tile and k-step), K's and V's (per 16-key and
  // 16-dim step; the tile rows of a lane are row % 8 == lane % 8 for every step, so the swizzle
  // of a chunk is an XOR with lane % 8).
  const auto q_ld = [&](int mt, int ks) {
    return q_addr + 2u * unsigned(rows::at(warp_row0 + mt * 16 + lane % 16, ks * 2 + lane / 16));
  };
  const auto k_ld = [&](unsigned base, int np, int ks) {
    return base + 2u * unsigned(rows::at(np * 16 + (lane / 16) * 8 + lane % 8, ks * 2 + (lane / 8) % 2));
  };
  const auto v_ld = [&](unsigned base, int kk, int dp) {
    return base + 2u * unsigned(rows::at(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, dp * 2 + lane / 16));
  };

  for (int t = 0; t < num_tiles; ++t) {
    const int st = t % stages;
    if (t + 1 < num_tiles) issue_kv((t + 1) % stages);
    cp_async_commit();
    cp_async_wait<1>();  // tile t (and, at t = 0, Q) has landed for this thread
    __syncthreads();     // ... and for every thread
    // Tile t + 2's block-table read, in flight during this tile's math (stored after it).
    const std::int64_t next_offset = t + 2 < num_tiles ? row_offset(t + 2) : -1;
    if constexpr (smem_t::staged) {  // widen the fp8 tiles to T, exactly
      for (int c = tid; c < BN * (D / 8); c += threads) {
        const int r = c / (D / 8), ch = c % (D / 8);
        const int src = st * smem_t::tile8 + r * D + ch * 8;
        const uint2 kb = *reinterpret_cast<const uint2*>(k8_s + src);
        const uint2 vb = *reinterpret_cast<const uint2*>(v8_s + src);
        const uint4 kw = {fp8x2_to<T>(std::uint16_t(kb.x & 0xffffu)), fp8x2_to<T>(std::uint16_t(kb.x >> 16)),
                          fp8x2_to<T>(std::uint16_t(kb.y & 0xffffu)), fp8x2_to<T>(std::uint16_t(kb.y >> 16))};
        const uint4 vw = {fp8x2_to<T>(std::uint16_t(vb.x & 0xffffu)), fp8x2_to<T>(std::uint16_t(vb.x >> 16)),
                          fp8x2_to<T>(std::uint16_t(vb.y & 0xffffu)), fp8x2_to<T>(std::uint16_t(vb.y >> 16))};
        *reinterpret_cast<uint4*>(k_s + rows::at(r, ch)) = kw;
        *reinterpret_cast<uint4*>(v_s + rows::at(r, ch)) = vw;
      }
      __syncthreads();
    }
    if constexpr (q_in_registers) {
      if (t == 0)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int ks = 0; ks < ksteps; ++ks) ldmatrix_x4_at(q_frag[mt][ks], q_ld(mt, ks));
    }
    const unsigned tile_bytes = smem_t::staged ? 0u : unsigned(st) * unsigned(smem_t::tile16) * 2u;
    const unsigned k_t = k_addr + tile_bytes, v_t = v_addr + tile_bytes;
    const int tb = begin + t * BN;  // the tile's first key position

    // S = Q K^T: s[mt][nt] holds rows gid (e 0, 1) and gid + 8 (e 2, 3) of m-tile mt, keys
    // tb + nt * 8 + 2 tig + e % 2.
    float s[MT][s_tiles][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < ksteps; ++ks) {
      std::uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (q_in_registers) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = q_frag[mt][ks][i];
        } else {
          ldmatrix_x4_at(a[mt], q_ld(mt, ks));
        }
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        // Matrices: keys np * 16 + 0-7 and 8-15, each at dims ks * 16 + 0-7 and 8-15: b0, b1 of
        // n-tile 2 np, then of 2 np + 1.
        std::uint32_t b[4];
        ldmatrix_x4_at(b, k_ld(k_t, np, ks));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (transform) {  // soft-cap and ALiBi: S scaled to log2 units here, fold is 1
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e / 2, key = tb + nt * 8 + 2 * tig + e % 2;
            float x = s[mt][nt][e] * scale;
            if (cap > 0.0f) x = cap * tanhf(x * inv_cap) * prefill_log2e;
            s[mt][nt][e] = x + slope[mt][r] * float(key - pos[mt][r]);
          }
    }
    // The mask, only where some key of the tile is past the range, after a row's position or
    // before its window: column c of the tile (nt * 8 + e % 2 from the lane's 2 tig) is out
    // where c > hi or c < lo.
    const bool whole = tb + BN <= end && tb + BN - 1 <= first_pos &&
                       (p.window_left < 0 || tb >= last_pos - p.window_left);
    if (!whole) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int hi = min(end - 1, pos[mt][r]) - tb - 2 * tig, lo = lowest[mt][r] - tb - 2 * tig;
#pragma unroll
          for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = nt * 8 + e;
              if (c > hi || c < lo) s[mt][nt][2 * r + e] = -INFINITY;
            }
        }
    }

    // Online softmax of each row over the tile: a row's keys lie in the 4 lanes of its gid.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < s_tiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][r], mx * fold);
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every weight is 0
        const float alpha = exp2_approx(m[mt][r] - m_ref);
        m[mt][r] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float w = exp2_approx(fmaf(s[mt][nt][2 * r + e], fold, -m_ref));
            s[mt][nt][2 * r + e] = w;
            sum += w;
          }
        l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < o_tiles; ++dt) {
          o[mt][dt][2 * r] *= alpha;
          o[mt][dt][2 * r + 1] *= alpha;
        }
      }

    // O += P V: P's A fragment of keys kk * 16 .. + 15 is S's n-tiles 2 kk and 2 kk + 1.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      std::uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        // Transposed matrices: keys kk * 16 + 0-7 and 8-15 at dims dp * 16 + 0-7: b0, b1 of
        // dim n-tile 2 dp; the same at dims + 8-15: of 2 dp + 1.
        std::uint32_t b[4];
        ldmatrix_x4_trans_at(b, v_ld(v_t, kk, dp));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
    // Stage st's offsets were last read by issue_kv(t), before this iteration's first barrier.
    if (tid < BN) offsets_s[st * BN + tid] = next_offset;
    __syncthreads();  // stage st is read: the next iteration may refill it
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with Q: its rows take the output

  // Each row's sum over its 4 lanes; the output staged as T in the warp's own Q rows, then
  // stored a 16-byte chunk a lane.
  const float v_scale = p.v_scale_of(kv_head);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
      inv[r] = l[mt][r] > 0.0f ? v_scale / l[mt][r] : 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < o_tiles; ++dt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<std::uint32_t*>(q_s + rows::at(warp_row0 + mt * 16 + gid + 8 * r, dt) + 2 * tig) =
            pack2<T>(o[mt][dt][2 * r] * inv[r], o[mt][dt][2 * r + 1] * inv[r]);
  }
  __syncwarp();
  const bool partial = plan.num_splits > 1;
  const std::int64_t split_rows = plan.merge_rows(qo_heads);
  const auto dest_row = [&](int r) {  // row of o, or of this split's partials
    const std::int64_t row = out_row(r);
    return partial ? std::int64_t(split) * split_rows + row - std::int64_t(plan.q_first) * qo_heads : row;
  };
  T* o_g = partial ? part_o : static_cast<T*>(p.o);
  for (int c = lane; c < 16 * MT * rows::chunks; c += 32) {
    const int r = warp_row0 + c / rows::chunks, ch = c % rows::chunks;
    if (row0 + r < rows_total)
      *reinterpret_cast<uint4*>(o_g + dest_row(r) * D + ch * 8) =
          *reinterpret_cast<const uint4*>(q_s + rows::at(r, ch));
  }
  float* lse_g = partial ? part_lse : p.lse;
  if (lse_g && tig == 0)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row0 + mt * 16 + gid + 8 * r;
        if (row0 + row < rows_total)
          lse_g[dest_row(row)] = l[mt][r] > 0.0f ? (m[mt][r] + log2f(l[mt][r])) * prefill_ln2 : -INFINITY;
      }
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
