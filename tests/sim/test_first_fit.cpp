#include "sim/first_fit.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace pagedkv::sim {
namespace {

TEST(FirstFit, AllocatesLowestFittingExtentAndCoalesces) {
  first_fit_allocator alloc(100);
  EXPECT_EQ(alloc.allocate(10), 0);
  EXPECT_EQ(alloc.allocate(20), 10);
  EXPECT_EQ(alloc.allocate(30), 30);
  EXPECT_EQ(alloc.free_slots(), 40);
  EXPECT_EQ(alloc.largest_free_extent(), 40);

  alloc.free(10);  // hole [10, 30)
  EXPECT_EQ(alloc.num_free_extents(), 2U);
  EXPECT_EQ(alloc.largest_free_extent(), 40);
  EXPECT_EQ(alloc.allocate(5), 10);  // first fit: the hole, not the tail
  alloc.free(0);                     // [0, 10) merges with nothing: [10, 15) is in use
  EXPECT_EQ(alloc.num_free_extents(), 3U);
  alloc.free(10);  // [0, 30) now one extent
  EXPECT_EQ(alloc.num_free_extents(), 2U);
  EXPECT_EQ(alloc.free_extents().at(0), 30);
  alloc.free(30);  // everything merges back
  EXPECT_EQ(alloc.num_free_extents(), 1U);
  EXPECT_EQ(alloc.free_slots(), 100);
  EXPECT_EQ(alloc.largest_free_extent(), 100);
}

TEST(FirstFit, ExternalFragmentationIsVisible) {
  // Four ranges of 25, free every other one: 50 slots free, but no 26-slot range fits.
  first_fit_allocator alloc(100);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(alloc.allocate(25), 25 * i);
  alloc.free(0);
  alloc.free(50);
  EXPECT_EQ(alloc.free_slots(), 50);
  EXPECT_EQ(alloc.largest_free_extent(), 25);
  EXPECT_FALSE(alloc.can_allocate(26));
  EXPECT_FALSE(alloc.try_allocate(26).has_value());
  EXPECT_EQ(alloc.free_slots(), 50);  // a failed allocation changes nothing
}

TEST(FirstFit, MisuseIsATypedErrorThatChangesNothing) {
  first_fit_allocator alloc(16);
  EXPECT_THROW(first_fit_allocator{0}, error);
  auto offset = alloc.allocate(4);
  try {
    alloc.free(offset + 1);
    FAIL() << "free of an interior offset was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  try {
    (void)alloc.allocate(13);
    FAIL() << "over-allocation was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
  }
  EXPECT_THROW((void)alloc.try_allocate(0), error);
  alloc.free(offset);
  EXPECT_THROW(alloc.free(offset), error);  // double free
  EXPECT_EQ(alloc.free_slots(), 16);
}

// ---- property test against a slot-by-slot model ----

struct model {
  std::vector<bool> used;                     // one flag per slot
  std::map<std::int64_t, std::int64_t> live;  // offset -> size

  // The first offset with `size` consecutive free slots, or -1.
  [[nodiscard]] std::int64_t first_fit(std::int64_t size) const {
    std::int64_t run = 0;
    for (std::int64_t i = 0; i < std::ssize(used); ++i) {
      run = used[i] ? 0 : run + 1;
      if (run == size) return i - size + 1;
    }
    return -1;
  }
  [[nodiscard]] std::int64_t free_slots() const { return std::ranges::count(used, false); }
  [[nodiscard]] std::int64_t largest_run() const {
    std::int64_t run = 0, best = 0;
    for (bool u : used) best = std::max(best, run = u ? 0 : run + 1);
    return best;
  }
};

void check_agrees(const model& m, const first_fit_allocator& sut) {
  RC_ASSERT(sut.free_slots() == m.free_slots());
  RC_ASSERT(sut.largest_free_extent() == m.largest_run());
  RC_ASSERT(sut.num_allocations() == m.live.size());
  // Free extents are maximal (coalesced) and match the model's free runs exactly.
  std::int64_t expected_offset = -1;
  std::map<std::int64_t, std::int64_t> runs;
  for (std::int64_t i = 0; i <= std::ssize(m.used); ++i) {
    bool free = i < std::ssize(m.used) && !m.used[i];
    if (free && expected_offset < 0) expected_offset = i;
    if (!free && expected_offset >= 0) {
      runs.emplace(expected_offset, i - expected_offset);
      expected_offset = -1;
    }
  }
  RC_ASSERT(sut.free_extents() == runs);
}

struct allocate_command : rc::state::Command<model, first_fit_allocator> {
  std::int64_t size = *rc::gen::inRange<std::int64_t>(1, 40);
  void checkPreconditions(const model&) const override {}
  void apply(model& m) const override {
    auto offset = m.first_fit(size);
    if (offset < 0) return;
    std::fill_n(m.used.begin() + offset, size, true);
    m.live.emplace(offset, size);
  }
  void run(const model& m, first_fit_allocator& sut) const override {
    auto expected = m.first_fit(size);
    RC_ASSERT(sut.can_allocate(size) == (expected >= 0));
    auto got = sut.try_allocate(size);
    RC_ASSERT(got.value_or(-1) == expected);
    model next = m;
    apply(next);
    check_agrees(next, sut);
  }
  void show(std::ostream& os) const override { os << "allocate(" << size << ")"; }
};

struct free_command : rc::state::Command<model, first_fit_allocator> {
  std::size_t pick = *rc::gen::inRange<std::size_t>(0, 1000);
  [[nodiscard]] std::int64_t offset(const model& m) const {
    return std::next(m.live.begin(), static_cast<std::ptrdiff_t>(pick % m.live.size()))->first;
  }
  void checkPreconditions(const model& m) const override { RC_PRE(!m.live.empty()); }
  void apply(model& m) const override {
    auto it = m.live.find(offset(m));
    std::fill_n(m.used.begin() + it->first, it->second, false);
    m.live.erase(it);
  }
  void run(const model& m, first_fit_allocator& sut) const override {
    sut.free(offset(m));
    model next = m;
    apply(next);
    check_agrees(next, sut);
  }
  void show(std::ostream& os) const override { os << "free(#" << pick << ")"; }
};

RC_GTEST_PROP(FirstFitProperty, AgreesWithSlotModel, ()) {
  auto capacity = *rc::gen::inRange<std::int64_t>(1, 200);
  model initial{std::vector<bool>(static_cast<std::size_t>(capacity), false), {}};
  first_fit_allocator sut(capacity);
  rc::state::check(initial, sut,
                   rc::state::gen::execOneOfWithArgs<allocate_command, allocate_command,
                                                     free_command>());
}

}  // namespace
}  // namespace pagedkv::sim
