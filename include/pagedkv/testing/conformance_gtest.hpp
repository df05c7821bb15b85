// GoogleTest form of the policy conformance run (conformance.hpp): one call in a TEST body runs
// the property and turns its report into test failures. Pulls in GoogleTest and RapidCheck; link
// pagedkv::testing and GTest::gtest.
//
//   TEST(MyFreeList, Conforms) { pagedkv::testing::expect_kv_cache_manager_conformance<my_free_list>(); }
#pragma once

#include <pagedkv/testing/conformance.hpp>

#include <gtest/gtest.h>

#include <iostream>
#include <string>

namespace pagedkv::testing {

/// check_kv_cache_manager_conformance under the running test's "Suite/Name" as RapidCheck's id
/// (unless options name one), so that a printed reproduce string replays this test: one failure
/// carrying the counterexample when the property fails, one per expected path not reached.
/// Prints the coverage reached. Returns the report.
template <class FreeList = lifo_free_list, class Hash = xxh3_hash, class Eviction = lru_eviction>
conformance_report expect_kv_cache_manager_conformance(conformance_options options = {}) {
  if (options.name == conformance_options{}.name) {
    if (const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info()) {
      options.name = std::string(test->test_suite_name()) + "/" + test->name();
    }
  }
  conformance_report report = check_kv_cache_manager_conformance<FreeList, Hash, Eviction>(options);
  std::cout << "coverage: " << report.reached << '\n';
  if (!report.property_held) ADD_FAILURE() << report.counterexample;
  for (const std::string& line : report.unreached) ADD_FAILURE() << "not reached: " << line;
  return report;
}

}  // namespace pagedkv::testing
