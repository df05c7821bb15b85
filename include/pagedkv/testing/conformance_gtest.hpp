// GoogleTest form of the policy conformance runs (conformance.hpp, scheduler_conformance.hpp): one
// call in a TEST body runs the property and turns its report into test failures. Pulls in
// GoogleTest and RapidCheck; link pagedkv::testing and GTest::gtest.
//
//   TEST(MyFreeList, Conforms) { pagedkv::testing::expect_kv_cache_manager_conformance<my_free_list>(); }
//   TEST(MyAdmission, Conforms) { pagedkv::testing::expect_scheduler_conformance<my_admission>(); }
#pragma once

#include <pagedkv/testing/conformance.hpp>
#include <pagedkv/testing/scheduler_conformance.hpp>

#include <gtest/gtest.h>

#include <iostream>
#include <string>

namespace pagedkv::testing {

namespace detail {

/// The running test's "Suite/Name", so that a printed reproduce string replays this test; `name`
/// when no test runs.
inline std::string current_test_name(std::string name) {
  if (const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info()) {
    return std::string(test->test_suite_name()) + "/" + test->name();
  }
  return name;
}

}  // namespace detail

/// check_kv_cache_manager_conformance under the running test's "Suite/Name" as RapidCheck's id
/// (unless options name one), so that a printed reproduce string replays this test: one failure
/// carrying the counterexample when the property fails, one per expected path not reached.
/// Prints the coverage reached. Returns the report.
template <class FreeList = lifo_free_list, class Hash = xxh3_hash, class Eviction = lru_eviction>
conformance_report expect_kv_cache_manager_conformance(conformance_options options = {}) {
  if (options.name == conformance_options{}.name) options.name = detail::current_test_name(options.name);
  conformance_report report = check_kv_cache_manager_conformance<FreeList, Hash, Eviction>(options);
  std::cout << "coverage: " << report.reached << '\n';
  if (!report.property_held) ADD_FAILURE() << report.counterexample;
  for (const std::string& line : report.unreached) ADD_FAILURE() << "not reached: " << line;
  return report;
}

/// check_scheduler_conformance under the running test's "Suite/Name" (unless options name one):
/// one failure carrying the counterexample for a broken admission order, one for a failed
/// property, one per path not reached. Prints the coverage reached. Returns the report.
template <class Admission = fcfs_admission, class Preemption = preempt_by_recompute, class Manager = kv_cache_manager<>>
scheduler_conformance_report expect_scheduler_conformance(scheduler_conformance_options options = {}) {
  if (options.name == scheduler_conformance_options{}.name) options.name = detail::current_test_name(options.name);
  scheduler_conformance_report report = check_scheduler_conformance<Admission, Preemption, Manager>(options);
  std::cout << "coverage over " << report.reached << '\n';
  if (!report.order_held) ADD_FAILURE() << report.order_counterexample;
  if (!report.property_held) ADD_FAILURE() << report.counterexample;
  for (const std::string& line : report.unreached) ADD_FAILURE() << "not reached: " << line;
  return report;
}

}  // namespace pagedkv::testing
