// The idle blocks of a priority-ordered eviction queue (priority_eviction, tinylfu_eviction):
// ordered by (priority, segment, the time they went idle), the least first; blocks pushed with
// pinned_priority are held apart, never popped, until unpin_all. O(log n) per operation.
#pragma once

#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace pagedkv::detail {

/// Segment: a small ordered type between the priority and the time (tinylfu's probation and
/// protected segments); an empty one (std::monostate) orders by priority and time alone.
template <class Segment>
class priority_order {
 public:
  explicit priority_order(std::int32_t capacity) : keys_(static_cast<std::size_t>(capacity)) {}

  void push(block_id id, std::int32_t priority, Segment segment = {}) {
    key& k = keys_[static_cast<std::size_t>(id)];
    k = {priority, segment, ++clock_, true};
    if (priority == pinned_priority) {
      ++num_pinned_;
    } else {
      order_.emplace(k.priority, k.segment, k.stamp, id);
    }
  }
  void erase(block_id id) {
    key& k = keys_[static_cast<std::size_t>(id)];
    if (k.priority == pinned_priority) {
      --num_pinned_;
    } else {
      order_.erase({k.priority, k.segment, k.stamp, id});
    }
    k.present = false;
  }
  std::optional<block_id> pop() {
    if (order_.empty()) return std::nullopt;
    const block_id id = std::get<3>(*order_.begin());
    order_.erase(order_.begin());
    keys_[static_cast<std::size_t>(id)].present = false;
    return id;
  }
  [[nodiscard]] bool contains(block_id id) const { return keys_[static_cast<std::size_t>(id)].present; }
  /// Blocks pop() could return.
  [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(order_.size()); }
  [[nodiscard]] std::int32_t num_pinned() const noexcept { return num_pinned_; }
  /// The segment block `id` was pushed with, if it is here. Errors: std::out_of_range for an id
  /// outside the capacity.
  [[nodiscard]] std::optional<Segment> segment(block_id id) const {
    const key& k = keys_.at(static_cast<std::size_t>(id));
    return k.present ? std::optional(k.segment) : std::nullopt;
  }

  /// Makes every pinned idle block evictable at `priority`, in the order they were pinned:
  /// `restamp` orders them as if they went idle now, else at the time they went idle.
  void unpin_all(std::int32_t priority, bool restamp) {
    std::vector<std::pair<std::uint64_t, block_id>> pinned;
    for (std::size_t id = 0; id < keys_.size(); ++id) {
      if (keys_[id].present && keys_[id].priority == pinned_priority) {
        pinned.emplace_back(keys_[id].stamp, static_cast<block_id>(id));
      }
    }
    std::sort(pinned.begin(), pinned.end());
    for (auto [stamp, id] : pinned) {
      key& k = keys_[static_cast<std::size_t>(id)];
      --num_pinned_;
      k.priority = priority;
      if (restamp) k.stamp = ++clock_;
      order_.emplace(k.priority, k.segment, k.stamp, id);
    }
  }

 private:
  struct key {
    std::int32_t priority = 0;
    Segment segment{};
    std::uint64_t stamp = 0;
    bool present = false;
  };
  std::vector<key> keys_;
  std::set<std::tuple<std::int32_t, Segment, std::uint64_t, block_id>> order_;
  std::uint64_t clock_ = 0;
  std::int32_t num_pinned_ = 0;
};

}  // namespace pagedkv::detail
