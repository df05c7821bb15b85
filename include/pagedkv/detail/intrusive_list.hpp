// A doubly linked list threaded through two index arrays over the ids [0, capacity): O(1) push,
// pop and removal of an arbitrary member, no allocation after construction. Used by the LRU
// free-list policy and by LRU eviction.
#pragma once

#include <cassert>
#include <cstdint>
#include <vector>

namespace pagedkv::detail {

class intrusive_list {
 public:
  explicit intrusive_list(std::int32_t capacity)
      : prev_(static_cast<std::size_t>(capacity) + 1, not_linked),
        next_(static_cast<std::size_t>(capacity) + 1, not_linked),
        sentinel_(capacity) {
    prev_[sentinel_] = next_[sentinel_] = sentinel_;
  }

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::int32_t size() const noexcept { return size_; }
  [[nodiscard]] bool contains(std::int32_t id) const noexcept { return next_[id] != not_linked; }

  /// The oldest member (inserted first by push_back); the list must not be empty.
  [[nodiscard]] std::int32_t front() const noexcept { return next_[sentinel_]; }
  /// The newest member; the list must not be empty.
  [[nodiscard]] std::int32_t back() const noexcept { return prev_[sentinel_]; }

  void push_back(std::int32_t id) noexcept { link(id, prev_[sentinel_], sentinel_); }
  void push_front(std::int32_t id) noexcept { link(id, sentinel_, next_[sentinel_]); }

  void remove(std::int32_t id) noexcept {
    assert(contains(id));
    next_[prev_[id]] = next_[id];
    prev_[next_[id]] = prev_[id];
    prev_[id] = next_[id] = not_linked;
    --size_;
  }

  std::int32_t pop_front() noexcept {
    const std::int32_t id = front();
    remove(id);
    return id;
  }

  std::int32_t pop_back() noexcept {
    const std::int32_t id = back();
    remove(id);
    return id;
  }

 private:
  static constexpr std::int32_t not_linked = -1;

  void link(std::int32_t id, std::int32_t before, std::int32_t after) noexcept {
    assert(!contains(id));
    prev_[id] = before;
    next_[id] = after;
    next_[before] = id;
    prev_[after] = id;
    ++size_;
  }

  std::vector<std::int32_t> prev_;
  std::vector<std::int32_t> next_;
  std::int32_t sentinel_;  // index `capacity`: the list is a ring through it
  std::int32_t size_ = 0;
};

}  // namespace pagedkv::detail
