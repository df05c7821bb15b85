// Free-list policies for block_pool: the order in which freed blocks are handed out again.
//
// A policy is a tag type with a nested class template-free `list` constructible from a capacity.
// The pool pushes every block id that reaches refcount zero and pops one per allocation.
#pragma once

#include <pagedkv/detail/intrusive_list.hpp>
#include <pagedkv/types.hpp>

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

static_assert(free_list_policy<lifo_free_list>);
static_assert(free_list_policy<fifo_free_list>);
static_assert(removable_free_list_policy<lru_free_list>);

}  // namespace pagedkv
