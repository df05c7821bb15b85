// A binary buddy allocator over a range of token slots: the allocator the PagedAttention paper
// assumes for its Orca baselines (§6.5 explains the chatbot results by it). Every range is rounded
// up to a power of two and aligned to its size; a freed block merges with its buddy when that is
// free too. Same interface as first_fit_allocator, so contiguous_simulator runs on either.
//
// A capacity that is not a power of two is split into its binary decomposition, largest block at
// the lowest address (12 = 8 at 0 + 4 at 8); blocks never merge across those top-level blocks.
#pragma once

#include <pagedkv/error.hpp>

#include <bit>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace pagedkv::sim {

class buddy_allocator {
 public:
  /// Errors: invalid_argument when capacity_slots < 1.
  explicit buddy_allocator(std::int64_t capacity_slots)
      : capacity_slots_(capacity_slots), free_slots_(capacity_slots) {
    if (capacity_slots < 1) {
      pagedkv::detail::fail(errc::invalid_argument, "buddy_allocator capacity must be >= 1, got ",
                            capacity_slots);
    }
    free_by_order_.resize(static_cast<std::size_t>(std::bit_width(std::uint64_t(capacity_slots))));
    std::int64_t offset = 0;
    for (int order = static_cast<int>(free_by_order_.size()) - 1; order >= 0; --order) {
      if (capacity_slots & (std::int64_t{1} << order)) {
        free_by_order_[std::size_t(order)].insert(offset);
        offset += std::int64_t{1} << order;
      }
    }
  }

  /// Slots a request of `size_slots` takes: the next power of two.
  [[nodiscard]] static std::int64_t size_for(std::int64_t size_slots) noexcept {
    return static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(size_slots)));
  }

  /// Takes the lowest-addressed block of the smallest order that holds size_for(size_slots),
  /// splitting it down. Returns its offset, or nothing when no free block is large enough (state
  /// unchanged). Errors: invalid_argument when size_slots < 1.
  [[nodiscard]] std::optional<std::int64_t> try_allocate(std::int64_t size_slots) {
    if (size_slots < 1) {
      pagedkv::detail::fail(errc::invalid_argument, "buddy_allocator: size must be >= 1, got ",
                            size_slots);
    }
    const int order = std::bit_width(static_cast<std::uint64_t>(size_for(size_slots))) - 1;
    int source = order;
    while (source < num_orders() && free_by_order_[std::size_t(source)].empty()) ++source;
    if (source >= num_orders()) return std::nullopt;
    auto& from = free_by_order_[std::size_t(source)];
    const std::int64_t offset = *from.begin();
    from.erase(from.begin());
    for (int split = source; split > order; --split) {  // keep the low half, free the high half
      free_by_order_[std::size_t(split - 1)].insert(offset + (std::int64_t{1} << (split - 1)));
    }
    allocated_.emplace(offset, order);
    free_slots_ -= std::int64_t{1} << order;
    return offset;
  }

  /// As try_allocate, but a range that does not fit is an error (out_of_blocks).
  std::int64_t allocate(std::int64_t size_slots) {
    if (auto offset = try_allocate(size_slots)) return *offset;
    pagedkv::detail::fail(errc::out_of_blocks, "buddy_allocator: no free block of ",
                          size_for(size_slots), " slots (", free_slots_,
                          " free, largest block ", largest_free_extent(), ")");
  }

  /// Frees the block at `offset`, merging it with its buddy while that is free.
  /// Errors: invalid_argument when offset is not the start of an allocated block (state unchanged).
  void free(std::int64_t offset) {
    auto allocation = allocated_.find(offset);
    if (allocation == allocated_.end()) {
      pagedkv::detail::fail(errc::invalid_argument, "buddy_allocator: free of offset ", offset,
                            ", which is not the start of an allocated block");
    }
    int order = allocation->second;
    allocated_.erase(allocation);
    free_slots_ += std::int64_t{1} << order;
    while (order + 1 < num_orders()) {
      auto& peers = free_by_order_[std::size_t(order)];
      auto buddy = peers.find(offset ^ (std::int64_t{1} << order));
      if (buddy == peers.end()) break;
      peers.erase(buddy);
      offset &= ~(std::int64_t{1} << order);
      ++order;
    }
    free_by_order_[std::size_t(order)].insert(offset);
  }

  [[nodiscard]] bool can_allocate(std::int64_t size_slots) const noexcept {
    return size_slots >= 1 && size_for(size_slots) <= largest_free_extent();
  }

  [[nodiscard]] std::int64_t capacity_slots() const noexcept { return capacity_slots_; }
  [[nodiscard]] std::int64_t free_slots() const noexcept { return free_slots_; }
  [[nodiscard]] std::int64_t allocated_slots() const noexcept { return capacity_slots_ - free_slots_; }
  /// The largest free block: the largest range one allocation can get.
  [[nodiscard]] std::int64_t largest_free_extent() const noexcept {
    for (int order = num_orders() - 1; order >= 0; --order) {
      if (!free_by_order_[std::size_t(order)].empty()) return std::int64_t{1} << order;
    }
    return 0;
  }
  [[nodiscard]] std::size_t num_allocations() const noexcept { return allocated_.size(); }
  [[nodiscard]] std::optional<std::int64_t> allocation_size(std::int64_t offset) const {
    auto it = allocated_.find(offset);
    if (it == allocated_.end()) return std::nullopt;
    return std::int64_t{1} << it->second;
  }

 private:
  [[nodiscard]] int num_orders() const noexcept { return static_cast<int>(free_by_order_.size()); }

  std::int64_t capacity_slots_;
  std::int64_t free_slots_;
  std::vector<std::set<std::int64_t>> free_by_order_;  // order k: offsets of free 2^k blocks
  std::map<std::int64_t, int> allocated_;              // offset -> order
};

}  // namespace pagedkv::sim
