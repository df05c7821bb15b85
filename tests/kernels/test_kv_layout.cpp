// The KV layout descriptor: every coordinate maps inside the allocation without collisions
// (CuTe's test of a layout), the block-major order keeps a block contiguous across layers,
// shape:stride printing, budget sizing and errors.
#include <gtest/gtest.h>

#include <vector>

#include <pagedkv/kv_layout.hpp>

namespace pk = pagedkv::kernels;

TEST(KvLayout, EveryCoordinateMapsInsideWithoutCollision) {
  for (auto layout : {pk::kv_layout::nhd, pk::kv_layout::hnd})
    for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major})
      for (pk::kv_cache_shape shape : {pk::kv_cache_shape{1, 1, 1, 1, 1}, pk::kv_cache_shape{3, 5, 7, 2, 8},
                                       pk::kv_cache_shape{2, 4, 16, 3, 64}, pk::kv_cache_shape{1, 2, 17, 5, 80}}) {
        const auto l = pk::make_kv_cache_layout(shape, layout, pk::dtype::bf16, order);
        SCOPED_TRACE(pk::to_string(l));
        std::vector<int> hits(std::size_t(l.size()), 0);
        for (int layer = 0; layer < shape.num_layers; ++layer)
          for (int kv = 0; kv < 2; ++kv)
            for (int b = 0; b < shape.num_blocks; ++b)
              for (int t = 0; t < shape.block_size; ++t)
                for (int h = 0; h < shape.num_kv_heads; ++h)
                  for (int d = 0; d < shape.head_dim; ++d) {
                    const auto off = l.offset(layer, kv, b, t, h) + d;
                    ASSERT_GE(off, 0);
                    ASSERT_LT(off, l.size());
                    ++hits[std::size_t(off)];
                  }
        for (int h : hits) ASSERT_EQ(h, 1);  // a bijection: packed, no gaps, no collisions
        // One block of one layer's K is one contiguous run, the property copy and swap rely on.
        EXPECT_EQ(l.offset(0, 0, 0, shape.block_size - 1, shape.num_kv_heads - 1) + shape.head_dim,
                  l.offset(0, 0, 0, 0, 0) + l.block_elems());
        EXPECT_EQ(l.slot_offset(0, 1, std::int64_t(shape.num_blocks - 1) * shape.block_size + shape.block_size - 1, 0),
                  l.offset(0, 1, shape.num_blocks - 1, shape.block_size - 1, 0));
      }
}

TEST(KvLayout, BlockMajorKeepsABlockContiguousAcrossLayers) {
  const auto l = pk::make_kv_cache_layout({4, 10, 16, 8, 128}, pk::kv_layout::nhd, pk::dtype::f16,
                                          pk::layer_order::block_major);
  EXPECT_EQ(l.block_stride, 2 * 4 * l.block_elems());
  EXPECT_EQ(l.offset(3, 1, 2, 0, 0) + l.block_elems(), l.offset(0, 0, 3, 0, 0));
  EXPECT_EQ(l.bytes_per_block(), std::size_t(l.block_stride) * 2);
}

TEST(KvLayout, BlocksPerPageAreTheBlocksOfOneLayersKInAGpuPage) {
  // Llama-3-8B, bf16, block 16: a block of one layer's K is 16 * 8 * 128 * 2 = 32 KiB.
  const auto l = pk::make_kv_cache_layout({32, 1000, 16, 8, 128}, pk::kv_layout::nhd, pk::dtype::bf16);
  EXPECT_EQ(l.blocks_per_page(), 64);
  EXPECT_EQ(l.blocks_per_page(std::size_t(1) << 16), 2);
  EXPECT_EQ(pk::make_kv_cache_layout({32, 1000, 16, 8, 128}, pk::kv_layout::hnd, pk::dtype::fp8_e4m3).blocks_per_page(),
            128);
  // Never more than the pool, never less than one (block-major: one id is 2 MiB across 32 layers).
  EXPECT_EQ(pk::make_kv_cache_layout({1, 10, 16, 8, 128}, pk::kv_layout::nhd, pk::dtype::bf16).blocks_per_page(), 10);
  EXPECT_EQ(pk::make_kv_cache_layout({32, 10, 16, 8, 128}, pk::kv_layout::nhd, pk::dtype::bf16,
                                     pk::layer_order::block_major)
                .blocks_per_page(),
            1);
}

TEST(KvLayout, PrintsShapeColonStride) {
  const auto l = pk::make_kv_cache_layout({32, 1000, 16, 8, 128}, pk::kv_layout::nhd, pk::dtype::bf16);
  EXPECT_EQ(pk::to_string(l), "(32,2,1000,16,8,128):(32768000,16384000,16384,1024,128,1)");
  const auto h = pk::make_kv_cache_layout({1, 10, 16, 8, 128}, pk::kv_layout::hnd, pk::dtype::bf16);
  EXPECT_EQ(pk::to_string(h), "(1,2,10,16,8,128):(327680,163840,16384,128,2048,1)");
}

TEST(KvLayout, SizesAPoolFromABudget) {
  const pk::kv_cache_shape llama8b{32, 0, 16, 8, 128};
  // 2 (K,V) * 32 layers * 16 tokens * 8 heads * 128 dims * 2 bytes = 2 MiB per block.
  EXPECT_EQ(pk::blocks_for_budget(std::size_t(40) << 30, llama8b, pk::dtype::bf16), 20480);
  EXPECT_EQ(pk::blocks_for_budget(std::size_t(40) << 30, llama8b, pk::dtype::fp8_e4m3), 40960);
  EXPECT_EQ(pk::blocks_for_budget((std::size_t(2) << 20) - 1, llama8b, pk::dtype::bf16), 0);
  auto shape = llama8b;
  shape.num_blocks = pk::blocks_for_budget(std::size_t(1) << 30, llama8b, pk::dtype::bf16);
  const auto l = pk::make_kv_cache_layout(shape, pk::kv_layout::nhd, pk::dtype::bf16);
  EXPECT_LE(l.size_bytes(), std::size_t(1) << 30);
  EXPECT_EQ(l.size_bytes(), std::size_t(shape.num_blocks) * l.bytes_per_block());
}

TEST(KvLayout, RejectsAbsurdShapesNamingTheValue) {
  try {
    (void)pk::make_kv_cache_layout({1, 4, 257, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16);
    FAIL() << "no error";
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("block_size 257"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)pk::make_kv_cache_layout({1, 0, 16, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16), pagedkv::error);
  EXPECT_THROW((void)pk::make_kv_cache_layout({0, 4, 16, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16), pagedkv::error);
  EXPECT_THROW((void)pk::blocks_for_budget(1 << 20, {1, 0, 0, 1, 64}, pk::dtype::bf16), pagedkv::error);
}
