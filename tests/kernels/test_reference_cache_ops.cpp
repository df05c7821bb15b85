// Host references of write_kv, copy_blocks, swap_blocks and pack_blocks / unpack_blocks, the swap
// plan's run merging and the staged swap's plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <pagedkv/reference/cache_ops.hpp>

#include "attention_case.hpp"

namespace pk = pagedkv::kernels;
using pk::testing::load_as;
using pk::testing::store_as;

namespace {

struct pool {
  pk::kv_cache_layout layout;
  std::vector<unsigned char> bytes;
  pool(pk::kv_cache_shape shape, pk::kv_layout layout_kind, pk::dtype t, pk::layer_order order)
      : layout(pk::make_kv_cache_layout(shape, layout_kind, t, order)), bytes(layout.size_bytes()) {}
  float at(std::int64_t i) const { return load_as(layout.kv_dtype, bytes.data(), std::size_t(i)); }
};

}  // namespace

TEST(ReferenceCacheOps, WriteKvScattersBySlotAndSkipsPadding) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (auto kind : {pk::kv_layout::nhd, pk::kv_layout::hnd})
    for (auto [src_t, pool_t] : {std::pair{pk::dtype::f32, pk::dtype::f32}, std::pair{pk::dtype::bf16, pk::dtype::bf16},
                                 std::pair{pk::dtype::f16, pk::dtype::fp8_e4m3}}) {
      pool p({2, 6, 7, 3, 16}, kind, pool_t, pk::layer_order::block_major);
      pk::testing::poison(pool_t, p.bytes.data(), std::size_t(p.layout.size()));
      const std::vector<pagedkv::slot_id> slots = {0, 41, -1, 13, 6, 7, -1, 20};
      const int n = int(slots.size()), hd = 3 * 16;
      std::vector<unsigned char> k(std::size_t(n * hd) * pk::size_of(src_t)), v(k.size());
      for (int i = 0; i < n * hd; ++i) {
        store_as(src_t, k.data(), std::size_t(i), normal(rng));
        store_as(src_t, v.data(), std::size_t(i), normal(rng));
      }
      pk::write_kv_params w;
      w.k_new = k.data();
      w.v_new = v.data();
      w.slot_mapping = slots.data();
      w.pool = p.bytes.data();
      w.layout = p.layout;
      w.num_tokens = n;
      w.layer = 1;
      w.src_dtype = src_t;
      w.k_scale = pool_t == pk::dtype::fp8_e4m3 ? 0.25f : 1.0f;
      w.v_scale = pool_t == pk::dtype::fp8_e4m3 ? 0.5f : 1.0f;
      pk::reference::write_kv(w);
      std::size_t written = 0;
      for (int t = 0; t < n; ++t) {
        if (slots[std::size_t(t)] < 0) continue;
        for (int h = 0; h < 3; ++h)
          for (int d = 0; d < 16; ++d) {
            const float kx = load_as(src_t, k.data(), std::size_t(t * hd + h * 16 + d));
            const float vx = load_as(src_t, v.data(), std::size_t(t * hd + h * 16 + d));
            const float want_k = pool_t == pk::dtype::fp8_e4m3 ? pk::host::to_float(pk::host::to_fp8_e4m3(kx / 0.25f)) : kx;
            const float want_v = pool_t == pk::dtype::fp8_e4m3 ? pk::host::to_float(pk::host::to_fp8_e4m3(vx / 0.5f)) : vx;
            ASSERT_EQ(p.at(p.layout.slot_offset(1, 0, slots[std::size_t(t)], h) + d), want_k);
            ASSERT_EQ(p.at(p.layout.slot_offset(1, 1, slots[std::size_t(t)], h) + d), want_v);
            written += 2;
          }
      }
      std::size_t finite = 0;
      for (std::int64_t i = 0; i < p.layout.size(); ++i) finite += std::isfinite(p.at(i)) ? 1 : 0;
      EXPECT_EQ(finite, written);  // nothing else was touched (padding slots were skipped)
    }
}

TEST(ReferenceCacheOps, WriteKvRejectsASlotOutsideThePool) {
  pool p({1, 2, 4, 1, 8}, pk::kv_layout::nhd, pk::dtype::f32, pk::layer_order::layer_major);
  std::vector<float> k(8), v(8);
  const pagedkv::slot_id slot = 8;
  pk::write_kv_params w{k.data(), v.data(), &slot, p.bytes.data(), p.layout, 0, 1, 0, pk::dtype::f32};
  EXPECT_THROW(pk::reference::write_kv(w), pagedkv::error);
}

TEST(ReferenceCacheOps, CopyBlocksCopiesEveryLayerKAndV) {
  for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major}) {
    pool p({3, 8, 5, 2, 8}, pk::kv_layout::hnd, pk::dtype::f32, order);
    for (std::int64_t i = 0; i < p.layout.size(); ++i) reinterpret_cast<float*>(p.bytes.data())[i] = float(i);
    const auto before = p.bytes;
    const std::vector<pagedkv::block_id> pairs = {1, 4, 6, 2, 1, 7};
    pk::reference::copy_blocks({pairs.data(), p.bytes.data(), p.layout, 3});
    for (int layer = 0; layer < 3; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (int b = 0; b < 8; ++b) {
          const int src = b == 4 ? 1 : b == 2 ? 6 : b == 7 ? 1 : b;
          for (std::int64_t e = 0; e < p.layout.block_elems(); ++e)
            ASSERT_EQ(p.at(p.layout.offset(layer, kv, b, 0, 0) + e),
                      reinterpret_cast<const float*>(before.data())[p.layout.offset(layer, kv, src, 0, 0) + e]);
        }
    const std::vector<pagedkv::block_id> bad = {0, 8};
    EXPECT_THROW(pk::reference::copy_blocks({bad.data(), p.bytes.data(), p.layout, 1}), pagedkv::error);
  }
}

TEST(ReferenceCacheOps, SwapPlanMergesContiguousRuns) {
  const pk::kv_cache_shape shape{4, 16, 16, 2, 64};
  const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> pairs = {{5, 2}, {3, 0}, {4, 1}, {9, 7}, {10, 3}};
  const auto bm = pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::bf16, pk::layer_order::block_major);
  const auto bm_plan = pk::plan_swap(bm, bm, pairs);
  ASSERT_EQ(bm_plan.size(), 3u);  // {3,4,5}->{0,1,2}, {9}->{7}, {10}->{3}
  EXPECT_EQ(bm_plan[0], (pk::copy_range{3 * bm.bytes_per_block(), 0, 3 * bm.bytes_per_block()}));
  const auto lm = pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::bf16, pk::layer_order::layer_major);
  EXPECT_EQ(pk::plan_swap(lm, lm, pairs).size(), 3u * 4 * 2);
  auto other = shape;
  other.head_dim = 128;
  EXPECT_THROW((void)pk::plan_swap(lm, pk::make_kv_cache_layout(other, pk::kv_layout::nhd, pk::dtype::bf16), pairs),
               pagedkv::error);
  const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> bad = {{16, 0}};
  EXPECT_THROW((void)pk::plan_swap(lm, lm, bad), pagedkv::error);
}

TEST(ReferenceCacheOps, SwapMovesBlocksBetweenPoolsOfDifferentCapacity) {
  for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major}) {
    pool device({2, 10, 3, 2, 8}, pk::kv_layout::nhd, pk::dtype::f32, order);
    pool host({2, 4, 3, 2, 8}, pk::kv_layout::nhd, pk::dtype::f32, order);
    for (std::int64_t i = 0; i < device.layout.size(); ++i) reinterpret_cast<float*>(device.bytes.data())[i] = float(i);
    const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> out = {{7, 0}, {8, 1}, {2, 3}};
    pk::reference::swap_blocks(device.layout, device.bytes.data(), host.layout, host.bytes.data(), out);
    pool back({2, 10, 3, 2, 8}, pk::kv_layout::nhd, pk::dtype::f32, order);
    const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> in = {{0, 7}, {1, 8}, {3, 2}};
    pk::reference::swap_blocks(host.layout, host.bytes.data(), back.layout, back.bytes.data(), in);
    for (int layer = 0; layer < 2; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (int b : {2, 7, 8})
          for (std::int64_t e = 0; e < device.layout.block_elems(); ++e)
            ASSERT_EQ(back.at(back.layout.offset(layer, kv, b, 0, 0) + e),
                      device.at(device.layout.offset(layer, kv, b, 0, 0) + e));
  }
}

TEST(ReferenceCacheOps, SwapBetweenLayerOrdersCopiesEachPiece) {
  const pk::kv_cache_shape shape{3, 9, 5, 2, 8};
  const auto lm = pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::f32, pk::layer_order::layer_major);
  auto host_shape = shape;
  host_shape.num_blocks = 6;
  const auto bm = pk::make_kv_cache_layout(host_shape, pk::kv_layout::nhd, pk::dtype::f32, pk::layer_order::block_major);
  const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> pairs = {{4, 1}, {5, 2}, {0, 5}};
  EXPECT_EQ(pk::plan_swap(lm, bm, pairs).size(), 3u * 3 * 2);  // a range per (block, layer, kv)
  std::vector<float> device(std::size_t(lm.size())), host(std::size_t(bm.size()), -1.0f);
  std::iota(device.begin(), device.end(), 0.0f);
  pk::reference::swap_blocks(lm, device.data(), bm, host.data(), pairs);
  for (const auto& [d, h] : pairs)
    for (int layer = 0; layer < 3; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (std::int64_t e = 0; e < lm.block_elems(); ++e)
          ASSERT_EQ(host[std::size_t(bm.offset(layer, kv, h, 0, 0) + e)], device[std::size_t(lm.offset(layer, kv, d, 0, 0) + e)]);
}

namespace {

/// A staged swap on the host, as staged_swap runs it on the GPU: per chunk of plan_staged_swap,
/// pack_blocks into one staging buffer, then its ranges to the host pool (or the reverse).
void staged_swap_on_host(const pk::kv_cache_layout& pool_layout, std::vector<unsigned char>& pool,
                         const pk::kv_cache_layout& host_layout, std::vector<unsigned char>& host,
                         std::span<const std::pair<pagedkv::block_id, pagedkv::block_id>> pairs, std::int32_t chunk,
                         bool to_host) {
  std::vector<unsigned char> staging(std::size_t(chunk) * pool_layout.bytes_per_block(), 0xee);
  for (const pk::staged_chunk& c : pk::plan_staged_swap(pool_layout, host_layout, pairs, chunk)) {
    ASSERT_LE(c.pool_blocks.size(), std::size_t(chunk));
    pk::stage_blocks_params p;
    p.pool = pool.data();
    p.staging = staging.data();
    p.layout = pool_layout;
    p.num_blocks = std::int32_t(c.pool_blocks.size());
    std::copy(c.pool_blocks.begin(), c.pool_blocks.end(), p.blocks);
    if (to_host) pk::reference::pack_blocks(p);
    for (const pk::staging_range& r : c.ranges) {
      ASSERT_LE(r.staging_offset_bytes + r.bytes, c.pool_blocks.size() * pool_layout.bytes_per_block());
      ASSERT_LE(r.host_offset_bytes + r.bytes, host.size());
      if (to_host) std::memcpy(host.data() + r.host_offset_bytes, staging.data() + r.staging_offset_bytes, r.bytes);
      else std::memcpy(staging.data() + r.staging_offset_bytes, host.data() + r.host_offset_bytes, r.bytes);
    }
    if (!to_host) pk::reference::unpack_blocks(p);
  }
}

}  // namespace

// Odd sizes: 1 to 3 layers, blocks of 1, 3 and 7 tokens, 5 heads of head_dim 6, chunks of 1 block
// to more than the batch; fresh random bytes and shuffled ids (runs of consecutive host ids now
// and then) each case. The staged swap must equal the direct one, byte for byte, both ways.
TEST(ReferenceCacheOps, StagedSwapEqualsTheDirectSwapOnOddSizes) {
  std::mt19937_64 rng(std::random_device{}());
  for (int layers : {1, 3})
    for (int bs : {1, 3, 7})
      for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major})
        for (std::int32_t chunk : {1, 2, 5, 64}) {
          SCOPED_TRACE("layers " + std::to_string(layers) + " bs " + std::to_string(bs) + " chunk " + std::to_string(chunk) +
                       (order == pk::layer_order::block_major ? " block_major pool" : " layer_major pool"));
          const pk::kv_cache_shape shape{layers, 23, bs, 5, 6};
          const auto pool_layout = pk::make_kv_cache_layout(shape, pk::kv_layout::hnd, pk::dtype::bf16, order);
          auto host_shape = shape;
          host_shape.num_blocks = 17;
          const auto host_layout =
              pk::make_kv_cache_layout(host_shape, pk::kv_layout::hnd, pk::dtype::bf16, pk::layer_order::block_major);
          std::vector<unsigned char> pool(pool_layout.size_bytes()), host(host_layout.size_bytes(), 0x11);
          for (auto& b : pool) b = static_cast<unsigned char>(rng());
          std::vector<pagedkv::block_id> device_ids(23), host_ids(17);
          std::iota(device_ids.begin(), device_ids.end(), 0);
          std::iota(host_ids.begin(), host_ids.end(), 0);
          std::shuffle(device_ids.begin(), device_ids.end(), rng);
          if (rng() % 2) std::shuffle(host_ids.begin(), host_ids.end(), rng);  // else runs of consecutive host ids
          const std::size_t n = 1 + rng() % 13;
          std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> out, in;
          for (std::size_t i = 0; i < n; ++i) {
            out.emplace_back(device_ids[i], host_ids[i]);
            in.emplace_back(host_ids[i], device_ids[22 - i]);  // back into other device blocks
          }
          std::vector<unsigned char> want_host = host;
          pk::reference::swap_blocks(pool_layout, pool.data(), host_layout, want_host.data(), out);
          staged_swap_on_host(pool_layout, pool, host_layout, host, out, chunk, true);
          ASSERT_EQ(host, want_host);
          std::vector<unsigned char> want_pool = pool;
          pk::reference::swap_blocks(host_layout, host.data(), pool_layout, want_pool.data(), in);
          std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> in_as_pool_host;
          for (const auto& [h, d] : in) in_as_pool_host.emplace_back(d, h);
          staged_swap_on_host(pool_layout, pool, host_layout, host, in_as_pool_host, chunk, false);
          ASSERT_EQ(pool, want_pool);
        }
}

TEST(ReferenceCacheOps, StagedSwapPlanMergesHostRunsAndRefusesBadInput) {
  const pk::kv_cache_shape shape{2, 16, 4, 2, 8};
  const auto lm = pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::f16, pk::layer_order::layer_major);
  const auto bm = pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::f16, pk::layer_order::block_major);
  const std::size_t block = bm.bytes_per_block();
  // Host blocks 3, 4, 5 and 9, 10: two runs, split where the chunk of 4 ends.
  const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> pairs = {{7, 10}, {1, 4}, {0, 3}, {12, 9}, {2, 5}};
  const auto chunks = pk::plan_staged_swap(lm, bm, pairs, 4);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].pool_blocks, (std::vector<pagedkv::block_id>{0, 1, 2, 12}));
  ASSERT_EQ(chunks[0].ranges.size(), 2u);
  EXPECT_EQ(chunks[0].ranges[0], (pk::staging_range{0, 3 * block, 3 * block}));
  EXPECT_EQ(chunks[0].ranges[1], (pk::staging_range{3 * block, 9 * block, block}));
  EXPECT_EQ(chunks[1].pool_blocks, (std::vector<pagedkv::block_id>{7}));
  EXPECT_EQ(chunks[1].ranges, (std::vector<pk::staging_range>{{0, 10 * block, block}}));
  EXPECT_TRUE(pk::plan_staged_swap(lm, bm, {}, 4).empty());
  const auto code_of = [](const auto& call) {
    try {
      call();
    } catch (const pagedkv::error& e) {
      return e.code();
    }
    return pagedkv::errc{};
  };
  EXPECT_EQ(code_of([&] { (void)pk::plan_staged_swap(lm, lm, pairs, 4); }), pagedkv::errc::invalid_argument);  // host not block_major
  EXPECT_EQ(code_of([&] { (void)pk::plan_staged_swap(lm, bm, pairs, 0); }), pagedkv::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { (void)pk::plan_staged_swap(lm, bm, pairs, pk::max_stage_blocks + 1); }),
            pagedkv::errc::invalid_argument);
  const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> twice = {{0, 3}, {1, 3}};
  EXPECT_EQ(code_of([&] { (void)pk::plan_staged_swap(lm, bm, twice, 4); }), pagedkv::errc::invalid_argument);
  const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> outside = {{16, 0}};
  EXPECT_EQ(code_of([&] { (void)pk::plan_staged_swap(lm, bm, outside, 4); }), pagedkv::errc::invalid_block);
  auto other = shape;
  other.head_dim = 16;
  EXPECT_EQ(code_of([&] {
              (void)pk::plan_staged_swap(lm, pk::make_kv_cache_layout(other, pk::kv_layout::nhd, pk::dtype::f16,
                                                                      pk::layer_order::block_major), pairs, 4);
            }),
            pagedkv::errc::invalid_argument);
  pk::stage_blocks_params p;
  std::vector<unsigned char> pool_bytes(lm.size_bytes()), staging(block);
  p.pool = pool_bytes.data();
  p.staging = staging.data();
  p.layout = lm;
  p.num_blocks = 1;
  p.blocks[0] = 16;
  EXPECT_EQ(code_of([&] { pk::reference::pack_blocks(p); }), pagedkv::errc::invalid_block);
  p.num_blocks = pk::max_stage_blocks + 1;
  EXPECT_EQ(code_of([&] { pk::reference::unpack_blocks(p); }), pagedkv::errc::invalid_argument);
}
