#include <pagedkv/block_table.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace pagedkv {
namespace {

block_table make_table(std::int32_t block_size, std::vector<block_id> blocks, std::int32_t num_tokens) {
  block_table table(block_size);
  for (block_id id : blocks) table.push_block(id);
  std::vector<slot_id> slots(static_cast<std::size_t>(num_tokens));
  table.append(slots);
  return table;
}

TEST(BlockTable, AppendReturnsBlockTimesSizePlusOffset) {
  for (std::int32_t block_size : {1, 3, 7, 16, 17}) {
    block_table table(block_size);
    const std::vector<block_id> blocks{9, 2, 5, 0};
    const std::int32_t tokens = 3 * block_size + 1;
    ASSERT_EQ(table.blocks_needed(tokens), 4);
    for (block_id id : blocks) table.push_block(id);
    EXPECT_EQ(table.blocks_needed(tokens), 0);
    std::vector<slot_id> slots(static_cast<std::size_t>(tokens));
    table.append(slots);
    for (std::int32_t i = 0; i < tokens; ++i) {
      const slot_id expected = slot_id{blocks[static_cast<std::size_t>(i / block_size)]} * block_size + i % block_size;
      EXPECT_EQ(slots[static_cast<std::size_t>(i)], expected) << "block size " << block_size << " token " << i;
      EXPECT_EQ(table.slot(i), expected);
    }
    EXPECT_EQ(table.num_tokens(), tokens);
    EXPECT_EQ(table.last_block_len(), 1);
    EXPECT_EQ(table.blocks_needed(block_size - 1), 0);
    EXPECT_EQ(table.blocks_needed(block_size), 1);
  }
}

TEST(BlockTable, AppendBeyondCapacityFailsWithoutChange) {
  block_table table = make_table(4, {1}, 3);
  std::vector<slot_id> two(2, -5);
  try {
    table.append(two);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("push 1 more blocks"), std::string::npos) << e.what();
  }
  EXPECT_EQ(table.num_tokens(), 3);
  EXPECT_EQ(two[0], -5);
}

TEST(BlockTable, TruncateDropsEmptiedBlocksLastFirst) {
  block_table table = make_table(4, {7, 8, 9}, 10);
  EXPECT_EQ(table.truncate(5), (std::vector<block_id>{9}));
  EXPECT_EQ(table.num_tokens(), 5);
  EXPECT_EQ(table.last_block_len(), 1);
  EXPECT_EQ(table.truncate(5), std::vector<block_id>{});
  EXPECT_EQ(table.truncate(0), (std::vector<block_id>{8, 7}));
  EXPECT_EQ(table.num_blocks(), 0);
  EXPECT_EQ(table.last_block_len(), 0);
  EXPECT_THROW(table.truncate(1), error);
}

TEST(BlockTable, RejectsBadSizesAndPositions) {
  EXPECT_THROW(block_table(0), error);
  EXPECT_THROW(block_table(max_block_size + 1), error);
  block_table table = make_table(2, {0}, 1);
  EXPECT_THROW((void)table.slot(1), error);
  EXPECT_THROW((void)table.slot(-1), error);
  EXPECT_THROW(table.extend(2), error);
}

TEST(BlockTableExport, DenseIsPaddedRowMajorWithLengths) {
  const block_table a = make_table(4, {3, 1}, 6);
  const block_table b = make_table(4, {0}, 4);
  const block_table c(4);
  const std::vector<const block_table*> tables{&a, &b, &c};
  std::vector<std::int32_t> dense(3 * 3, 1234);
  std::vector<std::int32_t> lengths(3, 1234);
  export_dense(tables, 3, dense, lengths);
  EXPECT_EQ(dense, (std::vector<std::int32_t>{3, 1, -1, 0, -1, -1, -1, -1, -1}));
  EXPECT_EQ(lengths, (std::vector<std::int32_t>{6, 4, 0}));
  export_dense(tables, 2, dense, lengths, 77);
  EXPECT_EQ(std::vector<std::int32_t>(dense.begin(), dense.begin() + 6), (std::vector<std::int32_t>{3, 1, 0, 77, 77, 77}));
}

TEST(BlockTableExport, DenseRejectsShortBuffersWithoutWriting) {
  const block_table a = make_table(4, {3, 1}, 6);
  const std::vector<const block_table*> tables{&a};
  std::vector<std::int32_t> dense(4, 1234);
  std::vector<std::int32_t> lengths(1, 1234);
  try {
    export_dense(tables, 1, dense, lengths);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::buffer_too_small);
    EXPECT_NE(std::string(e.what()).find("2 blocks"), std::string::npos) << e.what();
  }
  std::vector<std::int32_t> small(1);
  EXPECT_THROW(export_dense(tables, 2, small, lengths), error);
  EXPECT_EQ(dense, std::vector<std::int32_t>(4, 1234));
  EXPECT_EQ(lengths[0], 1234);
}

TEST(BlockTableExport, CsrMatchesFlashInferLayout) {
  const block_table a = make_table(4, {3, 1}, 6);
  const block_table b = make_table(4, {0}, 4);
  const block_table c = make_table(4, {5, 6, 2}, 9);
  const std::vector<const block_table*> tables{&a, &b, &c};
  ASSERT_EQ(total_num_blocks(tables), 6);
  std::vector<std::int32_t> indptr(4), indices(6), last(3);
  export_csr(tables, indptr, indices, last);
  EXPECT_EQ(indptr, (std::vector<std::int32_t>{0, 2, 3, 6}));
  EXPECT_EQ(indices, (std::vector<std::int32_t>{3, 1, 0, 5, 6, 2}));
  EXPECT_EQ(last, (std::vector<std::int32_t>{2, 4, 1}));
  std::vector<std::int32_t> short_indices(5);
  try {
    export_csr(tables, indptr, short_indices, last);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::buffer_too_small);
  }
}

}  // namespace
}  // namespace pagedkv
