// Four policies with a planted bug each, the kind engine authors write: the conformance kit
// (include/pagedkv/testing/) must fail each with a shrunk counterexample
// (test_conformance_mutations.cpp). Read them as examples of what the kit catches; docs/testing.md
// lists them. Each models its concept: the bugs are in behaviour, not in the interface.
#pragma once

#include <pagedkv/eviction.hpp>
#include <pagedkv/free_list.hpp>
#include <pagedkv/hash.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

namespace pagedkv::broken {

/// An eviction policy that evicts a block still referenced. FIFO with lazy deletion: erase()
/// only marks the block and leaves its entry in the queue, and pop() forgets to skip marked
/// entries, so it returns a block that a cache hit took back.
struct lazy_fifo_eviction {
  class queue {
   public:
    explicit queue(std::int32_t capacity) : idle_(static_cast<std::size_t>(capacity), false) {}
    void push(block_id id, std::int32_t) {
      order_.push_back(id);
      idle_[static_cast<std::size_t>(id)] = true;
      ++size_;
    }
    void erase(block_id id) {
      idle_[static_cast<std::size_t>(id)] = false;  // its entry stays in order_, skipped later
      --size_;
    }
    std::optional<block_id> pop() {
      if (size_ == 0) return std::nullopt;
      const block_id id = order_.front();  // BUG: the front may be erased; skip !idle_[front] first
      order_.pop_front();
      idle_[static_cast<std::size_t>(id)] = false;
      --size_;
      return id;
    }
    [[nodiscard]] bool contains(block_id id) const { return idle_[static_cast<std::size_t>(id)]; }
    [[nodiscard]] std::int32_t size() const { return size_; }

   private:
    std::deque<block_id> order_;
    std::vector<bool> idle_;
    std::int32_t size_ = 0;
  };
};

/// A free list that hands out a used block: a bitmap of free ids whose pop() finds the lowest
/// free id but never clears its bit, so the next pop hands out the same block again.
struct bitmap_free_list {
  class list {
   public:
    explicit list(std::int32_t capacity) : free_(static_cast<std::size_t>(capacity), false) {}
    void push(block_id id) {
      free_[static_cast<std::size_t>(id)] = true;
      ++size_;
    }
    block_id pop() {
      --size_;
      return static_cast<block_id>(std::ranges::find(free_, true) - free_.begin());  // BUG: the bit stays set
    }
    [[nodiscard]] std::int32_t size() const { return size_; }

   private:
    std::vector<bool> free_;
    std::int32_t size_ = 0;
  };
};

/// A hash that ignores the cache salt: written for token ids, it reads its input as whole 4-byte
/// tokens and drops a shorter tail. Blocks hash right, but the tenant salts "tenant1" and
/// "tenant2" both hash as "tena": two tenants' equal prompts collide.
struct whole_token_hash {
  block_hash operator()(block_hash parent, std::span<const std::byte> bytes) const noexcept {
    return xxh3_hash{}(parent, bytes.first(bytes.size() / sizeof(token_id) * sizeof(token_id)));  // BUG: drops the tail
  }
};

/// An eviction policy that ignores pins: priority_eviction with every priority raised by one
/// (say, a boost for a premium tier), saturating to stay below pinned_priority, so a pinned
/// block becomes an ordinary high-priority one and is evicted when nothing else is idle.
struct boosted_priority_eviction {
  class queue : public priority_eviction::queue {
   public:
    using priority_eviction::queue::queue;
    void push(block_id id, std::int32_t priority) {
      // BUG: pinned_priority must pass through unchanged
      priority_eviction::queue::push(id, std::min(priority, pinned_priority - 2) + 1);
    }
  };
};

static_assert(eviction_policy<lazy_fifo_eviction> && eviction_policy<boosted_priority_eviction>);
static_assert(free_list_policy<bitmap_free_list> && hash_policy<whole_token_hash>);

}  // namespace pagedkv::broken
