#include "sim/buddy.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <map>
#include <vector>

namespace pagedkv::sim {
namespace {

TEST(Buddy, RoundsUpSplitsAndMerges) {
  buddy_allocator alloc(16);
  EXPECT_EQ(alloc.allocate(3), 0);  // takes [0, 4): 16 -> 8 + 4 + 4
  EXPECT_EQ(alloc.allocation_size(0), 4);
  EXPECT_EQ(alloc.free_slots(), 12);
  EXPECT_EQ(alloc.allocate(1), 4);  // smallest sufficient block first: [4, 5) from [4, 8)
  EXPECT_EQ(alloc.allocate(5), 8);  // 8 slots at [8, 16)
  EXPECT_EQ(alloc.largest_free_extent(), 2);
  EXPECT_FALSE(alloc.can_allocate(3));
  alloc.free(4);  // [4, 8) whole again, [0, 4) still taken: no merge past it
  EXPECT_EQ(alloc.largest_free_extent(), 4);
  alloc.free(0);
  EXPECT_EQ(alloc.largest_free_extent(), 8);
  alloc.free(8);
  EXPECT_EQ(alloc.largest_free_extent(), 16);
  EXPECT_EQ(alloc.free_slots(), 16);
}

TEST(Buddy, NonPowerOfTwoCapacityIsItsBinaryDecomposition) {
  buddy_allocator alloc(12);  // 8 at 0, 4 at 8
  EXPECT_EQ(alloc.largest_free_extent(), 8);
  EXPECT_EQ(alloc.allocate(4), 8);  // the 4-block is the smallest that fits
  EXPECT_EQ(alloc.allocate(8), 0);
  EXPECT_FALSE(alloc.try_allocate(1).has_value());
  alloc.free(8);
  alloc.free(0);
  EXPECT_EQ(alloc.free_slots(), 12);
  EXPECT_FALSE(alloc.can_allocate(9));  // 12 slots free, but never one 16-block
}

TEST(Buddy, MisuseIsATypedError) {
  buddy_allocator alloc(8);
  EXPECT_THROW(buddy_allocator{0}, error);
  EXPECT_THROW((void)alloc.try_allocate(0), error);
  auto offset = alloc.allocate(2);
  EXPECT_THROW(alloc.free(offset + 1), error);
  alloc.free(offset);
  EXPECT_THROW(alloc.free(offset), error);
  EXPECT_EQ(alloc.free_slots(), 8);
}

// ---- property test against a slot-by-slot model ----
// A buddy allocator with full merging can serve 2^k slots exactly when some 2^k-aligned run of
// 2^k slots is free; the block it returns is aligned to its size and was free.

struct model {
  std::vector<bool> used;
  std::map<std::int64_t, std::int64_t> live;  // offset -> block size

  [[nodiscard]] bool has_aligned_free(std::int64_t block) const {
    for (std::int64_t o = 0; o + block <= std::ssize(used); o += block) {
      if (std::none_of(used.begin() + o, used.begin() + o + block, [](bool u) { return u; })) {
        return true;
      }
    }
    return false;
  }
};

// The allocator, not the model, picks the block, so the test drives both by hand from a generated
// list of operations (rc::state wants the model's next state to follow from the command alone).
RC_GTEST_PROP(BuddyProperty, AgreesWithSlotModel, ()) {
  const auto capacity = *rc::gen::inRange<std::int64_t>(1, 130);
  model m{std::vector<bool>(std::size_t(capacity), false), {}};
  buddy_allocator sut(capacity);
  const auto ops = *rc::gen::container<std::vector<std::pair<bool, int>>>(
      rc::gen::pair(rc::gen::arbitrary<bool>(), rc::gen::inRange(1, 40)));
  for (auto [is_allocate, value] : ops) {
    if (is_allocate || m.live.empty()) {
      const std::int64_t block = buddy_allocator::size_for(value);
      const bool expected = m.has_aligned_free(block);
      RC_ASSERT(sut.can_allocate(value) == expected);
      auto offset = sut.try_allocate(value);
      RC_ASSERT(offset.has_value() == expected);
      if (!offset) continue;
      RC_ASSERT(*offset % block == 0);
      RC_ASSERT(*offset + block <= capacity);
      for (std::int64_t i = *offset; i < *offset + block; ++i) {
        RC_ASSERT(!m.used[std::size_t(i)]);
        m.used[std::size_t(i)] = true;
      }
      m.live.emplace(*offset, block);
    } else {
      auto it = std::next(m.live.begin(), value % std::ssize(m.live));
      sut.free(it->first);
      std::fill_n(m.used.begin() + it->first, it->second, false);
      m.live.erase(it);
    }
    RC_ASSERT(sut.free_slots() == std::ranges::count(m.used, false));
    RC_ASSERT(sut.num_allocations() == m.live.size());
  }
  for (auto [offset, block] : m.live) sut.free(offset);
  RC_ASSERT(sut.free_slots() == capacity);
  // Everything merged back: the largest block is the largest power of two in the capacity.
  RC_ASSERT(sut.largest_free_extent() == std::int64_t(std::bit_floor(std::uint64_t(capacity))));
}

}  // namespace
}  // namespace pagedkv::sim
