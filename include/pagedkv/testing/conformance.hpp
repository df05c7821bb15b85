// Policy conformance: runs the project's own stateful property of kv_cache_manager
// (kv_cache_manager_commands.hpp, checked against kv_cache_manager_model.hpp) over a manager built
// with the caller's free-list, hash and eviction policies, and reports what it found and reached.
//
//   #include <pagedkv/testing/conformance.hpp>
//   const auto report = pagedkv::testing::check_kv_cache_manager_conformance<my_free_list>();
//   if (!report) std::cerr << report;  // the shrunk counterexample, or the paths never reached
//
// The number of command sequences is RapidCheck's max_success (RC_PARAMS, default 100); the seed
// is printed when RapidCheck loads its configuration, and a failure prints the RC_PARAMS string
// that reproduces it. conformance_gtest.hpp turns a report into GoogleTest failures. Pulls in
// RapidCheck; pagedkv.hpp does not include it. Link pagedkv::testing.
#pragma once

#include <pagedkv/eviction.hpp>
#include <pagedkv/free_list.hpp>
#include <pagedkv/hash.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/testing/checked_eviction.hpp>
#include <pagedkv/testing/kv_cache_manager_commands.hpp>
#include <pagedkv/testing/kv_cache_manager_model.hpp>

#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace pagedkv::testing {

struct conformance_options {
  /// RapidCheck's test id: the key of a reproduce string in RC_PARAMS, and the report's title.
  std::string name = "kv_cache_manager conformance";
  /// The hit rejections the hash leads to (kv_cache_manager_model.hpp): none for a hash that does
  /// not collide on purpose, which then fails at the first rejection for tokens or key; a
  /// colliding hash must reach each it names.
  expected_rejections rejections{};
};

/// What a conformance run found. True when no command sequence failed and every expected path
/// was reached.
struct conformance_report {
  std::string name;
  bool property_held = false;
  std::string counterexample;  ///< RapidCheck's message when the property failed: the shrunk
                               ///< commands and the RC_PARAMS string that reproduces them
  coverage reached;            ///< summed over every command sequence, shrinking included
  std::vector<std::string> unreached;  ///< a line per expected path reached too rarely

  explicit operator bool() const noexcept { return property_held && unreached.empty(); }

  friend std::ostream& operator<<(std::ostream& os, const conformance_report& r) {
    os << r.name << ": " << (r.property_held ? "property held" : "property failed") << "; coverage: " << r.reached
       << '\n';
    if (!r.property_held) os << r.counterexample << '\n';
    for (const std::string& line : r.unreached) os << "not reached: " << line << '\n';
    return os;
  }
};

/// The paths a run of `cases` command sequences must reach, each at least once per 100 cases (at
/// 1300 cases the project's runs take each 10-500 times per 100). A hit refused for an earlier
/// generation of its parent block is reached about once per 1300 cases by any policy, too rarely
/// to require; the coverage reports it.
template <class Eviction>
std::vector<std::string> unreached_paths(const coverage& c, expected_rejections rejections, std::int64_t cases) {
  const std::int64_t floor = std::max<std::int64_t>(1, cases / 100);
  std::vector<std::string> out;
  const auto require = [&](bool wanted, const char* what, std::int64_t count, std::int64_t least) {
    if (wanted && count < least) {
      std::ostringstream line;
      line << what << ": " << count << " times, fewer than " << least;
      out.push_back(line.str());
    }
  };
  require(true, "cached more than one block at once", c.max_cached_blocks, 2);
  require(true, "blocks cached under a parent", c.children_stored, floor);
  require(true, "allocations that hit two or more cached blocks", c.long_hits, floor);
  require(true, "block ids cached again after eviction", c.recached_blocks, floor);
  require(true, "forks at a position inside a block", c.forks_in_a_block, floor);
  require(true, "partial hits", c.partial_hits, floor);
  require(true, "checks of a partial hit's held source", c.held_partial_sources, floor);
  require(true, "partly filled blocks kept cached when their sequence was freed", c.cached_tails, floor);
  require(rejections.tokens, "hits rejected for their tokens", c.rejected_tokens, floor);
  require(rejections.parent, "hits rejected for their parent block", c.rejected_parent, floor);
  require(rejections.key, "hits rejected for their adapter or salt", c.rejected_key, floor);
  require(std::same_as<Eviction, lru_eviction>, "LRU evictions checked against another idle block",
          c.lru_order_checks, floor);
  return out;
}

namespace detail {

/// Each policy against its concept, with a message naming what the concept asks, before any
/// template that requires it is instantiated.
template <class FreeList, class Hash, class Eviction>
consteval bool policies_conform() {
  static_assert(free_list_policy<FreeList>,
                "pagedkv::testing: FreeList is not a pagedkv::free_list_policy (free_list.hpp): it needs a "
                "nested class `list` constructible from std::int32_t (the capacity) with void push(block_id), "
                "block_id pop() and a const size() convertible to std::int32_t");
  static_assert(hash_policy<Hash>,
                "pagedkv::testing: Hash is not a pagedkv::hash_policy (hash.hpp): it needs to be default "
                "constructible with a const call operator (block_hash parent, std::span<const std::byte>) "
                "returning block_hash");
  static_assert(eviction_policy<Eviction>,
                "pagedkv::testing: Eviction is not a pagedkv::eviction_policy (eviction.hpp): it needs a "
                "nested class `queue` constructible from std::int32_t with void push(block_id, std::int32_t "
                "priority), void erase(block_id), std::optional<block_id> pop(), const bool contains(block_id) "
                "and a const size() convertible to std::int32_t");
  return free_list_policy<FreeList> && hash_policy<Hash> && eviction_policy<Eviction>;
}

}  // namespace detail

/// Runs the stateful property of kv_cache_manager<FreeList, Hash, Eviction> for RapidCheck's
/// max_success command sequences, then checks the coverage the sequences reached. The eviction
/// policy runs inside checked_eviction, which fails a pop() of a block that is not idle, or of a
/// pinned one when the queue has unpin_all(). The template parameters are in kv_cache_manager's
/// order; a policy that does not model its concept fails with a static_assert naming what is
/// missing. Prints nothing beyond RapidCheck's configuration line; the report says everything.
template <class FreeList = lifo_free_list, class Hash = xxh3_hash, class Eviction = lru_eviction>
conformance_report check_kv_cache_manager_conformance(const conformance_options& options = {}) {
  conformance_report report;
  report.name = options.name;
  if constexpr (detail::policies_conform<FreeList, Hash, Eviction>()) {
    using manager = kv_cache_manager<FreeList, Hash, checked_eviction<Eviction>>;
    rc::detail::TestMetadata metadata;
    metadata.id = options.name;
    metadata.description = options.name;
    const rc::detail::TestResult result = rc::detail::checkTestable(
        [&report, &options] { run_kv_cache_manager_property<manager>(report.reached, options.rejections); }, metadata);
    report.property_held = result.template is<rc::detail::SuccessResult>();
    if (!report.property_held) {
      std::ostringstream message;
      rc::detail::printResultMessage(result, message);
      report.counterexample = std::move(message).str();
    }
    report.unreached = unreached_paths<Eviction>(report.reached, options.rejections,
                                                 rc::detail::configuration().testParams.maxSuccess);
  }
  return report;
}

}  // namespace pagedkv::testing
