// A first-fit allocator over one contiguous range of token slots: the memory model of the
// contiguous baselines (FasterTransformer, Orca), which give every sequence one unbroken range of
// KV slots. It is a real allocator, so the external fragmentation it reports is measured, not
// assumed.
//
// Free extents are kept in address order and coalesced on free, so the free list is canonical:
// freeing everything that was allocated since some point restores the exact free list of that
// point (contiguous_simulator relies on this to roll back a group that does not fit whole).
#pragma once

#include <pagedkv/error.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>

namespace pagedkv::sim {

class first_fit_allocator {
 public:
  /// A range of `capacity_slots` free slots at offsets [0, capacity_slots).
  /// Errors: invalid_argument when capacity_slots < 1.
  explicit first_fit_allocator(std::int64_t capacity_slots)
      : capacity_slots_(capacity_slots), free_slots_(capacity_slots) {
    if (capacity_slots < 1) {
      pagedkv::detail::fail(errc::invalid_argument, "first_fit_allocator capacity must be >= 1, got ",
                   capacity_slots);
    }
    add_free_extent(0, capacity_slots);
  }

  /// Slots a request of `size_slots` takes: exactly that many.
  [[nodiscard]] static std::int64_t size_for(std::int64_t size_slots) noexcept { return size_slots; }

  /// The lowest-addressed free extent that holds `size_slots` is split and its front returned.
  /// Returns the offset of the range, or nothing when no free extent is large enough (state
  /// unchanged). Errors: invalid_argument when size_slots < 1.
  [[nodiscard]] std::optional<std::int64_t> try_allocate(std::int64_t size_slots) {
    check_size(size_slots);
    if (size_slots > largest_free_extent()) return std::nullopt;
    for (auto it = free_by_offset_.begin(); it != free_by_offset_.end(); ++it) {
      auto [offset, extent] = *it;
      if (extent < size_slots) continue;
      remove_free_extent(it);
      if (extent > size_slots) add_free_extent(offset + size_slots, extent - size_slots);
      allocated_.emplace(offset, size_slots);
      free_slots_ -= size_slots;
      return offset;
    }
    return std::nullopt;  // unreachable: largest_free_extent() said one fits
  }

  /// As try_allocate, but a range that does not fit is an error.
  /// Errors: out_of_blocks when no free extent holds size_slots; invalid_argument as try_allocate.
  std::int64_t allocate(std::int64_t size_slots) {
    if (auto offset = try_allocate(size_slots)) return *offset;
    pagedkv::detail::fail(errc::out_of_blocks, "first_fit_allocator: no free extent of ", size_slots,
                 " slots (", free_slots_, " free, largest extent ", largest_free_extent(), ")");
  }

  /// Returns the range that starts at `offset` to the free list, merging it with free neighbours.
  /// Errors: invalid_argument when offset is not the start of an allocated range (state unchanged).
  void free(std::int64_t offset) {
    auto allocation = allocated_.find(offset);
    if (allocation == allocated_.end()) {
      pagedkv::detail::fail(errc::invalid_argument, "first_fit_allocator: free of offset ", offset,
                   ", which is not the start of an allocated range");
    }
    std::int64_t begin = offset;
    std::int64_t end = offset + allocation->second;
    free_slots_ += allocation->second;
    allocated_.erase(allocation);

    auto next = free_by_offset_.lower_bound(end);
    if (next != free_by_offset_.end() && next->first == end) {
      end += next->second;
      next = remove_free_extent(next);
    }
    if (next != free_by_offset_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == begin) {
        begin = previous->first;
        remove_free_extent(previous);
      }
    }
    add_free_extent(begin, end - begin);
  }

  /// True when try_allocate(size_slots) would succeed.
  [[nodiscard]] bool can_allocate(std::int64_t size_slots) const noexcept {
    return size_slots >= 1 && size_slots <= largest_free_extent();
  }

  [[nodiscard]] std::int64_t capacity_slots() const noexcept { return capacity_slots_; }
  [[nodiscard]] std::int64_t free_slots() const noexcept { return free_slots_; }
  [[nodiscard]] std::int64_t allocated_slots() const noexcept { return capacity_slots_ - free_slots_; }
  [[nodiscard]] std::int64_t largest_free_extent() const noexcept {
    return free_sizes_.empty() ? 0 : *free_sizes_.rbegin();
  }
  [[nodiscard]] std::size_t num_free_extents() const noexcept { return free_by_offset_.size(); }
  [[nodiscard]] std::size_t num_allocations() const noexcept { return allocated_.size(); }

  /// Size of the allocated range that starts at `offset`, or nothing.
  [[nodiscard]] std::optional<std::int64_t> allocation_size(std::int64_t offset) const {
    auto it = allocated_.find(offset);
    if (it == allocated_.end()) return std::nullopt;
    return it->second;
  }

  /// Free extents as offset -> size, in address order.
  [[nodiscard]] const std::map<std::int64_t, std::int64_t>& free_extents() const noexcept {
    return free_by_offset_;
  }

 private:
  using extent_iterator = std::map<std::int64_t, std::int64_t>::iterator;

  static void check_size(std::int64_t size_slots) {
    if (size_slots < 1) {
      pagedkv::detail::fail(errc::invalid_argument, "first_fit_allocator: size must be >= 1, got ",
                   size_slots);
    }
  }

  void add_free_extent(std::int64_t offset, std::int64_t size) {
    free_by_offset_.emplace(offset, size);
    free_sizes_.insert(size);
  }

  extent_iterator remove_free_extent(extent_iterator it) {
    free_sizes_.erase(free_sizes_.find(it->second));
    return free_by_offset_.erase(it);
  }

  std::int64_t capacity_slots_;
  std::int64_t free_slots_ = 0;
  std::map<std::int64_t, std::int64_t> free_by_offset_;  // offset -> size, never adjacent
  std::multiset<std::int64_t> free_sizes_;               // the same extents' sizes, for the max
  std::map<std::int64_t, std::int64_t> allocated_;       // offset -> size
};

}  // namespace pagedkv::sim
