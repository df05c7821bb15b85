// block_pool: a fixed set of block ids with reference counts. It hands out ids only; where the
// bytes of a block live (device memory, pinned host memory) is the engine's storage, indexed by id.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/free_list.hpp>
#include <pagedkv/lock.hpp>
#include <pagedkv/types.hpp>

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace pagedkv {

/// A pool of `capacity` blocks, each free (refcount 0) or used (refcount >= 1).
///
/// Every operation is O(1) per block. Each fallible operation has a throwing form and a `try_`
/// form; a throwing call that throws leaves the pool unchanged, and bulk calls are all-or-nothing.
///
/// FreeList picks the reuse order (lifo_free_list by default); Lock picks thread safety (no_lock
/// by default, mutex_lock to share the pool between threads).
template <free_list_policy FreeList = lifo_free_list, lock_policy Lock = no_lock>
class block_pool {
 public:
  using free_list_type = FreeList;
  using lock_type = Lock;

  /// Creates a pool of blocks 0..num_blocks-1, all free. A fresh pool hands them out in id order.
  /// Errors: invalid_argument if num_blocks is not in [1, max_num_blocks].
  explicit block_pool(std::int32_t num_blocks)
      : ref_counts_(checked_capacity(num_blocks), 0), free_(num_blocks) {
    push_all_free();
  }

  /// A pool whose free list groups blocks into extents of `extent_blocks` consecutive ids
  /// (extent_free_list). Errors: as above; invalid_argument if extent_blocks is not in
  /// [1, num_blocks].
  block_pool(std::int32_t num_blocks, std::int32_t extent_blocks)
    requires locality_free_list_policy<FreeList>
      : ref_counts_(checked_capacity(num_blocks), 0), free_(num_blocks, checked_extent(extent_blocks, num_blocks)) {
    push_all_free();
  }

  [[nodiscard]] std::int32_t capacity() const noexcept {
    return static_cast<std::int32_t>(ref_counts_.size());
  }
  [[nodiscard]] std::int32_t num_free_blocks() const {
    std::scoped_lock guard(lock_);
    return free_.size();
  }
  [[nodiscard]] std::int32_t num_used_blocks() const { return capacity() - num_free_blocks(); }
  [[nodiscard]] bool can_allocate(std::int32_t num_blocks) const {
    return num_blocks >= 0 && num_blocks <= num_free_blocks();
  }

  /// Errors: invalid_block if id is out of range.
  [[nodiscard]] std::int32_t ref_count(block_id id) const {
    std::scoped_lock guard(lock_);
    check_id(id, "ref_count");
    return ref_counts_[id];
  }
  [[nodiscard]] bool is_free(block_id id) const { return ref_count(id) == 0; }

  /// Takes one free block; its refcount becomes 1. Errors: out_of_blocks when none is free.
  [[nodiscard]] block_id allocate() {
    if (auto id = try_allocate()) return *id;
    fail(errc::out_of_blocks, "allocate: all ", capacity(), " blocks are in use");
  }
  [[nodiscard]] std::optional<block_id> try_allocate() {
    std::scoped_lock guard(lock_);
    if (free_.size() == 0) return std::nullopt;
    return take_free();
  }

  /// Takes one free block near `hint` (a block id, usually the last block of the sequence that
  /// grows, or null_block for none) when the free list knows locality (locality_free_list_policy),
  /// any free block otherwise. Errors: invalid_block if hint is neither null_block nor a block of
  /// the pool; out_of_blocks when none is free.
  [[nodiscard]] block_id allocate_near(block_id hint) {
    if (auto id = try_allocate_near(hint)) return *id;
    fail(errc::out_of_blocks, "allocate_near: all ", capacity(), " blocks are in use");
  }
  [[nodiscard]] std::optional<block_id> try_allocate_near(block_id hint) {
    std::scoped_lock guard(lock_);
    check_hint(hint, "allocate_near");
    if (free_.size() == 0) return std::nullopt;
    return take_free_near(hint);
  }

  /// Fills `out` with distinct free blocks, each with refcount 1, or takes none.
  /// Errors: out_of_blocks when fewer than out.size() blocks are free.
  void allocate(std::span<block_id> out) {
    if (!try_allocate(out)) {
      fail(errc::out_of_blocks, "allocate: ", out.size(), " blocks requested, ",
           num_free_blocks(), " free");
    }
  }
  [[nodiscard]] bool try_allocate(std::span<block_id> out) {
    std::scoped_lock guard(lock_);
    if (out.size() > static_cast<std::size_t>(free_.size())) return false;
    for (block_id& id : out) id = take_free();
    return true;
  }

  /// The same, each block near the one before it and the first near `hint` (allocate_near): a
  /// prompt's blocks, in table order. Errors: as allocate_near, all or nothing.
  void allocate_near(std::span<block_id> out, block_id hint) {
    if (!try_allocate_near(out, hint)) {
      fail(errc::out_of_blocks, "allocate_near: ", out.size(), " blocks requested, ", num_free_blocks(), " free");
    }
  }
  [[nodiscard]] bool try_allocate_near(std::span<block_id> out, block_id hint) {
    std::scoped_lock guard(lock_);
    check_hint(hint, "allocate_near");
    if (out.size() > static_cast<std::size_t>(free_.size())) return false;
    for (block_id& id : out) hint = id = take_free_near(hint);
    return true;
  }

  /// Adds a reference to a used block (sharing it).
  /// Errors: invalid_block if out of range; no_references if the block is free (retaining a free
  /// block would hand out memory the pool may give to someone else).
  void retain(block_id id) {
    std::scoped_lock guard(lock_);
    check_id(id, "retain");
    if (ref_counts_[id] == 0) fail(errc::no_references, "retain of free block ", id);
    ++ref_counts_[id];
  }

  /// Drops a reference; at zero the block returns to the free list. Returns whether it did.
  /// Errors: invalid_block if out of range; no_references if the block is already free.
  bool release(block_id id) {
    std::scoped_lock guard(lock_);
    check_id(id, "release");
    if (ref_counts_[id] == 0) {
      fail(errc::no_references, "release of block ", id, " which holds no references (double free?)");
    }
    return drop_reference(id);
  }

  /// Drops one reference per entry (an id may appear several times), all or nothing. Blocks reach
  /// the free list in the order given.
  /// Errors: as release(), checked for every entry before any reference is dropped.
  void release(std::span<const block_id> ids) {
    std::scoped_lock guard(lock_);
    for (block_id id : ids) check_id(id, "release");
    std::size_t checked = 0;
    for (; checked < ids.size(); ++checked) {
      if (ref_counts_[ids[checked]] == 0) break;
      --ref_counts_[ids[checked]];
    }
    if (checked != ids.size()) {
      for (std::size_t i = 0; i < checked; ++i) ++ref_counts_[ids[i]];
      fail(errc::no_references, "release of block ", ids[checked],
           " which holds no references (double free?)");
    }
    // The counts are final; push each block that reached zero once, even if listed twice.
    for (block_id id : ids) {
      if (ref_counts_[id] == 0) {
        free_.push(id);
        ref_counts_[id] = pushed_marker;
      }
    }
    for (block_id id : ids) {
      if (ref_counts_[id] == pushed_marker) ref_counts_[id] = 0;
    }
  }

  /// Takes one particular free block off the free list (refcount 0 -> 1), for a prefix cache whose
  /// cached blocks wait on the free list. Only with a removable free list (lru_free_list).
  /// Errors: invalid_block if out of range; invalid_argument if the block is in use.
  void take(block_id id)
    requires removable_free_list_policy<FreeList>
  {
    std::scoped_lock guard(lock_);
    check_id(id, "take");
    if (ref_counts_[id] != 0) {
      fail(errc::invalid_argument, "take of block ", id, " which is in use (refcount ",
           ref_counts_[id], ")");
    }
    free_.remove(id);
    ref_counts_[id] = 1;
  }

 private:
  static constexpr std::int32_t pushed_marker = -1;

  void push_all_free() {
    const std::int32_t n = capacity();
    if constexpr (std::same_as<FreeList, lifo_free_list>) {
      for (block_id id = n - 1; id >= 0; --id) free_.push(id);
    } else {
      for (block_id id = 0; id < n; ++id) free_.push(id);
    }
  }

  static std::int32_t checked_extent(std::int32_t extent_blocks, std::int32_t num_blocks) {
    if (extent_blocks < 1 || extent_blocks > num_blocks) {
      fail(errc::invalid_argument, "block_pool extent of ", extent_blocks, " blocks is not in [1, ", num_blocks,
           "] (the capacity)");
    }
    return extent_blocks;
  }

  static std::size_t checked_capacity(std::int32_t num_blocks) {
    if (num_blocks < 1 || num_blocks > max_num_blocks) {
      fail(errc::invalid_argument, "block_pool capacity ", num_blocks, " is not in [1, ",
           max_num_blocks, "]");
    }
    return static_cast<std::size_t>(num_blocks);
  }

  template <class... Parts>
  [[noreturn]] static void fail(errc code, const Parts&... parts) {
    detail::fail(code, parts...);
  }

  void check_id(block_id id, const char* operation) const {
    if (id < 0 || id >= capacity()) {
      fail(errc::invalid_block, operation, " of block ", id, ": ids are 0..", capacity() - 1);
    }
  }

  void check_hint(block_id hint, const char* operation) const {
    if (hint != null_block) check_id(hint, operation);
  }

  block_id take_free_near(block_id hint) {
    if constexpr (locality_free_list_policy<FreeList>) {
      const block_id id = free_.pop_near(hint);
      ref_counts_[id] = 1;
      return id;
    } else {
      return take_free();
    }
  }

  block_id take_free() {
    const block_id id = free_.pop();
    ref_counts_[id] = 1;
    return id;
  }

  bool drop_reference(block_id id) {
    if (--ref_counts_[id] != 0) return false;
    free_.push(id);
    return true;
  }

  std::vector<std::int32_t> ref_counts_;
  typename FreeList::list free_;
  [[no_unique_address]] mutable Lock lock_;
};

}  // namespace pagedkv
