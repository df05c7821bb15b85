// Eviction policies for prefix_cache: which idle cached block (one that only the cache still
// holds) is given back to the pool first when the pool runs out of free blocks.
#pragma once

#include <pagedkv/detail/intrusive_list.hpp>
#include <pagedkv/detail/priority_order.hpp>
#include <pagedkv/types.hpp>

#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

namespace pagedkv {

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

namespace detail {
/// Idle blocks a queue keeps for now and releases as its clock moves (its optional num_held()
/// member: a TTL's protected blocks); 0 for a queue without one.
template <class Queue>
std::int32_t num_held_idle(const Queue& queue) {
  if constexpr (requires { queue.num_held(); }) {
    return static_cast<std::int32_t>(queue.num_held());
  } else {
    return 0;
  }
}
}  // namespace detail

/// A policy's name for reports (miss reasons: "evicted by lru"): its `name`, else "custom".
template <class Policy>
constexpr std::string_view eviction_policy_name() noexcept {
  if constexpr (requires { std::string_view(Policy::name); }) {
    return Policy::name;
  } else {
    return "custom";
  }
}

/// Least recently used first. A finished sequence pushes its blocks last-first, so a chain's
/// deepest blocks go before its root, which other prompts are more likely to share.
struct lru_eviction {
  static constexpr std::string_view name = "lru";
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
  static constexpr std::string_view name = "priority";
  class queue {
   public:
    explicit queue(std::int32_t capacity) : order_(capacity) {}

    void push(block_id id, std::int32_t priority) { order_.push(id, priority); }
    void erase(block_id id) { order_.erase(id); }
    std::optional<block_id> pop() { return order_.pop(); }
    [[nodiscard]] bool contains(block_id id) const { return order_.contains(id); }
    [[nodiscard]] std::int32_t size() const { return order_.size(); }
    [[nodiscard]] std::int32_t num_pinned() const { return order_.num_pinned(); }

    /// Makes every pinned idle block evictable, at `priority`, in the order they were pinned.
    void unpin_all(std::int32_t priority = 0) { order_.unpin_all(priority, true); }

   private:
    detail::priority_order<std::monostate> order_;
  };
};

static_assert(eviction_policy<lru_eviction>);
static_assert(eviction_policy<priority_eviction>);

}  // namespace pagedkv
