// Mutation proof of the conformance kit: each policy of broken_policies.hpp, run through
// check_kv_cache_manager_conformance at the case count ctest gives every kit run
// (tests/core/CMakeLists.txt), must fail with a shrunk counterexample that names its bug. The
// sanitizer build (PAGEDKV_TEST_EVERY_PAIRING off) skips them: they test the kit's logic, which
// the release run checks, and the kit's code runs under the sanitizers in the stateful suites.
#include "broken_policies.hpp"

#include <pagedkv/testing/conformance.hpp>

#include <gtest/gtest.h>
#include <rapidcheck/detail/Configuration.h>

#include <initializer_list>
#include <iostream>
#include <string>

namespace pagedkv {
namespace {

#if PAGEDKV_TEST_EVERY_PAIRING
/// The report must say the property failed, carry RapidCheck's shrunk counterexample and contain
/// one of `symptoms`, the lines the kit's checks print for this bug.
void expect_caught(const testing::conformance_report& report, std::initializer_list<const char*> symptoms) {
  EXPECT_FALSE(report.property_held);
  EXPECT_FALSE(report);
  ASSERT_FALSE(report.counterexample.empty());
  EXPECT_NE(report.counterexample.find("Falsifiable after"), std::string::npos) << report.counterexample;
  bool named = false;
  for (const char* symptom : symptoms) named = named || report.counterexample.find(symptom) != std::string::npos;
  EXPECT_TRUE(named) << report.counterexample;
  std::cout << report.counterexample << '\n';
}

std::string test_name() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(test->test_suite_name()) + "/" + test->name();
}

TEST(ConformanceMutations, EvictionOfAReferencedBlock) {
  expect_caught(testing::check_kv_cache_manager_conformance<lifo_free_list, xxh3_hash, broken::lazy_fifo_eviction>(
                    {.name = test_name()}),
                {"which is not idle"});
}

TEST(ConformanceMutations, FreeListHandingOutAUsedBlock) {
  expect_caught(testing::check_kv_cache_manager_conformance<broken::bitmap_free_list>({.name = test_name()}),
                {"a block handed out twice", "reads a wrong KV"});  // whichever check meets it first
}

TEST(ConformanceMutations, HashIgnoringTheSalt) {
  expect_caught(testing::check_kv_cache_manager_conformance<lifo_free_list, broken::whole_token_hash>(
                    {.name = test_name()}),
                {"hash collision"});
}

TEST(ConformanceMutations, EvictionIgnoringPins) {
  expect_caught(testing::check_kv_cache_manager_conformance<lifo_free_list, xxh3_hash, broken::boosted_priority_eviction>(
                    {.name = test_name()}),
                {"pushed at pinned_priority"});
}
#endif

// Each run above is caught within the count of command sequences ctest gives every kit run.
TEST(ConformanceMutations, RunsTheConfiguredNumberOfCases) {
  EXPECT_EQ(rc::detail::configuration().testParams.maxSuccess, PAGEDKV_RC_CASES);
}

}  // namespace
}  // namespace pagedkv
