// Free-list policies for block_pool: the order in which freed blocks are handed out again.
//
// A policy is a tag type with a nested class template-free `list` constructible from a capacity.
// The pool pushes every block id that reaches refcount zero and pops one per allocation.
#pragma once

#include <pagedkv/detail/intrusive_list.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <vector>

namespace pagedkv {

/// What a free-list policy's `list` must provide. push() is never given an id already in the list
/// and pop() is never called on an empty list: the pool guarantees both.
template <class Policy>
concept free_list_policy =
    requires(typename Policy::list list, const typename Policy::list clist, block_id id) {
      requires std::constructible_from<typename Policy::list, std::int32_t>;
      { list.push(id) } -> std::same_as<void>;
      { list.pop() } -> std::same_as<block_id>;
      { clist.size() } -> std::convertible_to<std::int32_t>;
    };

/// A free-list policy that can also take out one particular free block in O(1) (block_pool::take),
/// as a prefix cache that keeps cached blocks on the free list needs when one of them is hit.
template <class Policy>
concept removable_free_list_policy =
    free_list_policy<Policy> && requires(typename Policy::list list, block_id id) {
      { list.remove(id) } -> std::same_as<void>;
    };

/// A free-list policy that can hand out a block near a given one (block_pool::allocate_near), and
/// whose list takes the size of the neighbourhood, in blocks, as a second constructor argument.
template <class Policy>
concept locality_free_list_policy =
    free_list_policy<Policy> && std::constructible_from<typename Policy::list, std::int32_t, std::int32_t> &&
    requires(typename Policy::list list, block_id hint) {
      { list.pop_near(hint) } -> std::same_as<block_id>;
    };

/// Most recently freed first: the block just released is likely still warm in L2.
struct lifo_free_list {
  class list {
   public:
    explicit list(std::int32_t capacity) { ids_.reserve(static_cast<std::size_t>(capacity)); }
    void push(block_id id) { ids_.push_back(id); }
    block_id pop() {
      const block_id id = ids_.back();
      ids_.pop_back();
      return id;
    }
    [[nodiscard]] std::int32_t size() const noexcept { return static_cast<std::int32_t>(ids_.size()); }

   private:
    std::vector<block_id> ids_;
  };
};

/// Least recently freed first: spreads wear evenly and keeps freed blocks untouched longest.
struct fifo_free_list {
  class list {
   public:
    // A ring of capacity + 1 slots never fills, since at most `capacity` ids are ever free.
    explicit list(std::int32_t capacity) : ring_(static_cast<std::size_t>(capacity) + 1) {}
    void push(block_id id) {
      ring_[tail_] = id;
      tail_ = next(tail_);
    }
    block_id pop() {
      const block_id id = ring_[head_];
      head_ = next(head_);
      return id;
    }
    [[nodiscard]] std::int32_t size() const noexcept {
      const auto n = static_cast<std::int32_t>(ring_.size());
      return (tail_ - head_ + n) % n;
    }

   private:
    [[nodiscard]] std::int32_t next(std::int32_t i) const noexcept {
      return i + 1 == static_cast<std::int32_t>(ring_.size()) ? 0 : i + 1;
    }
    std::vector<block_id> ring_;
    std::int32_t head_ = 0;
    std::int32_t tail_ = 0;
  };
};

/// Least recently freed first, with O(1) removal of any free block: an intrusive doubly linked
/// list over the id array. Choose it when free blocks stay addressable (vLLM-style prefix caching,
/// where a cached block waits on the free list until it is reused or hit).
struct lru_free_list {
  class list {
   public:
    explicit list(std::int32_t capacity) : list_(capacity) {}
    void push(block_id id) { list_.push_back(id); }
    block_id pop() { return list_.pop_front(); }
    void remove(block_id id) { list_.remove(id); }
    [[nodiscard]] std::int32_t size() const noexcept { return list_.size(); }

   private:
    detail::intrusive_list list_;
  };
};

/// Blocks in extents of `extent_blocks` consecutive ids, for locality in the memory behind the ids.
/// A GPU maps device memory in 2 MiB pages, and a decode that crosses a page at every block of a
/// sequence streams 1.6% slower than one that crosses one every 2 MiB, which is as fast as
/// contiguous KV (H100, docs/benchmarks.md): make an extent the blocks of one page of a KV pool
/// (kv_cache_layout::blocks_per_page in the kernels), and let each sequence ask for blocks near
/// its last one (block_pool::allocate_near; kv_cache_manager does).
///
/// pop_near(hint) takes from the hint's extent while it has a free block; after that, or without a
/// hint (null_block: a new sequence), from an extent whose blocks are all free, so that a growing
/// sequence gets one to itself, else from the partly free extent with the most free blocks. pop()
/// takes from the partly free extent with the fewest, filling holes and keeping room for growing
/// sequences. Inside an extent the lowest free id goes first: a sequence that grows alone in an
/// extent gets consecutive ids, and a fresh pool hands out ids in order. Removable
/// (block_pool::take). push and remove are O(1); a pop costs O(extent_blocks / 64).
struct extent_free_list {
  static constexpr std::int32_t default_extent_blocks = 64;

  class list {
   public:
    /// extent_blocks is clamped to [1, capacity].
    explicit list(std::int32_t capacity, std::int32_t extent_blocks = default_extent_blocks)
        : capacity_(capacity),
          extent_(std::clamp(extent_blocks, std::int32_t{1}, std::max(capacity, std::int32_t{1}))),
          free_bits_((static_cast<std::size_t>(capacity) + 63) / 64, 0),
          free_in_(static_cast<std::size_t>(num_extents()), 0),
          whole_(num_extents()),
          open_(num_extents(), extent_) {}

    void push(block_id id) {
      free_bits_[word(id)] |= bit(id);
      ++size_;
      recount(id / extent_, +1);
    }
    block_id pop() {
      if (const std::int32_t e = open_.fewest(); e != buckets::none) return take_lowest(e);
      return take_lowest(whole_.front());
    }
    block_id pop_near(block_id hint) {
      if (hint >= 0 && hint < capacity_ && free_in_[hint / extent_] > 0) return take_lowest(hint / extent_);
      return take_lowest(!whole_.empty() ? whole_.front() : open_.most());
    }
    void remove(block_id id) {
      free_bits_[word(id)] &= ~bit(id);
      --size_;
      recount(id / extent_, -1);
    }
    [[nodiscard]] std::int32_t size() const noexcept { return size_; }

   private:
    /// The partly free extents, in one ring per free count (1 .. extent - 1) threaded through
    /// shared link arrays, and a bit per count that has any: an extent moves between counts in
    /// O(1), and the fewest or most free are found a 64-count word at a time.
    class buckets {
     public:
      static constexpr std::int32_t none = -1;
      buckets(std::int32_t extents, std::int32_t counts)
          : prev_(static_cast<std::size_t>(extents + counts)),
            next_(static_cast<std::size_t>(extents + counts)),
            nonempty_((static_cast<std::size_t>(counts) + 63) / 64, 0),
            extents_(extents) {
        for (std::int32_t c = 0; c < counts; ++c) prev_[sentinel(c)] = next_[sentinel(c)] = sentinel(c);
      }
      void insert(std::int32_t e, std::int32_t count) {
        const std::int32_t s = sentinel(count);
        prev_[e] = prev_[s];
        next_[e] = s;
        next_[prev_[s]] = e;
        prev_[s] = e;
        nonempty_[static_cast<std::size_t>(count) / 64] |= std::uint64_t{1} << (count % 64);
      }
      void erase(std::int32_t e) {
        next_[prev_[e]] = next_[e];
        prev_[next_[e]] = prev_[e];
        if (const std::int32_t s = next_[e]; s == prev_[e] && s >= extents_) {  // e was its count's last
          const std::int32_t count = s - extents_;
          nonempty_[static_cast<std::size_t>(count) / 64] &= ~(std::uint64_t{1} << (count % 64));
        }
      }
      [[nodiscard]] std::int32_t fewest() const {
        for (std::size_t w = 0; w < nonempty_.size(); ++w)
          if (nonempty_[w] != 0) return first_of(static_cast<std::int32_t>(w * 64) + std::countr_zero(nonempty_[w]));
        return none;
      }
      [[nodiscard]] std::int32_t most() const {
        for (std::size_t w = nonempty_.size(); w-- > 0;)
          if (nonempty_[w] != 0)
            return first_of(static_cast<std::int32_t>(w * 64) + 63 - std::countl_zero(nonempty_[w]));
        return none;
      }

     private:
      [[nodiscard]] std::int32_t sentinel(std::int32_t count) const { return extents_ + count; }
      [[nodiscard]] std::int32_t first_of(std::int32_t count) const { return next_[sentinel(count)]; }
      std::vector<std::int32_t> prev_, next_;
      std::vector<std::uint64_t> nonempty_;  // bit count % 64 of word count / 64: some extent has count free
      std::int32_t extents_;
    };

    [[nodiscard]] std::int32_t num_extents() const noexcept { return (capacity_ + extent_ - 1) / extent_; }
    static std::size_t word(block_id id) noexcept { return static_cast<std::size_t>(id) / 64; }
    static std::uint64_t bit(block_id id) noexcept { return std::uint64_t{1} << (id % 64); }
    [[nodiscard]] std::int32_t blocks_in(std::int32_t e) const noexcept {
      return std::min(extent_, capacity_ - e * extent_);
    }
    /// Moves extent e to the list of its new free count (by `delta`, +1 or -1).
    void recount(std::int32_t e, std::int32_t delta) {
      const std::int32_t before = free_in_[e], after = before + delta, blocks = blocks_in(e);
      free_in_[e] = after;
      if (before == blocks) whole_.remove(e);
      else if (before > 0) open_.erase(e);
      if (after == blocks) whole_.push_back(e);
      else if (after > 0) open_.insert(e, after);
    }
    /// The lowest free id of extent e, which has one, taken off the list.
    block_id take_lowest(std::int32_t e) {
      const block_id first = e * extent_;
      for (std::size_t w = word(first);; ++w) {
        std::uint64_t bits = free_bits_[w];
        if (w == word(first)) bits &= ~(bit(first) - 1);  // ids below the extent
        if (bits != 0) {
          const auto id = static_cast<block_id>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
          remove(id);
          return id;
        }
      }
    }

    std::int32_t capacity_;
    std::int32_t extent_;
    std::vector<std::uint64_t> free_bits_;  // bit id % 64 of word id / 64: id is free
    std::vector<std::int32_t> free_in_;     // free blocks of each extent
    detail::intrusive_list whole_;          // extents with every block free, oldest first
    buckets open_;                          // extents with some blocks free, not all
    std::int32_t size_ = 0;
  };
};

static_assert(free_list_policy<lifo_free_list>);
static_assert(free_list_policy<fifo_free_list>);
static_assert(removable_free_list_policy<lru_free_list>);
static_assert(removable_free_list_policy<extent_free_list> && locality_free_list_policy<extent_free_list>);

}  // namespace pagedkv
