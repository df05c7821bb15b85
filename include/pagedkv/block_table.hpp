// block_table: one sequence's map from logical blocks to physical blocks, and the export of many
// tables into the two formats attention kernels take (dense padded and CSR).
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace pagedkv {

/// Token i of the sequence lives in block blocks()[i / block_size] at offset i % block_size; its
/// slot is that block * block_size + offset. The table owns no blocks: whoever fills it (the
/// kv_cache_manager) holds the pool references.
class block_table {
 public:
  /// Errors: invalid_argument if block_size is not in [1, max_block_size].
  explicit block_table(std::int32_t block_size) : block_size_(block_size) {
    if (block_size < 1 || block_size > max_block_size) {
      detail::fail(errc::invalid_argument, "block size ", block_size, " is not in [1, ",
                   max_block_size, "]");
    }
  }

  [[nodiscard]] std::int32_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::int32_t num_tokens() const noexcept { return num_tokens_; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept {
    return static_cast<std::int32_t>(blocks_.size());
  }
  [[nodiscard]] std::span<const block_id> blocks() const noexcept { return blocks_; }
  /// The blocks that hold the first `num_tokens` tokens: what a step that computes up to that
  /// length reads, when later tokens are allocated already (a chunked prefill).
  /// Errors: invalid_argument if num_tokens is not in [0, num_tokens()].
  [[nodiscard]] std::span<const block_id> blocks(std::int32_t num_tokens) const {
    if (num_tokens < 0 || num_tokens > num_tokens_) {
      detail::fail(errc::invalid_argument, "blocks of the first ", num_tokens, " tokens: the table holds ",
                   num_tokens_);
    }
    return std::span<const block_id>(blocks_).first(static_cast<std::size_t>(blocks_for(num_tokens)));
  }
  [[nodiscard]] block_id block(std::int32_t index) const { return blocks_.at(static_cast<std::size_t>(index)); }
  /// Token slots the table's blocks can hold, filled or not.
  [[nodiscard]] std::int64_t capacity_tokens() const noexcept {
    return std::int64_t{num_blocks()} * block_size_;
  }
  /// Tokens in the last block (1..block_size), or 0 for an empty table.
  [[nodiscard]] std::int32_t last_block_len() const noexcept {
    return num_tokens_ == 0 ? 0 : num_tokens_ - (num_blocks() - 1) * block_size_;
  }
  /// Blocks that `num_tokens` tokens fill, whole or in part: ceil(num_tokens / block_size).
  [[nodiscard]] std::int32_t blocks_for(std::int32_t num_tokens) const noexcept {
    return static_cast<std::int32_t>((std::int64_t{num_tokens} + block_size_ - 1) / block_size_);
  }

  /// Blocks to add before `num_new_tokens` more tokens fit.
  [[nodiscard]] std::int32_t blocks_needed(std::int32_t num_new_tokens) const noexcept {
    const std::int64_t needed = std::int64_t{num_tokens_} + num_new_tokens;
    const std::int64_t blocks = (needed + block_size_ - 1) / block_size_;
    return blocks > num_blocks() ? static_cast<std::int32_t>(blocks - num_blocks()) : 0;
  }

  /// The slot of token `position`. Errors: invalid_argument if position is not in [0, num_tokens).
  [[nodiscard]] slot_id slot(std::int32_t position) const {
    if (position < 0 || position >= num_tokens_) {
      detail::fail(errc::invalid_argument, "slot of position ", position, ": the table holds ",
                   num_tokens_, " tokens");
    }
    return slot_unchecked(position);
  }

  /// Appends a block at the end (the caller holds a reference to it).
  void push_block(block_id id) { blocks_.push_back(id); }

  /// Replaces the block at `index` (copy-on-write, swap in/out).
  void replace_block(std::int32_t index, block_id id) { blocks_.at(static_cast<std::size_t>(index)) = id; }

  /// Appends out.size() tokens into the room the table's blocks have and writes their slots.
  /// Errors: invalid_argument if they do not fit (push the blocks_needed() blocks first).
  void append(std::span<slot_id> out) {
    const auto count = static_cast<std::int64_t>(out.size());
    if (num_tokens_ + count > capacity_tokens()) {
      detail::fail(errc::invalid_argument, "append of ", count, " tokens to a table of ",
                   num_tokens_, " tokens in ", num_blocks(), " blocks of ", block_size_,
                   ": push ", blocks_needed(static_cast<std::int32_t>(count)), " more blocks first");
    }
    for (slot_id& slot : out) slot = slot_unchecked(num_tokens_++);
  }

  /// Grows the token count by `count` without reporting slots (the tokens' KV is already there,
  /// e.g. a cached prefix). Errors: as append().
  void extend(std::int32_t count) {
    if (count < 0 || num_tokens_ + std::int64_t{count} > capacity_tokens()) {
      detail::fail(errc::invalid_argument, "extend by ", count, " tokens: the table holds ",
                   num_tokens_, " of ", capacity_tokens());
    }
    num_tokens_ += count;
  }

  /// Keeps the first `new_num_tokens` tokens and drops the blocks that no longer hold any,
  /// returning them (last first) so that the caller can release their references.
  /// Errors: invalid_argument if new_num_tokens is not in [0, num_tokens].
  std::vector<block_id> truncate(std::int32_t new_num_tokens) {
    if (new_num_tokens < 0 || new_num_tokens > num_tokens_) {
      detail::fail(errc::invalid_argument, "truncate to ", new_num_tokens,
                   " tokens: the table holds ", num_tokens_);
    }
    const std::int32_t keep_blocks = (new_num_tokens + block_size_ - 1) / block_size_;
    std::vector<block_id> dropped(blocks_.rbegin(), blocks_.rend() - keep_blocks);
    blocks_.resize(static_cast<std::size_t>(keep_blocks));
    num_tokens_ = new_num_tokens;
    return dropped;
  }

 private:
  [[nodiscard]] slot_id slot_unchecked(std::int32_t position) const noexcept {
    return slot_id{blocks_[static_cast<std::size_t>(position / block_size_)]} * block_size_ +
           position % block_size_;
  }

  std::vector<block_id> blocks_;
  std::int32_t num_tokens_ = 0;
  std::int32_t block_size_;
};

// ---- export into kernel formats ----
//
// Each export takes the tables whole, or, given `lengths`, the first lengths[i] tokens of table i
// only: a step's forward sees a sequence up to its kv_len, and a chunked prefill has allocated
// blocks past it. A length is in [0, the table's num_tokens()].

namespace detail {

inline void check_lengths(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths,
                          const char* operation) {
  if (lengths.size() != tables.size()) {
    fail(errc::invalid_argument, operation, ": ", lengths.size(), " lengths for ", tables.size(), " tables");
  }
  for (std::size_t i = 0; i < tables.size(); ++i) {
    if (lengths[i] < 0 || lengths[i] > tables[i]->num_tokens()) {
      fail(errc::invalid_argument, operation, ": length ", lengths[i], " of table ", i, ", which holds ",
           tables[i]->num_tokens(), " tokens");
    }
  }
}

/// What an export writes of table i: its blocks and token count, whole without `lengths`.
struct exported_table {
  std::span<const block_id> blocks;
  std::int32_t num_tokens;
  std::int32_t last_block_len;
};
inline exported_table exported(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths,
                               std::size_t i) {
  const block_table& t = *tables[i];
  if (lengths.empty()) return {t.blocks(), t.num_tokens(), t.last_block_len()};
  const std::span<const block_id> blocks = t.blocks(lengths[i]);
  const auto full = static_cast<std::int32_t>(blocks.size()) - 1;
  return {blocks, lengths[i], lengths[i] == 0 ? 0 : lengths[i] - full * t.block_size()};
}

inline std::int32_t longest_blocks(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths) {
  std::int32_t longest = 0;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    longest = std::max(longest, static_cast<std::int32_t>(exported(tables, lengths, i).blocks.size()));
  }
  return longest;
}

inline std::int64_t total_blocks(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths) {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tables.size(); ++i) total += static_cast<std::int64_t>(exported(tables, lengths, i).blocks.size());
  return total;
}

/// export_dense over lengths (empty: whole tables), checked by the caller.
inline void export_dense(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths,
                         std::int32_t max_blocks_per_seq, std::span<std::int32_t> out,
                         std::span<std::int32_t> num_tokens, block_id pad) {
  const std::size_t rows = tables.size();
  if (max_blocks_per_seq < 0 || out.size() < rows * static_cast<std::size_t>(max_blocks_per_seq) ||
      num_tokens.size() < rows) {
    fail(errc::buffer_too_small, "export_dense of ", rows, " tables x ", max_blocks_per_seq, " blocks needs ",
         rows * static_cast<std::size_t>(std::max(max_blocks_per_seq, 0)), " table entries and ", rows,
         " lengths; got ", out.size(), " and ", num_tokens.size());
  }
  if (const std::int32_t longest = longest_blocks(tables, lengths); longest > max_blocks_per_seq) {
    fail(errc::buffer_too_small, "export_dense: a table has ", longest, " blocks, more than max_blocks_per_seq = ",
         max_blocks_per_seq);
  }
  std::int32_t* row = out.data();
  for (std::size_t i = 0; i < rows; ++i, row += max_blocks_per_seq) {
    const exported_table t = exported(tables, lengths, i);
    std::copy(t.blocks.begin(), t.blocks.end(), row);
    std::fill(row + t.blocks.size(), row + max_blocks_per_seq, pad);
    num_tokens[i] = t.num_tokens;
  }
}

/// export_csr over lengths (empty: whole tables), checked by the caller.
inline void export_csr(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths,
                       std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                       std::span<std::int32_t> last_block_len) {
  const std::int64_t nnz = total_blocks(tables, lengths);
  if (indptr.size() < tables.size() + 1 || static_cast<std::int64_t>(indices.size()) < nnz ||
      last_block_len.size() < tables.size()) {
    fail(errc::buffer_too_small, "export_csr of ", tables.size(), " tables (", nnz, " blocks) needs indptr ",
         tables.size() + 1, ", indices ", nnz, ", last_block_len ", tables.size(), "; got ", indptr.size(), ", ",
         indices.size(), ", ", last_block_len.size());
  }
  if (nnz > INT32_MAX) fail(errc::buffer_too_small, "export_csr: ", nnz, " blocks overflow int32 indptr");
  std::int32_t offset = 0;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    indptr[i] = offset;
    const exported_table t = exported(tables, lengths, i);
    std::copy(t.blocks.begin(), t.blocks.end(), indices.begin() + offset);
    offset += static_cast<std::int32_t>(t.blocks.size());
    last_block_len[i] = t.last_block_len;
  }
  indptr[tables.size()] = offset;
}

}  // namespace detail

/// The longest table, in blocks: the smallest max_blocks_per_seq that export_dense accepts.
[[nodiscard]] inline std::int32_t longest_table_blocks(std::span<const block_table* const> tables) {
  return detail::longest_blocks(tables, {});
}
/// The same over the first lengths[i] tokens of table i. Errors: invalid_argument for a bad length.
[[nodiscard]] inline std::int32_t longest_table_blocks(std::span<const block_table* const> tables,
                                                       std::span<const std::int32_t> lengths) {
  detail::check_lengths(tables, lengths, "longest_table_blocks");
  return detail::longest_blocks(tables, lengths);
}

/// Total blocks over all tables: the length of export_csr's `indices`.
[[nodiscard]] inline std::int64_t total_num_blocks(std::span<const block_table* const> tables) {
  return detail::total_blocks(tables, {});
}
/// The same over the first lengths[i] tokens of table i. Errors: invalid_argument for a bad length.
[[nodiscard]] inline std::int64_t total_num_blocks(std::span<const block_table* const> tables,
                                                   std::span<const std::int32_t> lengths) {
  detail::check_lengths(tables, lengths, "total_num_blocks");
  return detail::total_blocks(tables, lengths);
}

/// Writes the tables as a row-major int32 matrix [tables.size(), max_blocks_per_seq] into `out`,
/// padding each row with `pad`, and each table's token count into `num_tokens` (vLLM-style kernels:
/// block_tables + seq_lens). Errors: buffer_too_small if a table has more than max_blocks_per_seq
/// blocks or a buffer is shorter than needed; nothing is written then.
inline void export_dense(std::span<const block_table* const> tables, std::int32_t max_blocks_per_seq,
                         std::span<std::int32_t> out, std::span<std::int32_t> num_tokens,
                         block_id pad = null_block) {
  detail::export_dense(tables, {}, max_blocks_per_seq, out, num_tokens, pad);
}
/// The same over the first lengths[i] tokens of table i: row i holds the blocks_for(lengths[i])
/// blocks that hold them and num_tokens[i] = lengths[i]. Errors: as above, and invalid_argument
/// for a bad length; nothing is written then.
inline void export_dense(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths,
                         std::int32_t max_blocks_per_seq, std::span<std::int32_t> out,
                         std::span<std::int32_t> num_tokens, block_id pad = null_block) {
  detail::check_lengths(tables, lengths, "export_dense");
  detail::export_dense(tables, lengths, max_blocks_per_seq, out, num_tokens, pad);
}

/// Writes the tables in CSR form (FlashInfer-style kernels): the blocks of table i are
/// indices[indptr[i] .. indptr[i+1]), and last_block_len[i] counts the tokens in its last block.
/// Sizes: indptr tables.size() + 1, indices total_num_blocks(tables), last_block_len tables.size().
/// Errors: buffer_too_small if a buffer is shorter; nothing is written then.
inline void export_csr(std::span<const block_table* const> tables, std::span<std::int32_t> indptr,
                       std::span<std::int32_t> indices, std::span<std::int32_t> last_block_len) {
  detail::export_csr(tables, {}, indptr, indices, last_block_len);
}
/// The same over the first lengths[i] tokens of table i (indices: total_num_blocks(tables,
/// lengths)). Errors: as above, and invalid_argument for a bad length; nothing is written then.
inline void export_csr(std::span<const block_table* const> tables, std::span<const std::int32_t> lengths,
                       std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                       std::span<std::int32_t> last_block_len) {
  detail::check_lengths(tables, lengths, "export_csr");
  detail::export_csr(tables, lengths, indptr, indices, last_block_len);
}

}  // namespace pagedkv
