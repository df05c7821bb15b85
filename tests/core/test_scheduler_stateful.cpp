// RapidCheck stateful test of the scheduler, for each admission and preemption policy: the
// conformance kit (include/pagedkv/testing/scheduler_*.hpp) run over pagedkv's own policies, plus
// a user-written admission policy the kit must pass and a broken one it must catch, and one case of
// the kit's reservation check that random runs rarely reach. The engine
// harness, the commands, the end checks and the coverage each property must reach are the kit's;
// docs/design.md's testing section says what they reach. Runs: RC_PARAMS sets the number of
// command sequences (CMakeLists sets max_success, and PAGEDKV_RC_CASES to the same number); a
// failure prints the string that reproduces it.
#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/testing/conformance_gtest.hpp>

#include <gtest/gtest.h>
#include <rapidcheck/detail/Configuration.h>

namespace pagedkv {
namespace {

using testing::expect_scheduler_conformance;

TEST(SchedulerStateful, FcfsRecompute) { expect_scheduler_conformance<fcfs_admission, preempt_by_recompute>(); }
#if PAGEDKV_TEST_EVERY_PAIRING  // a sanitizer build runs each policy once
TEST(SchedulerStateful, FcfsSwap) { expect_scheduler_conformance<fcfs_admission, preempt_by_swap>(); }
TEST(SchedulerStateful, PriorityRecompute) { expect_scheduler_conformance<priority_admission, preempt_by_recompute>(); }
#endif
TEST(SchedulerStateful, PrioritySwap) { expect_scheduler_conformance<priority_admission, preempt_by_swap>(); }
TEST(SchedulerStateful, FcfsSwapExtents) {
  expect_scheduler_conformance<fcfs_admission, preempt_by_swap, kv_cache_manager<extent_free_list>>();
}
// The same kit over KV cache groups: 1-3 random groups (full, sliding window, chunked local),
// window freeing mostly on; the model reads each group's window back and checks that no table
// holds a block outside it after a step.
TEST(SchedulerStateful, HybridGroupsRecompute) {
  expect_scheduler_conformance<fcfs_admission, preempt_by_recompute, hybrid_kv_cache_manager<>>();
}
#if PAGEDKV_TEST_EVERY_PAIRING
TEST(SchedulerStateful, HybridGroupsSwap) {
  expect_scheduler_conformance<priority_admission, preempt_by_swap, hybrid_kv_cache_manager<>>();
}
#endif

// The kit checks the scheduler's kept reservation count against a fresh one after every call; the
// random runs rarely abort a request whose window blocks a running prefill's window shares at
// the point where its reservation is bounded by the window. Here that prefill P hits blocks of
// its window that B (decoding) still holds, so they are not P's alone: B's abort makes them so,
// and P reserves less, with no move of its own.
TEST(SchedulerStateful, AnAbortThatLeavesAPrefillItsWindowLowersItsReservation) {
  scheduler<fcfs_admission, preempt_by_recompute, hybrid_kv_cache_manager<>> s(
      {.max_tokens_per_step = 4, .max_num_seqs = 4},
      {.block_size = 2, .num_device_blocks = 64,
       .groups = {kv_cache_spec::full_attention(), kv_cache_spec::sliding_window(8)}});
  const auto step = [&] {
    s.complete(s.schedule(), [](const sampling_request& r) { return std::vector<continuation>{{r.seqs[0], 7, false}}; });
    EXPECT_EQ(s.num_reserved_blocks(), s.count_reserved_blocks());
  };
  std::vector<token_id> shared{10, 11, 12, 13, 14, 15, 16, 17};
  request_params b{.prompt = shared, .max_new_tokens = 50};
  b.prompt.insert(b.prompt.end(), {20, 21, 22, 23});
  s.add_request(1, b);
  for (int i = 0; i < 3; ++i) step();  // B's prompt in chunks of 4: it decodes, its blocks cached
  request_params p{.prompt = shared, .max_new_tokens = 4};
  for (token_id t = 30; t < 50; ++t) p.prompt.push_back(t);
  s.add_request(2, p);
  step();  // P hits 8 tokens (B's blocks of tokens 4-7 still in B's window) and computes 3
  const std::int32_t before = s.num_reserved_blocks();
  ASSERT_TRUE(s.abort(1));
  EXPECT_EQ(s.num_reserved_blocks(), s.count_reserved_blocks());
  EXPECT_LT(s.num_reserved_blocks(), before) << "before the abort " << before;
  while (s.has_unfinished()) step();
  EXPECT_EQ(s.num_reserved_blocks(), 0);
}

/// What a user might write: newest first, so the oldest running request is preempted first.
struct newest_first_admission {
  static constexpr bool before(admission_key a, admission_key b) noexcept { return a.arrival > b.arrival; }
};

/// The same with >=: not irreflexive, so sorted insertion may put a request anywhere among its equals.
struct newest_first_or_equal_admission {
  static constexpr bool before(admission_key a, admission_key b) noexcept { return a.arrival >= b.arrival; }
};

TEST(SchedulerStateful, UserAdmissionPolicyConforms) {
  expect_scheduler_conformance<newest_first_admission, preempt_by_recompute>();
}

TEST(SchedulerStateful, CatchesAnAdmissionOrderThatIsNotStrict) {
  const auto report = testing::check_scheduler_conformance<newest_first_or_equal_admission, preempt_by_swap>(
      {.name = "SchedulerStateful/CatchesAnAdmissionOrderThatIsNotStrict"});
  EXPECT_FALSE(report);
  EXPECT_FALSE(report.order_held);
  EXPECT_NE(report.order_counterexample.find("not irreflexive"), std::string::npos) << report.order_counterexample;
}

TEST(SchedulerStateful, RunsTheConfiguredNumberOfCases) {
  // RC_PARAMS must reach this test: before 2026-11-25 the ctest registration dropped it, and each
  // property ran RapidCheck's default of 100 cases.
  EXPECT_EQ(rc::detail::configuration().testParams.maxSuccess, PAGEDKV_RC_CASES);
}

}  // namespace
}  // namespace pagedkv
