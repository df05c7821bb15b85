// Scheduler policy conformance: runs the project's own stateful property of pagedkv::scheduler
// (scheduler_commands.hpp, around scheduler_model.hpp's engine) over a scheduler built with the
// caller's admission and preemption policies and manager, after checking that the admission
// policy is a strict weak order, and reports what it found and reached.
//
//   #include <pagedkv/testing/scheduler_conformance.hpp>
//   const auto report = pagedkv::testing::check_scheduler_conformance<my_admission>();
//   if (!report) std::cerr << report;  // the shrunk counterexample, or the paths never reached
//
// The number of command sequences is RapidCheck's max_success (RC_PARAMS), at least 1000, and
// max_size at least 150 (scheduler_conformance_options says why); the project's own runs use 1500. conformance_gtest.hpp turns a report into
// GoogleTest failures. Pulls in RapidCheck; pagedkv.hpp does not include it. Link pagedkv::testing.
#pragma once

#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/scheduler_policy.hpp>
#include <pagedkv/testing/scheduler_commands.hpp>
#include <pagedkv/testing/scheduler_model.hpp>

#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace pagedkv::testing {

struct scheduler_conformance_options {
  /// RapidCheck's test id: the key of a reproduce string in RC_PARAMS, and the report's title.
  std::string name = "scheduler conformance";
  /// The fewest command sequences and the smallest max_size a run uses, whatever RC_PARAMS says:
  /// the rarest path (a request that can never fit) is reached in about 5% of cases at size 150,
  /// so RapidCheck's default of 100 cases at size 100 missed a path in 39 of 100 runs of a
  /// correct policy, and 1000 at 150 in none of 30. 0 follows RC_PARAMS alone.
  int min_cases = 1000;
  int min_size = 150;
};

/// What a scheduler conformance run found. True when the admission policy ordered every drawn
/// triple of keys as a strict weak order, no command sequence failed, and every path was reached.
struct scheduler_conformance_report {
  std::string name;
  bool order_held = false;
  std::string order_counterexample;  ///< the shrunk keys an admission order broke the rule on
  bool property_held = false;
  std::string counterexample;  ///< RapidCheck's message: the shrunk commands and the RC_PARAMS
                               ///< string that reproduces them
  scheduler_coverage reached;  ///< summed over every command sequence, shrinking included
  std::vector<std::string> unreached;  ///< a line per path reached too rarely

  explicit operator bool() const noexcept { return order_held && property_held && unreached.empty(); }

  friend std::ostream& operator<<(std::ostream& os, const scheduler_conformance_report& r) {
    os << r.name << ": admission " << (r.order_held ? "is a strict weak order" : "is not a strict weak order") << ", "
       << (r.property_held ? "property held" : "property failed") << "; coverage over " << r.reached << '\n';
    if (!r.order_held) os << r.order_counterexample << '\n';
    if (!r.property_held) os << r.counterexample << '\n';
    for (const std::string& line : r.unreached) os << "not reached: " << line << '\n';
    return os;
  }
};

/// The paths a run must reach, each at least once per 100 cases (the project's runs reach each
/// 3-60 times per 100 at 1500 cases): a swapping scheduler must swap and must fall back to
/// recompute when the host pool is short; a recomputing one must re-admit a preempted group;
/// every one must share a prompt with a request still computing it (allocate_shared) and copy a
/// partial hit (enable_partial_reuse); one over KV cache groups must prefill chunk by chunk with
/// blocks reserved for the rest.
inline std::vector<std::string> unreached_scheduler_paths(const scheduler_coverage& c, bool swaps, bool grouped = false) {
  const std::int64_t floor = std::max<std::int64_t>(1, c.cases / 100);
  std::vector<std::string> out;
  const auto require = [&](bool wanted, const char* what, std::int64_t count) {
    if (wanted && count < floor) {
      std::ostringstream line;
      line << what << ": " << count << " times, fewer than " << floor;
      out.push_back(line.str());
    }
  };
  require(true, "requests that finished only because their sequences share the prompt", c.fit_only_by_sharing);
  require(true, "requests rejected because they can never fit", c.never_fit);
  require(true, "requests rejected after they started running", c.rejected_running);
  require(swaps, "preemptions by swap", c.swapped);
  require(true, "prompt tokens shared with a request still computing them", c.shared_in_flight);
  require(true, "prompt tokens served by a partial hit's copies", c.partial_hit_tokens);
  require(swaps, "swaps that fell back to recompute for a short host pool", c.swap_fallbacks);
  require(!swaps, "groups of several sequences re-admitted after recompute", c.group_recomputed);
  require(grouped, "prefill chunks of a sequence holding only up to its chunk", c.chunked_prefills);
  require(grouped, "steps that left blocks reserved for running prefills", c.reserved_steps);
  return out;
}

namespace detail {

inline rc::Gen<admission_key> admission_keys() {
  return rc::gen::construct<admission_key>(rc::gen::inRange<std::int32_t>(-2, 3), rc::gen::inRange<std::uint64_t>(0, 6));
}

inline std::ostream& operator<<(std::ostream& os, admission_key k) {
  return os << "{priority " << k.priority << ", arrival " << k.arrival << "}";
}

/// before() as a strict weak order over three keys: irreflexive, asymmetric, transitive, and
/// with transitive incomparability (what sorted insertion relies on).
template <class Admission>
void check_admission_order() {
  const admission_key a = *admission_keys();
  const admission_key b = *admission_keys();
  const admission_key c = *admission_keys();
  const auto before = [](admission_key x, admission_key y) { return Admission::before(x, y); };
  const auto equivalent = [&](admission_key x, admission_key y) { return !before(x, y) && !before(y, x); };
  std::ostringstream keys;
  keys << "keys a " << a << ", b " << b << ", c " << c;
  RC_LOG() << keys.str() << '\n';
  if (before(a, a)) RC_FAIL("before(a, a) is true: the order is not irreflexive");
  if (before(a, b) && before(b, a)) RC_FAIL("before(a, b) and before(b, a) are both true");
  if (before(a, b) && before(b, c) && !before(a, c)) RC_FAIL("before(a, b) and before(b, c) but not before(a, c)");
  if (equivalent(a, b) && equivalent(b, c) && !equivalent(a, c)) {
    RC_FAIL("a ~ b and b ~ c (neither before the other) but not a ~ c");
  }
}

template <class Admission, class Preemption>
consteval bool scheduler_policies_conform() {
  static_assert(admission_policy<Admission>,
                "pagedkv::testing: Admission is not a pagedkv::admission_policy (scheduler_policy.hpp): it needs "
                "static bool before(admission_key, admission_key)");
  static_assert(preemption_policy<Preemption>,
                "pagedkv::testing: Preemption is not a pagedkv::preemption_policy (scheduler_policy.hpp): it "
                "needs a static member `mode` convertible to pagedkv::preemption_mode");
  return admission_policy<Admission> && preemption_policy<Preemption>;
}

template <class Testable>
bool run_checked(const std::string& id, const rc::detail::TestParams& params, Testable&& testable, std::string& message) {
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  metadata.description = id;
  const rc::detail::TestResult result = rc::detail::checkTestable(std::forward<Testable>(testable), metadata, params);
  if (result.template is<rc::detail::SuccessResult>()) return true;
  std::ostringstream out;
  rc::detail::printResultMessage(result, out);
  message = std::move(out).str();
  return false;
}

}  // namespace detail

/// Checks that Admission::before is a strict weak order over random triples of keys, then runs
/// the stateful property of scheduler<Admission, Preemption, Manager> and checks the coverage it
/// reached; both for RapidCheck's max_success cases at its max_size, raised to options.min_cases
/// and options.min_size. The template parameters
/// are in scheduler's order; a policy that does not model its concept fails with a static_assert
/// naming what is missing. Manager may be a kv_cache_manager with the caller's own free-list,
/// hash and eviction policies. Prints nothing beyond RapidCheck's configuration line.
template <class Admission = fcfs_admission, class Preemption = preempt_by_recompute, class Manager = kv_cache_manager<>>
scheduler_conformance_report check_scheduler_conformance(const scheduler_conformance_options& options = {}) {
  scheduler_conformance_report report;
  report.name = options.name;
  if constexpr (detail::scheduler_policies_conform<Admission, Preemption>()) {
    using scheduler_type = scheduler<Admission, Preemption, Manager>;
    rc::detail::TestParams params = rc::detail::configuration().testParams;
    params.maxSuccess = std::max(params.maxSuccess, options.min_cases);
    params.maxSize = std::max(params.maxSize, options.min_size);
    report.order_held = detail::run_checked(options.name + "/admission order", params,
                                            [] { detail::check_admission_order<Admission>(); },
                                            report.order_counterexample);
    report.property_held = detail::run_checked(
        options.name, params, [&report] { run_scheduler_property<scheduler_type>(report.reached); },
        report.counterexample);
    report.unreached = unreached_scheduler_paths(report.reached, scheduler_policies<scheduler_type>::swaps,
                                                 pagedkv::detail::grouped_kv_manager<Manager>);
  }
  return report;
}

}  // namespace pagedkv::testing
