// RapidCheck stateful test of the scheduler, for each admission and preemption policy: the
// conformance kit (include/pagedkv/testing/scheduler_*.hpp) run over pagedkv's own policies, plus
// a user-written admission policy the kit must pass and a broken one it must catch. The engine
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
