#include <pagedkv/block_table.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
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


TEST(BlockTable, BlocksOfAPrefixAreTheBlocksThatHoldIt) {
  for (std::int32_t block_size : {1, 3, 7, 17}) {
    const std::vector<block_id> ids{4, 9, 2, 6};
    const std::int32_t tokens = 3 * block_size + 1;  // four blocks, the last holding one token
    const block_table table = make_table(block_size, ids, tokens);
    for (std::int32_t n = 0; n <= tokens; ++n) {
      const std::span<const block_id> head = table.blocks(n);
      ASSERT_EQ(static_cast<std::int32_t>(head.size()), table.blocks_for(n)) << "block size " << block_size << " n " << n;
      EXPECT_EQ(static_cast<std::int32_t>(head.size()), (n + block_size - 1) / block_size);
      EXPECT_TRUE(std::equal(head.begin(), head.end(), ids.begin()));
      if (n > 0) {
        EXPECT_EQ(table.slot(n - 1) / block_size, head.back()) << "the last token is in the last block";
      }
    }
    EXPECT_THROW((void)table.blocks(tokens + 1), error);
    EXPECT_THROW((void)table.blocks(-1), error);
  }
}

// A chunked prefill: the tables hold every prompt token, the step computes up to lengths[i].
TEST(BlockTableExport, PrefixesServeAChunkedPrefill) {
  const block_table a = make_table(4, {3, 1, 8}, 11);  // computes 5 of 11: blocks 3, 1
  const block_table b = make_table(4, {0}, 4);         // whole
  const block_table c = make_table(4, {5, 6, 2}, 9);   // computes 8: blocks 5, 6 (the last one full)
  const block_table d = make_table(3, {7}, 2);         // none yet
  const std::vector<const block_table*> tables{&a, &b, &c, &d};
  const std::vector<std::int32_t> lengths{5, 4, 8, 0};
  ASSERT_EQ(longest_table_blocks(tables, lengths), 2);
  ASSERT_EQ(total_num_blocks(tables, lengths), 5);

  std::vector<std::int32_t> dense(4 * 2, 1234), kv_lens(4, 1234);
  export_dense(tables, lengths, 2, dense, kv_lens);
  EXPECT_EQ(dense, (std::vector<std::int32_t>{3, 1, 0, -1, 5, 6, -1, -1}));
  EXPECT_EQ(kv_lens, lengths);

  std::vector<std::int32_t> indptr(5, 1234), indices(5, 1234), last(4, 1234);
  export_csr(tables, lengths, indptr, indices, last);
  EXPECT_EQ(indptr, (std::vector<std::int32_t>{0, 2, 3, 5, 5}));
  EXPECT_EQ(indices, (std::vector<std::int32_t>{3, 1, 0, 5, 6}));
  EXPECT_EQ(last, (std::vector<std::int32_t>{1, 4, 4, 0}));

  // Whole lengths export what the whole-table forms do.
  const std::vector<std::int32_t> whole{11, 4, 9, 2};
  std::vector<std::int32_t> dense_whole(4 * 3), lens_whole(4), dense_prefix(4 * 3), lens_prefix(4);
  export_dense(tables, 3, dense_whole, lens_whole);
  export_dense(tables, whole, 3, dense_prefix, lens_prefix);
  EXPECT_EQ(dense_prefix, dense_whole);
  EXPECT_EQ(lens_prefix, lens_whole);
}

TEST(BlockTableExport, PrefixLengthsAreCheckedBeforeWriting) {
  const block_table a = make_table(4, {3, 1}, 6);
  const std::vector<const block_table*> tables{&a};
  std::vector<std::int32_t> dense(2, 1234), kv_lens(1, 1234), indptr(2, 1234), indices(2, 1234), last(1, 1234);
  for (const std::vector<std::int32_t>& bad : {std::vector<std::int32_t>{7}, std::vector<std::int32_t>{-1},
                                               std::vector<std::int32_t>{1, 1}}) {
    try {
      export_dense(tables, bad, 2, dense, kv_lens);
      FAIL();
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
    }
    EXPECT_THROW(export_csr(tables, bad, indptr, indices, last), error);
    EXPECT_THROW((void)longest_table_blocks(tables, bad), error);
    EXPECT_THROW((void)total_num_blocks(tables, bad), error);
  }
  const std::vector<std::int32_t> five{5};
  EXPECT_THROW(export_dense(tables, five, 1, dense, kv_lens), error);  // two blocks, one column
  EXPECT_EQ(dense, std::vector<std::int32_t>(2, 1234));
  EXPECT_EQ(kv_lens, std::vector<std::int32_t>(1, 1234));
  EXPECT_EQ(indptr, std::vector<std::int32_t>(2, 1234));
  EXPECT_EQ(last, std::vector<std::int32_t>(1, 1234));
}

}  // namespace
}  // namespace pagedkv
