// Host references of write_kv, copy_blocks and swap_blocks, and the swap plan's run merging.
#include <gtest/gtest.h>

#include <random>
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
