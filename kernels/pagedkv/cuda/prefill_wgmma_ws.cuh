// The wgmma prefill's body (sm_90a, head_dim 128, q and KV of one 16-bit type): the rows, tiles,
// softmax and outputs of prefill_wgmma.cuh, warp-specialised as in FlashAttention-3. Warpgroup 0
// copies and does nothing else (setmaxnreg down): the Q tile first (one TMA of the group's heads
// over the tile's tokens where the group divides the tile's rows and the tile lies within its
// sequence, else cp.async a thread), completing on its own mbarrier; then K and V of each 128-key
// tile into two stages each, by the bulk tensor copy where the pool's page runs allow (a tile's page runs spread over
// the four warps, each issuing warp's expect_tx on the stage's "full" mbarrier) and otherwise by
// cp.async through the block table (each thread's copies completing on the "full" mbarrier by
// cp.async.mbarrier.arrive.noinc), the block-table reads with them. Warpgroups 1 and 2 compute 64
// query rows each (setmaxnreg up): S_t and O += P_(t-1) V_(t-1) issued together, then the softmax
// of S_t, waiting on "full" mbarriers and releasing stages on "empty" ones: no CTA barrier a tile.
// The two take turns issuing their wgmmas (FlashAttention-3's scheduler barrier: named barriers
// around the issue only), so that one's softmax runs while the tensor cores hold the other's GEMMs.
// Against the earlier body without warp specialisation: 1.31-1.45x on the issue-21 shapes
// (docs/journal/prefill-kernel.md, session 4).
#pragma once

#include <cstdint>

#include "../attention_params.hpp"
#include "../prefill_plan.hpp"
#include "cp_async.cuh"
#include "dependent_launch.cuh"
#include "prefill_wgmma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

/// Shared memory of the warp-specialised body, from a 1024-byte aligned base: the Q tile (reused
/// for the output rows), two K and two V stages (prefill_wgmma_smem's tile layout), then the
/// mbarriers: full K, full V, empty K, empty V, a stage each, and full Q.
struct prefill_wgmma_ws_smem {
  static constexpr int stages = 2;
  static constexpr unsigned tile_bytes = prefill_wgmma_smem::tile_bytes;
  static constexpr unsigned k_offset = prefill_wgmma_smem::q_bytes;
  static constexpr unsigned v_offset = k_offset + stages * tile_bytes;
  static constexpr unsigned bar_offset = v_offset + stages * tile_bytes;
  static constexpr unsigned q_bar_offset = bar_offset + 4 * stages * 8;
  static constexpr std::size_t bytes = q_bar_offset + sizeof(std::uint64_t) + 1024;
};

/// Threads of the warp-specialised CTA (a copying warpgroup and prefill_wgmma_policy's two), and
/// the registers a thread of each role keeps (setmaxnreg): 128 x 40 + 256 x 232 = 64,512 of the
/// SM's 65,536.
struct prefill_wgmma_ws_policy {
  static constexpr int threads = prefill_wgmma_policy::threads + 128;
  static constexpr int copy_registers = 40, math_registers = 232;
};

/// The launch facts' key of prefill_wgmma_ws_kernel<T, Tma>.
template <class T, bool Tma>
struct prefill_wgmma_ws_tag {};

/// The wgmma body for one (sequence, query tile, KV head, split); outputs as
/// prefill_mma_kernel's. Tma: tiles whose start is a multiple of maps.rows and that lie wholly
/// before the CTA's range end come by the bulk tensor copy (page run i of the tile's 128 /
/// maps.rows by lane i / 4 of copying warp i % 4, two boxes of 64 dims), the others (the range's
/// last tile, a CTA whose range starts mid-run, every tile where maps.rows is 0) by cp.async,
/// whose zero fill keeps rows past the range out of P V. Q by TMA wherever maps.q_tokens is set,
/// O wherever maps.o_tokens is (either Tma).
template <class T, bool Tma>
__global__ void __launch_bounds__(prefill_wgmma_ws_policy::threads, 1)
    prefill_wgmma_ws_kernel(const attention_params p, const prefill_plan plan, T* part_o, float* part_lse,
                            const __grid_constant__ prefill_tensor_maps maps) {
#if PAGEDKV_WGMMA_COMPILED
  using smem_t = prefill_wgmma_ws_smem;
  using tile_t = prefill_wgmma_smem;
  constexpr int BM = prefill_wgmma_policy::q_rows, BN = prefill_wgmma_policy::kv_tokens;
  constexpr int D = prefill_wgmma_policy::head_dim, chunks = D / 8;

  wait_for_the_grid_before();
  let_dependents_launch();
  prefill_wgmma_cta c;
  if (!c.make(p, plan, BM, BN)) return;
  const int num_tiles = c.num_tiles;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = prefill_wgmma_smem_base(smem_raw);
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned q_addr = base, k_addr = base + smem_t::k_offset, v_addr = base + smem_t::v_offset;
  const unsigned bars = base + smem_t::bar_offset;
  const auto full_k = [&](int st) { return bars + 8u * unsigned(st); };
  const auto full_v = [&](int st) { return bars + 8u * unsigned(smem_t::stages + st); };
  const auto empty_k = [&](int st) { return bars + 8u * unsigned(2 * smem_t::stages + st); };
  const auto empty_v = [&](int st) { return bars + 8u * unsigned(3 * smem_t::stages + st); };
  const unsigned full_q = base + smem_t::q_bar_offset;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, wg = warp / 4;
  // The Q tile by one TMA (thread 0: two boxes of 64 dims) where the box's whole tokens are the
  // tile's rows, all within the sequence; else by cp.async of every copying thread.
  const bool q_tma = maps.q_tokens > 0 && c.row0 + BM <= c.rows_total;
  if (tid == 0) {
    for (int st = 0; st < smem_t::stages; ++st) {
      mbarrier_init(full_k(st), 128);  // every copying thread, one the bytes' expect_tx on TMA tiles
      mbarrier_init(full_v(st), 128);
      mbarrier_init(empty_k(st), 256);  // every computing thread once its wgmmas have read the stage
      mbarrier_init(empty_v(st), 256);
    }
    mbarrier_init(full_q, q_tma ? 1 : 128);
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<prefill_wgmma_ws_policy::copy_registers>();
    const auto* k_g = static_cast<const T*>(p.k);
    const auto* v_g = static_cast<const T*>(p.v);
    // Q before the first K tile: the computing warpgroups' first S waits on both.
    if (num_tiles > 0) {
      if (q_tma) {
        if (tid == 0) {
          const int token = c.q_begin + plan.group_div.div(c.row0), head = c.kv_head * c.group;
          mbarrier_arrive_expect_tx(full_q, unsigned(BM) * D * sizeof(T));
          tma_load_3d(q_addr, &maps.q, 0, head, token, full_q);
          tma_load_3d(q_addr + BM * 128, &maps.q, 64, head, token, full_q);
        }
      } else {
        // Chunk tid % 16 of rows tid / 16 + 8 i; rows past the sequence's are zeros.
        const auto* q_g = static_cast<const T*>(p.q);
        const int ch = tid % chunks;
#pragma unroll 4
        for (int r = tid / chunks; r < BM; r += 128 / chunks) {
          const int packed = c.row0 + r, token = plan.group_div.div(packed);
          const bool valid = packed < c.rows_total;
          const std::int64_t row = std::int64_t(c.q_begin + token) * p.num_qo_heads + c.kv_head * c.group +
                                   (packed - token * c.group);
          cp_async_16_to(q_addr + tile_t::at(BM, r, ch), q_g + (valid ? row * D + ch * 8 : 0), valid);
        }
        cp_async_mbarrier_arrive(full_q);
      }
    }
    const int run_rows = Tma && maps.rows > 0 ? maps.rows : BN;
    const bool tma_cta = Tma && maps.rows > 0 && c.begin % run_rows == 0;
    // TMA: run i of a tile by lane i / 4 of warp i % 4 (block size 16: two lanes in each warp),
    // each issuing warp's lane 0 expecting its own warp's bytes, so that no box completes before
    // its bytes are expected. cp.async.bulk.tensor takes uniform registers: ptxas issues a box
    // once a lane in a loop (8 instructions), so warp 0 alone took 256 a tile at block size 16 on
    // its scheduler; spread over the four warps, 1.11-1.16x at 16 and 1.01-1.02x at 64 and 256
    // (run bs-1, docs/journal/prefill-kernel.md).
    const int run = 4 * lane + warp;
    const bool tma_lane = run < BN / run_rows;
    const int warp_runs = BN / run_rows > warp ? (BN / run_rows - warp + 3) / 4 : 0;
    const bool expecting = lane == 0 && warp_runs > 0;
    const unsigned expect_bytes = unsigned(warp_runs * run_rows) * 256u;
    // cp.async: this thread's rows tid / 4 + 32 i and chunks 4 j + tid % 4 of a tile (a warp
    // copies 64 contiguous bytes of each of 8 rows an instruction), their pool offsets in
    // registers (-1 past the range: zero fill). In the swizzle, chunk 4 + c of a row (c < 4) lies
    // at chunk c's offset with bit 6 flipped; rows 32 on 4 KiB on, dims 64 on an atom column on.
    const int row0 = tid / 4, chunk0 = tid % 4;
    const unsigned dst_even = tile_t::at(BN, row0, chunk0), dst_odd = dst_even ^ 64u;
    std::int64_t off[4];
    const auto gather = [&](const T* src_g, unsigned dst_base, unsigned full) {
      const unsigned even = dst_base + dst_even, odd = dst_base + dst_odd;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool valid = off[i] >= 0;
        const T* src = src_g + (valid ? off[i] : 0) + chunk0 * 8;
        cp_async_16_to(even + i * 4096, src, valid);
        cp_async_16_to(odd + i * 4096, src + 32, valid);
        cp_async_16_to(even + i * 4096 + BN * 128, src + 64, valid);
        cp_async_16_to(odd + i * 4096 + BN * 128, src + 96, valid);
      }
      cp_async_mbarrier_arrive(full);
    };
    // TMA: a tma_lane copies run `run` (rows run * run_rows ..) of the tile.
    const auto boxes = [&](const CUtensorMap* map, unsigned dst_base, unsigned full, int blk, int slot) {
      if (expecting) mbarrier_arrive_expect_tx(full, expect_bytes);
      else mbarrier_arrive(full);
      __syncwarp();
      if (tma_lane) {
        const unsigned dst = dst_base + run * run_rows * 128;
        tma_load_4d(dst, map, 0, slot, c.kv_head, blk, full);
        tma_load_4d(dst + BN * 128, map, 64, slot, c.kv_head, blk, full);
      }
    };
    for (int t = 0; t < num_tiles; ++t) {
      const int st = t % smem_t::stages;
      const unsigned free_parity = ((t / smem_t::stages) & 1u) ^ 1u;  // use u waits for release u - 1
      const unsigned k_dst = k_addr + st * smem_t::tile_bytes, v_dst = v_addr + st * smem_t::tile_bytes;
      if (tma_cta && c.begin + (t + 1) * BN <= c.end) {
        int blk = 0, slot = 0;
        if (tma_lane) {
          const int token = c.begin + t * BN + run * run_rows;
          const int j = token / p.table.block_size;
          slot = token - j * p.table.block_size;
          blk = c.seq_blocks[j];
        }
        mbarrier_wait(empty_k(st), free_parity);
        boxes(&maps.k, k_dst, full_k(st), blk, slot);
        mbarrier_wait(empty_v(st), free_parity);
        boxes(&maps.v, v_dst, full_v(st), blk, slot);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) off[i] = c.row_offset(p, t, row0 + 32 * i, BN);
        mbarrier_wait(empty_k(st), free_parity);
        gather(k_g, k_dst, full_k(st));
        mbarrier_wait(empty_v(st), free_parity);
        gather(v_g, v_dst, full_v(st));
      }
    }
    cp_async_wait<0>();  // nothing in flight when the warp exits
  } else {
    setmaxnreg_inc<prefill_wgmma_ws_policy::math_registers>();
    const int math_wg = wg - 1;
    const int warp_row0 = (warp - 4) * 16;  // = 64 math_wg + 16 (warp % 4): the warp's rows
    const int tig = lane % 4;
    if (num_tiles > 0) {
      mbarrier_wait(full_q, 0);  // the copier's Q tile (the first iteration's fence covers cp.async)
      // The scheduler barrier: warpgroup 0 issues first.
      if (math_wg == 1) named_barrier_arrive(3, 256);
    }

    prefill_wgmma_softmax sm;
    sm.init(p, plan, c, warp_row0 + lane / 4);
    float o[D / 2];
    float s[BN / 2];
    std::uint32_t pf[BN / 16][4];  // P of the previous tile: the A fragments of O += P V
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    const auto q_desc = [&](int ks) {
      return wgmma_desc_sw128(q_addr + (ks / 4) * (BM * 128) + math_wg * 64 * 128 + (ks % 4) * 32, 16, 1024);
    };
    const auto k_desc = [&](int st, int ks) {
      return wgmma_desc_sw128(k_addr + st * smem_t::tile_bytes + (ks / 4) * (BN * 128) + (ks % 4) * 32, 16, 1024);
    };
    const auto v_desc = [&](int st, int kk) {
      return wgmma_desc_sw128(v_addr + st * smem_t::tile_bytes + kk * 16 * 128, BN * 128, 1024);
    };
    // My turn to issue (barrier 3 for warpgroup 0, 4 for 1), then the other's.
    const auto my_turn = [&] {
      if (math_wg == 0) named_barrier_sync(3, 256);
      else named_barrier_sync(4, 256);
    };
    const auto your_turn = [&] {
      if (math_wg == 0) named_barrier_arrive(4, 256);
      else named_barrier_arrive(3, 256);
    };
    // Iteration t: S_t (HasS) and O += P_(t-1) V_(t-1) (HasPv), straight-line code for each pair.
    const auto iteration = [&]<bool HasS, bool HasPv>(int t) {
      if constexpr (HasS) mbarrier_wait(full_k(t % 2), unsigned(t / 2) & 1u);
      if constexpr (HasPv) mbarrier_wait(full_v((t - 1) % 2), unsigned((t - 1) / 2) & 1u);
      fence_proxy_async_shared();  // the cp.async copies' bytes visible to wgmma
      my_turn();
      wgmma_fence();
      if constexpr (HasS) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) wgmma_m64n128k16_ss<T>(s, q_desc(ks), k_desc(t % 2, ks), ks > 0);
        wgmma_commit();
      }
      if constexpr (HasPv) {
        sm.rescale(o);  // to tile t - 1's maxima while the tensor cores compute S_t
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_m64n128k16_rs<T>(o, pf[kk], v_desc((t - 1) % 2, kk));
        wgmma_commit();
      }
      // Warpgroup 1's last turn has no one to hand over to (warpgroup 0 has finished issuing).
      if (HasS || math_wg == 0) your_turn();
      if constexpr (HasS) {
        if constexpr (HasPv) wgmma_wait<1>();
        else wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) wgmma_pin(s[i]);
        mbarrier_arrive(empty_k(t % 2));
        sm.tile(s, p, c, c.begin + t * BN, tig);
      }
      if constexpr (HasPv) {
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < D / 2; ++i) wgmma_pin(o[i]);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i) wgmma_pin(pf[kk][i]);  // read by the P V just finished: live until here
        mbarrier_arrive(empty_v((t - 1) % 2));
      }
      if constexpr (HasS) prefill_wgmma_pack_p<T>(pf, s);
    };
    if (num_tiles > 0) {
      iteration.template operator()<true, false>(0);
      for (int t = 1; t < num_tiles; ++t) iteration.template operator()<true, true>(t);
      iteration.template operator()<false, true>(num_tiles);
    }
    // This warpgroup's wgmmas have finished: its Q rows take the output.
    prefill_wgmma_store<T, BM>(p, plan, c, sm, o, smem, warp_row0, lane, part_o, part_lse,
                               maps.o_tokens > 0 ? &maps.o : nullptr);
  }
#else
  (void)p, (void)plan, (void)part_o, (void)part_lse, (void)maps;
  __trap();  // built without sm_90a: plan_prefill never picks this kernel there
#endif
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
