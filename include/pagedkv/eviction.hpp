// Eviction policies for prefix_cache: which idle cached block (one that only the cache still
// holds) is given back to the pool first when the pool runs out of free blocks.
#pragma once

#include <pagedkv/detail/intrusive_list.hpp>
#include <pagedkv/types.hpp>

#include <concepts>
#include <cstdint>
#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

namespace pagedkv {

/// A priority that keeps a block cached until it is unpinned (priority_eviction).
inline constexpr std::int32_t pinned_priority = std::numeric_limits<std::int32_t>::max();

/// An eviction policy's `queue` holds the idle cached blocks. push() is told the priority of the
/// request that last used the block (lower is evicted sooner; policies may ignore it); pop()
/// returns the next victim, or nothing when no block may be evicted; size() counts the blocks
/// pop() could return.
template <class Policy>
concept eviction_policy =
    requires(typename Policy::queue queue, const typename Policy::queue cqueue, block_id id,
             std::int32_t priority) {
      requires std::constructible_from<typename Policy::queue, std::int32_t>;
      { queue.push(id, priority) } -> std::same_as<void>;
      { queue.erase(id) } -> std::same_as<void>;
      { queue.pop() } -> std::same_as<std::optional<block_id>>;
      { cqueue.contains(id) } -> std::same_as<bool>;
      { cqueue.size() } -> std::convertible_to<std::int32_t>;
    };

/// Least recently used first. A finished sequence pushes its blocks last-first, so a chain's
/// deepest blocks go before its root, which other prompts are more likely to share.
struct lru_eviction {
  class queue {
   public:
    explicit queue(std::int32_t capacity) : list_(capacity) {}
    void push(block_id id, std::int32_t /*priority*/) { list_.push_back(id); }
    void erase(block_id id) { list_.remove(id); }
    std::optional<block_id> pop() {
      if (list_.empty()) return std::nullopt;
      return list_.pop_front();
    }
    [[nodiscard]] bool contains(block_id id) const { return list_.contains(id); }
    [[nodiscard]] std::int32_t size() const { return list_.size(); }

   private:
    detail::intrusive_list list_;
  };
};

/// Lowest priority first, least recently used among equals; blocks pushed with pinned_priority are
/// never evicted until unpin_all(). Engines give a shared system prompt a high priority or pin it.
/// O(log n) per operation.
struct priority_eviction {
  class queue {
   public:
    explicit queue(std::int32_t capacity) : keys_(static_cast<std::size_t>(capacity)) {}

    void push(block_id id, std::int32_t priority) {
      key& k = keys_[static_cast<std::size_t>(id)];
      k = {priority, ++clock_, true};
      if (priority == pinned_priority) {
        ++num_pinned_;
      } else {
        order_.emplace(priority, k.stamp, id);
      }
    }
    void erase(block_id id) {
      key& k = keys_[static_cast<std::size_t>(id)];
      if (k.priority == pinned_priority) {
        --num_pinned_;
      } else {
        order_.erase({k.priority, k.stamp, id});
      }
      k.present = false;
    }
    std::optional<block_id> pop() {
      if (order_.empty()) return std::nullopt;
      const block_id id = std::get<2>(*order_.begin());
      order_.erase(order_.begin());
      keys_[static_cast<std::size_t>(id)].present = false;
      return id;
    }
    [[nodiscard]] bool contains(block_id id) const { return keys_[static_cast<std::size_t>(id)].present; }
    [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(order_.size()); }
    [[nodiscard]] std::int32_t num_pinned() const { return num_pinned_; }

    /// Makes every pinned idle block evictable, at `priority`, in the order they were pinned.
    void unpin_all(std::int32_t priority = 0) {
      std::vector<std::pair<std::uint64_t, block_id>> pinned;
      for (std::size_t id = 0; id < keys_.size(); ++id) {
        if (keys_[id].present && keys_[id].priority == pinned_priority) {
          pinned.emplace_back(keys_[id].stamp, static_cast<block_id>(id));
        }
      }
      std::sort(pinned.begin(), pinned.end());
      for (auto [stamp, id] : pinned) {
        erase(id);
        push(id, priority);
      }
    }

   private:
    struct key {
      std::int32_t priority = 0;
      std::uint64_t stamp = 0;
      bool present = false;
    };
    std::vector<key> keys_;
    std::set<std::tuple<std::int32_t, std::uint64_t, block_id>> order_;
    std::uint64_t clock_ = 0;
    std::int32_t num_pinned_ = 0;
  };
};

static_assert(eviction_policy<lru_eviction>);
static_assert(eviction_policy<priority_eviction>);

}  // namespace pagedkv
