// Decode on tensor cores: every GQA group of up to 16 query heads over 16-bit KV, and over fp8 KV
// under a 16-bit q (dispatch.cuh). The CUDA-core body (decode_cuda_core.cuh) computes
// group * head_dim FMAs per KV element pair; at group 4 and beyond that makes it arithmetic-bound,
// and even for MHA this body is a little faster (decode-kernel.md, "Tensor-core body").
//
// Tokens are the mma's M and the group's heads its N (8, or 16 as two n-tiles): each warp owns
// 16 tokens of every tile and computes S^T = K q^T with m16n8k16 (K fragments by ldmatrix from
// the cp.async tiles, q^T fragments in registers), an online softmax per head over its tokens,
// and O^T += V^T P^T (V^T by ldmatrix.trans; P^T from S^T's accumulators, rounded to the 16-bit
// type as flash attention does, and transposed in registers by movmatrix): a warp holds head_dim
// x 8 fp32 accumulators, not 16 x head_dim as with the heads as M. fp8 e4m3 KV is widened exactly
// to fp16 as the fragments are formed (one instruction a pair; to bf16 it takes four), so over fp8
// KV the mma runs on fp16 operands whatever q's 16-bit type: a bf16 q is scaled into fp16's range
// by a power of two (mma_q_operand).
#pragma once

#include <cstdint>

#include "../attention_params.hpp"
#include "../decode_plan.hpp"
#include "../decode_tuning.hpp"
#include "cp_async.cuh"
#include "decode_common.cuh"
#include "decode_launch.cuh"
#include "mma.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

/// Shared-memory map of the tensor-core body: the pipeline's K/V tiles, reused after the last
/// tile for the warps' merge. NT n-tiles of 8 heads; CTAs of shape Shape (decode_mma_policy).
template <class T, class TKV, int D, int NT, decode_cta Shape>
struct decode_mma_smem {
  using policy = decode_mma_policy<TKV, D, Shape>;
  static constexpr int threads = policy::threads;
  static constexpr int warps = policy::warps;
  static constexpr int tile = policy::tile_tokens;
  static constexpr int stages = policy::stages;
  static constexpr int kv_heads = policy::kv_heads;  // a row holds each KV head's D elements in turn
  static constexpr int row_elems = kv_heads * D;
  /// Swizzled rows where a row is whole 128-byte segments (16-bit head_dim 64, 128, 256; fp8 128,
  /// 256), padded ones otherwise: both give conflict-free ldmatrix and fragment reads.
  using rows = kv_smem_rows<TKV, row_elems, (row_elems * sizeof(TKV)) % 128 == 0>;
  static_assert(kv_heads == 1 || rows::swizzled, "paired rows are whole 128-byte segments");
  static constexpr int pitch = rows::pitch;
  static constexpr int head_chunks = D / rows::vec;  // 16-byte chunks of one KV head in a row
  static constexpr int heads = 8 * NT;          // the mma's N, n-tiles of 8
  static_assert(D % 16 == 0 && policy::warp_tokens == 16, "m16n8k16 tiles: 16 tokens, 16 dims a step");
  static_assert(warps % kv_heads == 0, "each KV head has whole warps");
  static constexpr std::size_t kv_bytes = std::size_t(2) * stages * tile * pitch * sizeof(TKV);
  /// After the last tile: every warp's (m, l) and accumulators, merged across warps.
  static constexpr std::size_t reduce_bytes = std::size_t(warps) * heads * (D + 2) * sizeof(float);
  /// After both: the unit's ALiBi slots (alibi_slots), written only with ALiBi.
  static constexpr std::size_t alibi_offset = ((kv_bytes > reduce_bytes ? kv_bytes : reduce_bytes) + 15) / 16 * 16;
  static constexpr std::size_t bytes = alibi_offset + alibi_slots<heads, kv_heads>::bytes;
};

/// fp8 KV permutes the dims inside each fragment so that a lane's fp8 bytes are adjacent in
/// shared memory and come in one 32-bit load (a dot product and an output row do not care about
/// the order of the dims, as long as q, K, V and the output agree on it):
/// - QK^T: lane (gid, tig)'s k slots 2 tig, 2 tig + 1 and 2 tig + 8, 2 tig + 9 of a 16-dim step
///   hold dims 4 tig .. 4 tig + 3 (16-bit KV: the mma's own order, as ldmatrix delivers it).
/// - PV: in a pair of m-tiles (32 dims), rows gid and gid + 8 of the first and of the second hold
///   dims 4 gid .. 4 gid + 3; an unpaired last m-tile (head_dim 80) keeps the mma's order.
template <class TKV>
inline constexpr bool permuted_dims = sizeof(TKV) == 1;

/// Dim of q that lane tig feeds as B fragment register `half` (0: k slots 2 tig, 2 tig + 1;
/// 1: 2 tig + 8, 2 tig + 9) of k step ks.
template <class TKV>
__device__ __forceinline__ int qk_dim(int ks, int tig, int half) {
  return ks * 16 + (permuted_dims<TKV> ? tig * 4 + half * 2 : tig * 2 + half * 8);
}

/// Output dim of row `row` (0-15) of PV m-tile mt.
template <class TKV, int D>
__device__ __forceinline__ int pv_dim(int mt, int row) {
  if constexpr (permuted_dims<TKV>) {
    if (mt < D / 32 * 2) return (mt / 2) * 32 + (row % 8) * 4 + (mt % 2) * 2 + row / 8;
  }
  return mt * 16 + row;
}

/// Bytes j0 and j1 (0-3) of two words a (low byte of each pair) and b, as two fp8 pairs widened
/// to two packed pairs of T: {a[j0], b[j0]} and {a[j1], b[j1]}.
template <class T>
__device__ __forceinline__ void fp8_byte_pairs(std::uint32_t a, std::uint32_t b, int j0, std::uint32_t& lo,
                                               std::uint32_t& hi) {
  const std::uint32_t pairs = __byte_perm(a, b, j0 == 0 ? 0x5140u : 0x7362u);
  lo = fp8x2_to<T>(std::uint16_t(pairs & 0xffffu));
  hi = fp8x2_to<T>(std::uint16_t(pairs >> 16));
}

/// Two fp8 bytes of different rows (the first in the low half), widened to a pair of T.
template <class T>
__device__ __forceinline__ std::uint32_t fp8_column_pair(const std::uint8_t* first, int pitch) {
  return fp8x2_to<T>(std::uint16_t(first[0] | (first[pitch] << 8)));
}

/// The mma's operand type: q's, except over fp8 KV, which widens to fp16 in one instruction,
/// where q's fragments stay in registers (re-read and converted in every tile, the head_dim 256
/// two-n-tile body spills).
template <class T, class TKV, bool QInRegisters>
using mma_operand_t = std::conditional_t<sizeof(TKV) == 1 && QInRegisters, __half, T>;

/// A bf16 q under fp16 operands: its largest magnitude over the warp (each lane gives the bits of
/// the largest |q| among its fragments) sets the power of two 2^-e that brings it into
/// [2^14, 2^15), where fp16 holds every bf16 value exactly; what falls below fp16's range is
/// 2^-38 of the largest and beneath a logit's notice. Returns e (the logits are scaled back by
/// 2^e in fp32).
__device__ __forceinline__ int mma_q_exponent(std::uint32_t largest_raw_bits) {
  const unsigned largest = __reduce_max_sync(0xffffffffu, largest_raw_bits);
  const int biased = int(largest >> 7);  // bf16: 7 mantissa bits; inf and NaN stay what they are
  return biased - 141 > -120 ? biased - 141 : -120;
}

/// 2^e as a float, for |e| <= 126.
__device__ __forceinline__ float exp2_int(int e) { return __int_as_float((127 + e) << 23); }

/// A packed pair of q values of type T as the mma operand type TM (scaled by `scale`, a power
/// of two, where the types differ).
template <class T, class TM>
__device__ __forceinline__ std::uint32_t mma_q_operand(std::uint32_t raw, float scale) {
  if constexpr (std::is_same_v<T, TM>) {
    return raw;
  } else {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw));
    return pack2<TM>(f.x * scale, f.y * scale);
  }
}

/// CTAs an SM the body's registers are held to (launch bounds): two where a KV head's row is 128
/// bytes (fp8 head_dim 128, 16-bit head_dim 64: 8-warp CTAs, paired ones among them) and the body
/// has one n-tile, on every shape but wide: left to itself ptxas may give the fp8 head_dim 128
/// body more than 128 registers, and its 8-warp CTAs then run one an SM (fp8 rows of the decode
/// table). Shallow 8-warp CTAs held to three an SM, and two-n-tile bodies held to 128 registers,
/// spill. The others get a count of 0, which is no count at all: even a count of one changed
/// ptxas's allocation (decode-kernel.md, "Launch bounds").
template <class TKV, int D, int NT, decode_cta Shape>
inline constexpr int decode_mma_min_ctas = D * sizeof(TKV) == 128 && NT == 1 && Shape != decode_cta::wide ? 2 : 0;

/// The body for one (sequence, KV head, split), heads of the group in NT n-tiles of 8; paired
/// CTAs (decode_cta::paired) run it for two adjacent KV heads, half the warps each.
///
/// Warp w owns rows [16 w, 16 w + 16) of every tile: it copies them (cp.async, its own commit
/// groups), computes their logits for every head, keeps its own online-softmax state and
/// accumulates O^T over them. Lane (gid, tig) = (lane / 4, lane % 4) holds, in S^T, tokens gid
/// and gid + 8 of heads 2 tig and 2 tig + 1; in O^T, dims gid and gid + 8 (of each 16) of the
/// same heads, so a head's rescaling never leaves the lane. Warps meet once, after the last tile.
/// In a paired CTA warp w serves KV head w / (warps / 2) over rows [16 i, 16 i + 16), i = w % (warps
/// / 2), and the two warps of those rows copy half of them each (both heads' elements, adjacent
/// in an NHD pool) and meet at a named barrier every tile.
template <class T, class TKV, int D, int NT, decode_cta Shape>
__global__ void __launch_bounds__(decode_mma_policy<TKV, D, Shape>::threads, decode_mma_min_ctas<TKV, D, NT, Shape>)
    decode_mma_kernel(const attention_params p, const decode_plan plan, float* part_o, float* part_lse) {
  using smem_t = decode_mma_smem<T, TKV, D, NT, Shape>;
  constexpr int warps = smem_t::warps, tile = smem_t::tile, stages = smem_t::stages, kv_heads = smem_t::kv_heads;
  using rows = typename smem_t::rows;
  constexpr int pitch = smem_t::pitch, heads = smem_t::heads;
  constexpr int ksteps = D / 16;  // QK^T's k steps, and PV's m-tiles of head_dim
  constexpr int head_warps = warps / kv_heads, copy_rows = 16 / kv_heads;

  extern __shared__ __align__(128) unsigned char smem[];
  TKV* k_s = reinterpret_cast<TKV*>(smem);
  TKV* v_s = k_s + stages * tile * pitch;

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int head_of_unit = kv_heads == 1 ? 0 : warp / head_warps;  // which of the unit's KV heads it serves
  const int row0 = (kv_heads == 1 ? warp : warp % head_warps) * 16;  // this warp's first row in a tile
  const int chunk0 = head_of_unit * smem_t::head_chunks;             // its KV head's first chunk of a row
  warp_copies<TKV, D, rows, copy_rows, tile, stages, kv_heads> copies{
      .row0 = row0 + head_of_unit * copy_rows, .lane = lane, .k_s = k_s, .v_s = v_s, .barrier = 1 + warp % head_warps};
  if (!copies.start(p, plan, part_o, part_lse)) return;
  const decode_unit& u = copies.u;
  const int kv_head = u.kv_head + head_of_unit, group = u.group, begin = u.begin, end = u.end;
  const int num_tiles = copies.num_tiles;
  float* alibi_s = reinterpret_cast<float*>(smem + smem_t::alibi_offset);
  if (p.alibi_slopes) {  // the same for every CTA of the launch: the barrier is uniform
    alibi_slots<heads, kv_heads>::stage(alibi_s, p, u);
    __syncthreads();
  }

  // q^T as the B operand, straight from global memory (exact; the logit scale is applied to the
  // fp32 products): lane holds head nt * 8 + gid, dims qk_dim(ks, tig, 0 and 1) of k step ks.
  // Zeros past the group. Held in registers up to 32 of them, re-read (L1) beyond.
  constexpr bool q_in_registers = NT * ksteps * 2 <= 32;
  using TM = mma_operand_t<T, TKV, q_in_registers>;
  const auto* q_g = static_cast<const T*>(p.q);
  const std::int64_t q_row = u.q_row + std::int64_t(head_of_unit) * group;
  const auto q_raw = [&](int nt, int ks, int half) -> std::uint32_t {
    const int h = nt * 8 + gid;
    if (h >= group) return 0u;
    return *reinterpret_cast<const std::uint32_t*>(q_g + (q_row + h) * D + qk_dim<TKV>(ks, tig, half));
  };
  int q_exponent = 0;  // operands are q 2^-q_exponent
  if constexpr (!std::is_same_v<T, TM>) {
    std::uint32_t largest = 0;
    for (int nt = 0; nt < NT; ++nt)
      for (int ks = 0; ks < ksteps; ++ks)
        for (int half = 0; half < 2; ++half) {
          const std::uint32_t w = q_raw(nt, ks, half);
          largest = max(largest, max(w & 0x7fffu, (w >> 16) & 0x7fffu));
        }
    q_exponent = mma_q_exponent(largest);
  }
  const float q_scale = exp2_int(-q_exponent);
  const auto q_fragment = [&](int nt, int ks, int half) { return mma_q_operand<T, TM>(q_raw(nt, ks, half), q_scale); };
  std::uint32_t q_frag[q_in_registers ? NT : 1][q_in_registers ? ksteps : 1][2];
  if constexpr (q_in_registers)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int ks = 0; ks < ksteps; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half) q_frag[nt][ks][half] = q_fragment(nt, ks, half);
  const float logit_scale =
      p.sm_scale * p.k_scale_of(kv_head) * (p.logit_soft_cap > 0.0f ? 1.0f : log2e) * exp2_int(q_exponent);

  // Softmax state of heads nt * 8 + 2 tig + j: m the same in the 8 lanes of a tig, l this
  // lane's partial sum (its tokens only), summed across them at the end.
  float m[NT][2], l[NT][2];
  float acc[NT][ksteps][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      m[nt][j] = -INFINITY;
      l[nt][j] = 0.0f;
    }
#pragma unroll
    for (int mt = 0; mt < ksteps; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][mt][e] = 0.0f;
  }

  for (int t = 0; t < num_tiles; ++t) {
    copies.advance(p, t);
    const TKV* k_rows = k_s + ((t % stages) * tile + row0) * pitch;
    const TKV* v_rows = v_s + ((t % stages) * tile + row0) * pitch;
    const int valid_rows = end - (begin + t * tile + row0);  // of this warp's 16

    // S^T = K q^T: s[nt][0..1] = tokens gid, heads 2 tig + {0, 1}; s[nt][2..3] = token gid + 8.
    // Even and odd k steps accumulate apart (s, s_odd): two dependent mma chains of half length.
    float s[NT][4], s_odd[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = s_odd[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < ksteps; ++ks) {
      std::uint32_t a[4];
      if constexpr (sizeof(TKV) == 2) {
        ldmatrix_x4(a, k_rows + rows::at(lane % 16, chunk0 + ks * 2 + lane / 16));
      } else {  // fp8: dims 4 tig .. 4 tig + 3 of rows gid and gid + 8, one word each (chunk ks)
        const std::uint32_t lo = *reinterpret_cast<const std::uint32_t*>(k_rows + rows::at(gid, chunk0 + ks) + tig * 4);
        const std::uint32_t hi =
            *reinterpret_cast<const std::uint32_t*>(k_rows + rows::at(gid + 8, chunk0 + ks) + tig * 4);
        a[0] = fp8x2_to<TM>(std::uint16_t(lo & 0xffffu));
        a[2] = fp8x2_to<TM>(std::uint16_t(lo >> 16));
        a[1] = fp8x2_to<TM>(std::uint16_t(hi & 0xffffu));
        a[3] = fp8x2_to<TM>(std::uint16_t(hi >> 16));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float* c = ks % 2 == 0 ? s[nt] : s_odd[nt];
        if constexpr (q_in_registers) {
          mma_16816<TM>(c, a, q_frag[nt][ks][0], q_frag[nt][ks][1]);
        } else {
          mma_16816<TM>(c, a, q_fragment(nt, ks, 0), q_fragment(nt, ks, 1));
        }
      }
    }

    // Online softmax of each head over the warp's 16 tokens (the 8 lanes of a tig hold them).
    std::uint32_t pt[NT][2];  // P^T as the B operand: tokens 0-7, 8-15 of this warp
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = (s[nt][e] + s_odd[nt][e]) * logit_scale;
        if (p.logit_soft_cap > 0.0f) x = p.logit_soft_cap * tanhf(x / p.logit_soft_cap) * log2e;
        const int row = gid + (e >= 2 ? 8 : 0);  // of this warp's 16
        if (p.alibi_slopes)
          x += alibi_slots<heads, kv_heads>::bias(alibi_s, head_of_unit * heads + nt * 8 + tig * 2 + e % 2,
                                                  begin + t * tile + row0 + row);
        s[nt][e] = row < valid_rows ? x : -INFINITY;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float mx = fmaxf(s[nt][j], s[nt][j + 2]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m[nt][j], mx);
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no token yet: everything is 0
        const float alpha = exp2f(m[nt][j] - m_ref);
        s[nt][j] = exp2f(s[nt][j] - m_ref);
        s[nt][j + 2] = exp2f(s[nt][j + 2] - m_ref);
        l[nt][j] = l[nt][j] * alpha + s[nt][j] + s[nt][j + 2];
        m[nt][j] = m_new;
#pragma unroll
        for (int mt = 0; mt < ksteps; ++mt) {
          acc[nt][mt][j] *= alpha;
          acc[nt][mt][j + 2] *= alpha;
        }
      }
      pt[nt][0] = movmatrix_trans(pack2<TM>(s[nt][0], s[nt][1]));
      pt[nt][1] = movmatrix_trans(pack2<TM>(s[nt][2], s[nt][3]));
    }

    // O^T += V^T P^T, an m-tile of 16 dims at a time: A[m = dim][k = token].
    if constexpr (sizeof(TKV) == 2) {
#pragma unroll
      for (int mt = 0; mt < ksteps; ++mt) {
        std::uint32_t a[4];
        ldmatrix_x4_trans(a, v_rows + rows::at((lane / 16) * 8 + lane % 8, chunk0 + mt * 2 + (lane / 8) % 2));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_16816<TM>(acc[nt][mt], a, pt[nt][0], pt[nt][1]);
      }
    } else {  // fp8: a pair of m-tiles from one word of each of the lane's 4 token rows
      const auto* v8 = reinterpret_cast<const std::uint8_t*>(v_rows);
      constexpr int paired_mts = D / 32 * 2;  // m-tiles read in pairs (32 dims a pair)
#pragma unroll
      for (int mt = 0; mt < paired_mts; mt += 2) {
        // Token rows 2 tig + {0, 1, 8, 9}, dims (mt / 2) * 32 + 4 gid .. + 3 (chunk (mt / 2) * 2 + gid / 4).
        const auto word = [&](int row) {
          return *reinterpret_cast<const std::uint32_t*>(
              v8 + rows::at(tig * 2 + row, chunk0 + (mt / 2) * 2 + gid / 4) + (gid % 4) * 4);
        };
        const std::uint32_t t0 = word(0), t1 = word(1), t8 = word(8), t9 = word(9);
        std::uint32_t a[4], b[4];
        fp8_byte_pairs<TM>(t0, t1, 0, a[0], a[1]);  // dims +0, +1: the first m-tile's rows gid, gid + 8
        fp8_byte_pairs<TM>(t8, t9, 0, a[2], a[3]);
        fp8_byte_pairs<TM>(t0, t1, 2, b[0], b[1]);  // dims +2, +3: the second m-tile's
        fp8_byte_pairs<TM>(t8, t9, 2, b[2], b[3]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mma_16816<TM>(acc[nt][mt], a, pt[nt][0], pt[nt][1]);
          mma_16816<TM>(acc[nt][mt + 1], b, pt[nt][0], pt[nt][1]);
        }
      }
      if constexpr (paired_mts < ksteps) {  // head_dim 80: the last m-tile, gathered bytewise
        static_assert(!rows::swizzled && kv_heads == 1, "80-byte fp8 rows are padded, not swizzled, and not paired");
        constexpr int mt = ksteps - 1;
        const auto* c = v8 + tig * 2 * pitch + mt * 16 + gid;
        const std::uint32_t a[4] = {fp8_column_pair<TM>(c, pitch), fp8_column_pair<TM>(c + 8, pitch),
                                    fp8_column_pair<TM>(c + 8 * pitch, pitch), fp8_column_pair<TM>(c + 8 * pitch + 8, pitch)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_16816<TM>(acc[nt][mt], a, pt[nt][0], pt[nt][1]);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int off = 4; off < 32; off *= 2) l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], off);
  __syncthreads();  // every warp is done with its tiles: the KV region becomes the merge buffer

  float* acc_s = reinterpret_cast<float*>(smem);  // [warps, heads, D]
  float* ml_s = acc_s + warps * heads * D;          // [warps, heads, 2]
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = nt * 8 + tig * 2 + j;
      if (h >= group) continue;  // padding heads of the n-tile: never merged (MHA has 7 of 8)
#pragma unroll
      for (int mt = 0; mt < ksteps; ++mt) {
        acc_s[(warp * heads + h) * D + pv_dim<TKV, D>(mt, gid)] = acc[nt][mt][j];
        acc_s[(warp * heads + h) * D + pv_dim<TKV, D>(mt, gid + 8)] = acc[nt][mt][j + 2];
      }
      if (gid == 0) {
        ml_s[(warp * heads + h) * 2] = m[nt][j];
        ml_s[(warp * heads + h) * 2 + 1] = l[nt][j];
      }
    }
  }
  __syncthreads();

  merge_warps_and_store<D, heads, warps, kv_heads>(p, plan, u, acc_s, ml_s, part_o, part_lse);
}

/// Which CTA shapes this instantiation has, within Hopper's shared memory (hopper_smem).
template <class T, class TKV, int D, int NT>
struct decode_mma_shapes {
  static constexpr std::size_t per_sm = hopper_smem::per_sm, per_cta = hopper_smem::per_cta,
                               reserved = hopper_smem::reserved;
  static constexpr std::size_t narrow_bytes = decode_mma_smem<T, TKV, D, NT, decode_cta::narrow>::bytes + reserved;
  static constexpr bool narrow_two_an_sm = 2 * narrow_bytes <= per_sm && 3 * narrow_bytes > per_sm;
  /// Wide: where narrow CTAs have fewer than 8 warps and run two an SM, and 8 warps' stages fit
  /// one (not bf16 head_dim 256, one CTA an SM already).
  static constexpr bool wide = decode_mma_policy<TKV, D, decode_cta::narrow>::warps < 8 && narrow_two_an_sm &&
                               decode_mma_smem<T, TKV, D, NT, decode_cta::wide>::bytes <= per_cta;
  /// Shallow: where narrow CTAs run two an SM and two stages fit three.
  static constexpr bool shallow =
      narrow_two_an_sm && 3 * (decode_mma_smem<T, TKV, D, NT, decode_cta::shallow>::bytes + reserved) <= per_sm;
  /// Paired: where a KV head's row is 128 bytes (fp8 head_dim 128, 16-bit head_dim 64), and
  /// paired CTAs run two an SM like narrow ones.
  static constexpr bool paired = [] {
    if constexpr (D * sizeof(TKV) == 128)
      return narrow_two_an_sm && 2 * (decode_mma_smem<T, TKV, D, NT, decode_cta::paired>::bytes + reserved) <= per_sm;
    else
      return false;
  }();
};

template <class T, class TKV, int D, int NT, decode_cta Shape>
void launch_decode_mma_kernel(const attention_params& p, const decode_plan& plan, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream) {
  using smem_t = decode_mma_smem<T, TKV, D, NT, Shape>;
  launch_with_merge<D>(decode_mma_kernel<T, TKV, D, NT, Shape>, p, plan, smem_t::threads, smem_t::bytes, workspace,
                       workspace_bytes, stream);
}

}  // namespace detail

/// Plans and launches the tensor-core decode for a group of NT * 8 heads or fewer, on the CTA
/// shape plan_decode_mma picks.
template <class T, class TKV, int D, int NT>
decode_plan launch_decode_mma(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream, bool launch) {
  using narrow = decode_mma_policy<TKV, D, decode_cta::narrow>;
  using wide = decode_mma_policy<TKV, D, decode_cta::wide>;
  using shapes = detail::decode_mma_shapes<T, TKV, D, NT>;
  const detail::launch_facts& f = detail::facts_of<shapes>([] {  // every shape's limit, once
    using namespace detail;
    allow_smem(decode_mma_kernel<T, TKV, D, NT, decode_cta::narrow>,
               decode_mma_smem<T, TKV, D, NT, decode_cta::narrow>::bytes);
    if constexpr (shapes::wide)
      allow_smem(decode_mma_kernel<T, TKV, D, NT, decode_cta::wide>,
                 decode_mma_smem<T, TKV, D, NT, decode_cta::wide>::bytes);
    if constexpr (shapes::shallow)
      allow_smem(decode_mma_kernel<T, TKV, D, NT, decode_cta::shallow>,
                 decode_mma_smem<T, TKV, D, NT, decode_cta::shallow>::bytes);
    if constexpr (shapes::paired)
      allow_smem(decode_mma_kernel<T, TKV, D, NT, decode_cta::paired>,
                 decode_mma_smem<T, TKV, D, NT, decode_cta::paired>::bytes);
  });
  const decode_plan plan =
      plan_decode_mma(p, f.num_sms, narrow::tile_tokens, wide::tile_tokens, narrow::min_chunk_tokens, shapes::wide,
                      shapes::shallow, shapes::paired ? decode_mma_policy<TKV, D, decode_cta::paired>::tile_tokens : 0);
  if (!launch || p.num_seqs == 0) return plan;
  if constexpr (shapes::paired) {
    if (plan.cta == decode_cta::paired) {
      detail::launch_decode_mma_kernel<T, TKV, D, NT, decode_cta::paired>(p, plan, workspace, workspace_bytes, stream);
      return plan;
    }
  }
  if constexpr (shapes::wide) {
    if (plan.cta == decode_cta::wide) {
      detail::launch_decode_mma_kernel<T, TKV, D, NT, decode_cta::wide>(p, plan, workspace, workspace_bytes, stream);
      return plan;
    }
  }
  if constexpr (shapes::shallow) {
    if (plan.cta == decode_cta::shallow) {
      detail::launch_decode_mma_kernel<T, TKV, D, NT, decode_cta::shallow>(p, plan, workspace, workspace_bytes,
                                                                            stream);
      return plan;
    }
  }
  detail::launch_decode_mma_kernel<T, TKV, D, NT, decode_cta::narrow>(p, plan, workspace, workspace_bytes, stream);
  return plan;
}

/// Plans and launches the tensor-core decode: q of 16-bit type T, KV of T or fp8, group <= 16.
template <class T, class TKV, int D>
decode_plan launch_decode_mma(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream, bool launch) {
  if (p.group_size() <= 8) return launch_decode_mma<T, TKV, D, 1>(p, workspace, workspace_bytes, stream, launch);
  return launch_decode_mma<T, TKV, D, 2>(p, workspace, workspace_bytes, stream, launch);
}

}  // namespace pagedkv::kernels::cuda
