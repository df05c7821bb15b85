// The wgmma prefill's body (sm_90a, head_dim 128, q and KV of one 16-bit type): the rows, tiles,
// softmax and outputs of prefill_wgmma.cuh, warp-specialised as in FlashAttention-3. Warpgroup 0
// copies and does nothing else (setmaxnreg down): K and V of each 128-key tile into two stages
// each, by the bulk tensor copy where the pool's page runs allow (one lane's expect_tx on the
// stage's "full" mbarrier) and otherwise by cp.async through the block table (each thread's
// copies completing on the "full" mbarrier by cp.async.mbarrier.arrive.noinc), the block-table
// reads with them. Warpgroups 1 and 2 compute 64 query rows each (setmaxnreg up): S_t and O +=
// P_(t-1) V_(t-1) issued together, then the softmax of S_t, waiting on "full" mbarriers and
// releasing stages on "empty" ones: no CTA barrier a tile. The two take turns issuing their wgmmas
// (FlashAttention-3's scheduler barrier: named barriers around the issue only), so that one's
// softmax runs while the tensor cores hold the other's GEMMs. Against the earlier body without
// warp specialisation: 1.31-1.45x on the issue-21 shapes (docs/journal/prefill-kernel.md,
// session 4).
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
/// for the output rows; two of them on a persistent grid, an item's and the next's), two K and two
/// V stages (prefill_wgmma_smem's tile layout), then the mbarriers: full K, full V, empty K, empty
/// V, a stage each; on a persistent grid then the two work-item slots' full and empty mbarriers
/// and the two slots.
template <bool Persistent = false>
struct prefill_wgmma_ws_smem {
  static constexpr int stages = 2, q_buffers = Persistent ? 2 : 1;
  static constexpr unsigned q_bytes = prefill_wgmma_smem::q_bytes;
  static constexpr unsigned tile_bytes = prefill_wgmma_smem::tile_bytes;
  static constexpr unsigned k_offset = q_buffers * q_bytes;
  static constexpr unsigned v_offset = k_offset + stages * tile_bytes;
  static constexpr unsigned bar_offset = v_offset + stages * tile_bytes;
  static constexpr unsigned item_offset = bar_offset + (4 * stages + (Persistent ? 4 : 0)) * sizeof(std::uint64_t);
  static constexpr std::size_t bytes = item_offset + (Persistent ? 2 * sizeof(int) : 0) + 1024;
};

/// Threads of the warp-specialised CTA (a copying warpgroup and prefill_wgmma_policy's two), and
/// the registers a thread of each role keeps (setmaxnreg): 128 x 40 + 256 x 232 = 64,512 of the
/// SM's 65,536.
struct prefill_wgmma_ws_policy {
  static constexpr int threads = prefill_wgmma_policy::threads + 128;
  static constexpr int copy_registers = 40, math_registers = 232;
};

/// The launch facts' key of prefill_wgmma_ws_kernel<T, Tma, Persistent>.
template <class T, bool Tma, int Persistent>
struct prefill_wgmma_ws_tag {};

/// The wgmma body for one (sequence, query tile, KV head, split); outputs as
/// prefill_mma_kernel's. Tma: tiles whose start is a multiple of maps.rows and that lie wholly
/// before the CTA's range end come by the bulk tensor copy (lane i < 128 / maps.rows of the
/// copying warp 0 one page run, two boxes of 64 dims), the others (the range's last tile, a CTA
/// whose range starts mid-run, every tile where maps.rows is 0) by cp.async, whose zero fill keeps
/// rows past the range out of P V.
/// Persistent: a grid of at most one CTA an SM, each taking prefill_grid's CTAs as work items in
/// the hardware's order from the atomic counter *item_counter (zero at the launch; its first item
/// its own index).
/// Thread 0 takes item j + 1 as soon as it has read item j (Persistent 1) or once it has issued
/// item j's last tile (2) and passes each through two shared slots (full and empty mbarriers); the stage mbarriers' phases count on across items, so the
/// copier runs into the next item's K/V tiles while the computing warpgroups finish; these load
/// the next item's Q into the other Q tile under the item's last P V.
template <class T, bool Tma, int Persistent = 0>
__global__ void __launch_bounds__(prefill_wgmma_ws_policy::threads, 1)
    prefill_wgmma_ws_kernel(const attention_params p, const prefill_plan plan, T* part_o, float* part_lse,
                            const __grid_constant__ kv_tensor_maps maps, unsigned* item_counter) {
#if PAGEDKV_WGMMA_COMPILED
  using smem_t = prefill_wgmma_ws_smem<Persistent != 0>;
  using tile_t = prefill_wgmma_smem;
  constexpr int BM = prefill_wgmma_policy::q_rows, BN = prefill_wgmma_policy::kv_tokens;
  constexpr int D = prefill_wgmma_policy::head_dim, chunks = D / 8;

  wait_for_the_grid_before();
  let_dependents_launch();
  prefill_wgmma_cta c;
  if (!Persistent && !c.make(p, plan, BM, BN)) return;
  const int items = Persistent ? plan.num_seqs * plan.q_tiles_per_seq * p.num_kv_heads * plan.num_splits : 1;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = prefill_wgmma_smem_base(smem_raw);
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned k_addr = base + smem_t::k_offset, v_addr = base + smem_t::v_offset;
  const unsigned bars = base + smem_t::bar_offset;
  const auto full_k = [&](int st) { return bars + 8u * unsigned(st); };
  const auto full_v = [&](int st) { return bars + 8u * unsigned(smem_t::stages + st); };
  const auto empty_k = [&](int st) { return bars + 8u * unsigned(2 * smem_t::stages + st); };
  const auto empty_v = [&](int st) { return bars + 8u * unsigned(3 * smem_t::stages + st); };
  const auto item_full = [&](int j) { return bars + 8u * unsigned(4 * smem_t::stages + j % 2); };
  const auto item_empty = [&](int j) { return bars + 8u * unsigned(4 * smem_t::stages + 2 + j % 2); };
  volatile int* const item_slots = reinterpret_cast<volatile int*>(smem + smem_t::item_offset);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, wg = warp / 4;
  if (tid == 0) {
    for (int st = 0; st < smem_t::stages; ++st) {
      mbarrier_init(full_k(st), 128);  // every copying thread, one the bytes' expect_tx on TMA tiles
      mbarrier_init(full_v(st), 128);
      mbarrier_init(empty_k(st), 256);  // every computing thread once its wgmmas have read the stage
      mbarrier_init(empty_v(st), 256);
    }
    if constexpr (Persistent)
      for (int j = 0; j < 2; ++j) {
        mbarrier_init(item_full(j), 1);  // thread 0, once it wrote the slot
        mbarrier_init(item_empty(j), prefill_wgmma_ws_policy::threads);  // every thread, once it read it
      }
  }
  __syncthreads();
  // Persistent: thread 0 posts item j (once every thread read item j - 2); every thread reads each
  // item, the same in a warp (broadcast, so that what follows from it stays warp-uniform).
  const auto post_item = [&](int j, int w) {
    mbarrier_wait(item_empty(j), (unsigned(j / 2) & 1u) ^ 1u);
    item_slots[j % 2] = w;
    mbarrier_arrive(item_full(j));
  };
  const auto read_item = [&](int j) {
    mbarrier_wait(item_full(j), unsigned(j / 2) & 1u);
    const int w = item_slots[j % 2];
    mbarrier_arrive(item_empty(j));
    return __shfl_sync(0xffffffffu, w, 0);
  };

  if (wg == 0) {
    setmaxnreg_dec<prefill_wgmma_ws_policy::copy_registers>();
    const auto* k_g = static_cast<const T*>(p.k);
    const auto* v_g = static_cast<const T*>(p.v);
    const int run_rows = Tma && maps.rows > 0 ? maps.rows : BN;
    const bool tma_lane = warp == 0 && lane < BN / run_rows;
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
    // TMA: lane `lane` of warp 0 copies run `lane` (rows lane * run_rows ..) of the tile.
    const auto boxes = [&](const CUtensorMap* map, unsigned dst_base, unsigned full, int blk, int slot) {
      if (tid == 0) mbarrier_arrive_expect_tx(full, smem_t::tile_bytes);
      else mbarrier_arrive(full);
      __syncwarp();
      if (tma_lane) {
        const unsigned dst = dst_base + lane * run_rows * 128;
        tma_load_4d(dst, map, 0, slot, c.kv_head, blk, full);
        tma_load_4d(dst + BN * 128, map, 64, slot, c.kv_head, blk, full);
      }
    };
    int used = 0;  // stage uses of the earlier items
    for (int j = 0;; ++j) {
      if constexpr (Persistent) {
        if (tid == 0 && j == 0) post_item(0, int(blockIdx.x));
        const int w = read_item(j);
        if (w >= items) break;
        const bool rows = c.make_item(p, plan, BM, BN, w);
        if (tid == 0 && (Persistent == 1 || !rows)) post_item(j + 1, int(gridDim.x + atomicAdd(item_counter, 1u)));
        if (!rows) continue;
      }
      const int num_tiles = Persistent ? __shfl_sync(0xffffffffu, c.num_tiles, 0) : c.num_tiles;
      const bool tma_cta = Tma && maps.rows > 0 && c.begin % run_rows == 0;
      for (int t = 0; t < num_tiles; ++t) {
        const int u = used + t, st = u % smem_t::stages;
        const unsigned free_parity = ((u / smem_t::stages) & 1u) ^ 1u;  // use u waits for release u - 1
        const unsigned k_dst = k_addr + st * smem_t::tile_bytes, v_dst = v_addr + st * smem_t::tile_bytes;
        if (tma_cta && c.begin + (t + 1) * BN <= c.end) {
          int blk = 0, slot = 0;
          if (tma_lane) {
            const int token = c.begin + t * BN + lane * run_rows;
            const int jb = token / p.table.block_size;
            slot = token - jb * p.table.block_size;
            blk = c.seq_blocks[jb];
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
      if constexpr (!Persistent) break;
      if (Persistent == 2 && tid == 0) post_item(j + 1, int(gridDim.x + atomicAdd(item_counter, 1u)));
      used += num_tiles;
    }
    cp_async_wait<0>();  // nothing in flight when the warp exits
  } else {
    setmaxnreg_inc<prefill_wgmma_ws_policy::math_registers>();
    const int math_wg = wg - 1;
    const int warp_row0 = (warp - 4) * 16;  // = 64 math_wg + 16 (warp % 4): the warp's rows
    const int tig = lane % 4;
    const auto* q_g = static_cast<const T*>(p.q);
    // Persistent: a thread index ptxas cannot see through, so that what an item computes from it
    // is computed in the item, not kept (spilled) across the item loop.
    const auto opaque = [](int v) {
      if constexpr (Persistent) asm volatile("" : "+r"(v));
      return v;
    };
    const auto load_q = [&](const prefill_wgmma_cta& cq, unsigned char* q_tile) {  // this warpgroup's 64 rows
      const int x = opaque(tid % 128);
#pragma unroll
      for (int i = 0; i < 64 * chunks / 128; ++i) {
        const int ci = x + i * 128;
        const int r = 64 * math_wg + ci / chunks, ch = ci % chunks;
        const bool valid = cq.row0 + r < cq.rows_total;
        cp_async_16(q_tile + tile_t::at(BM, r, ch), q_g + (valid ? cq.out_row(p, r) * D + ch * 8 : 0), valid);
      }
      cp_async_commit();
    };
    // Persistent: reads items j, j + 1, ... into cq until one has rows; false once none is left.
    const auto next_item = [&](int& j, prefill_wgmma_cta& cq) {
      for (;; ++j) {
        const int w = read_item(j);
        if (w >= items) return false;
        if (cq.make_item(p, plan, BM, BN, w)) return true;
      }
    };
    int j = 0, qb = 0, used = 0;  // the item's slot, its Q tile, the stage uses of the earlier items
    bool more = true;
    if constexpr (Persistent) {
      more = next_item(j, c);
      if (more) load_q(c, smem);
    }
    prefill_wgmma_cta next;  // persistent: the item after c, and whether there is one
    bool more_next = false;
    // Persistent: the next item and its Q into the other Q tile (its last reader, the item before
    // this one, has stored its output: this warpgroup's barrier at this item's start).
    const auto prefetch_next = [&] {
      if constexpr (Persistent) {
        ++j;
        more_next = next_item(j, next);
        if (more_next) load_q(next, smem + (qb ^ 1) * smem_t::q_bytes);
      }
    };
    while (more) {
      unsigned char* const q_tile = smem + qb * smem_t::q_bytes;
      const unsigned q_addr = base + unsigned(qb) * smem_t::q_bytes;
      const int num_tiles = Persistent ? __shfl_sync(0xffffffffu, c.num_tiles, 0) : c.num_tiles;
      if constexpr (Persistent) {  // this item's Q, loaded before (and every other row's writer done)
        cp_async_wait<0>();
        fence_proxy_async_shared();
        if (math_wg == 0) named_barrier_sync(1, 128);
        else named_barrier_sync(2, 128);
        if (num_tiles > 0 && math_wg == 1) named_barrier_arrive(3, 256);  // the scheduler barrier: warpgroup 0 first
      } else if (num_tiles > 0) {  // this warpgroup's 64 Q rows, read only by its own wgmmas
        load_q(c, q_tile);
        cp_async_wait<0>();
        fence_proxy_async_shared();
        if (math_wg == 0) named_barrier_sync(1, 128);  // constant ids: ptxas counts the barriers used
        else named_barrier_sync(2, 128);
        // The scheduler barrier: warpgroup 0 issues first.
        if (math_wg == 1) named_barrier_arrive(3, 256);
      }

      prefill_wgmma_softmax sm;
      sm.init(p, c, warp_row0 + lane / 4);
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
        const int u = used + t;  // the stage use of tile t
        if constexpr (HasS) mbarrier_wait(full_k(u % 2), unsigned(u / 2) & 1u);
        if constexpr (HasPv) mbarrier_wait(full_v((u - 1) % 2), unsigned((u - 1) / 2) & 1u);
        fence_proxy_async_shared();  // the cp.async copies' bytes visible to wgmma
        my_turn();
        wgmma_fence();
        if constexpr (HasS) {
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) wgmma_m64n128k16_ss<T>(s, q_desc(ks), k_desc(u % 2, ks), ks > 0);
          wgmma_commit();
        }
        if constexpr (HasPv) {
          sm.rescale(o);  // to tile t - 1's maxima while the tensor cores compute S_t
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) wgmma_m64n128k16_rs<T>(o, pf[kk], v_desc((u - 1) % 2, kk));
          wgmma_commit();
        }
        // Warpgroup 1's last turn has no one to hand over to (warpgroup 0 has finished issuing).
        if (HasS || math_wg == 0) your_turn();
        if constexpr (!HasS) prefetch_next();  // under the item's last P V
        if constexpr (HasS) {
          if constexpr (HasPv) wgmma_wait<1>();
          else wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) wgmma_pin(s[i]);
          mbarrier_arrive(empty_k(u % 2));
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
          mbarrier_arrive(empty_v((u - 1) % 2));
        }
        if constexpr (HasS) prefill_wgmma_pack_p<T>(pf, s);
      };
      if (num_tiles > 0) {
        iteration.template operator()<true, false>(0);
        for (int t = 1; t < num_tiles; ++t) iteration.template operator()<true, true>(t);
        iteration.template operator()<false, true>(num_tiles);
      } else {
        prefetch_next();
      }
      // This warpgroup's wgmmas have finished: its Q rows take the output.
      prefill_wgmma_store<T, BM>(p, plan, c, sm, o, q_tile, opaque(warp_row0), opaque(lane), part_o, part_lse);
      if constexpr (!Persistent) break;
      more = more_next;
      c = next;
      qb = __shfl_sync(0xffffffffu, qb ^ 1, 0);
      used = __shfl_sync(0xffffffffu, used + num_tiles, 0);
    }
  }
#else
  (void)p, (void)plan, (void)part_o, (void)part_lse, (void)maps, (void)item_counter;
  __trap();  // built without sm_90a: plan_prefill never picks this kernel there
#endif
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
