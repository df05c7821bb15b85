// RapidCheck stateful test of the scheduler with a null model: random arrivals, lengths, group
// sizes (parallel samples, beams), aborts and tiny pools that force preemption, for each admission
// and preemption policy. The harness plays the engine: it executes each plan's swaps and copies on
// a stamped KV array, writes (token, position) at every scheduled slot, and checks that every
// scheduled sequence reads back its whole computed history before its new tokens.
//
// Invariants: the token budget and sequence limit are never exceeded; no request is lost or
// duplicated; a request that fits the pool with its prompt's blocks shared finishes with exactly
// num_samples (or beam_width) sequences of exactly max_new_tokens tokens, one that cannot fit even
// so is rejected; at the end every block is free.
//
// Requests are drawn to reach the edges: some fit only because their samples share the prompt,
// some never fit, and host pools are often too small to swap a group out. Each property counts
// how often each path ran over its cases and fails if one ran too rarely (coverage).
#include <pagedkv/scheduler.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/state.h>

#include <iostream>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace pagedkv {
namespace {

using test::stamp;

template <class Scheduler>
struct engine {
  Scheduler s;
  std::int32_t block_size;
  std::vector<stamp> device_kv;
  std::vector<stamp> host_kv;
  std::map<request_id, request_params> submitted;
  std::set<request_id> aborted;
  std::set<request_id> finished;
  std::mt19937 rng;

  engine(const scheduler_options& so, const kv_cache_options& ko, unsigned seed)
      : s(so, ko),
        block_size(ko.block_size),
        device_kv(static_cast<std::size_t>(ko.num_device_blocks * ko.block_size)),
        host_kv(static_cast<std::size_t>(std::max(ko.num_host_blocks, 1) * ko.block_size)),
        rng(seed) {}

  void copy_block(const std::vector<stamp>& from, block_id src, std::vector<stamp>& to, block_id dst) {
    test::copy_block(from, src, to, dst, block_size);
  }

  /// Null model plus a beam model: samples continue with random tokens; beams pick random parents.
  std::vector<continuation> sample(const sampling_request& r) {
    std::vector<continuation> next;
    auto token = [&] { return static_cast<token_id>(rng() % 5); };
    if (r.params->beam_width > 0) {
      for (std::int32_t i = 0; i < r.params->beam_width; ++i) {
        next.push_back({r.seqs[rng() % r.seqs.size()], token(), false});
      }
    } else if (r.first) {
      // Distinct first tokens: samples share their prompt and nothing after it, so that what a
      // group needs is known exactly (blocks_needed).
      for (std::int32_t i = 0; i < r.params->num_samples; ++i) next.push_back({r.seqs[0], i, false});
    } else {
      for (seq_id seq : r.seqs) next.push_back({seq, token(), false});
    }
    return next;
  }

  void step() {
    const step_plan plan = s.schedule();
    RC_ASSERT(plan.num_tokens <= s.options().max_tokens_per_step);
    RC_ASSERT(s.num_running_seqs() <= s.options().max_num_seqs);
    for (const block_copy& c : plan.swap_out) copy_block(device_kv, c.src, host_kv, c.dst);
    for (const block_copy& c : plan.swap_in) copy_block(host_kv, c.src, device_kv, c.dst);
    for (const block_copy& c : plan.copies) copy_block(device_kv, c.src, device_kv, c.dst);
    std::int32_t tokens = 0;
    std::set<seq_id> seen;
    for (const scheduled_sequence& b : plan.batch) {
      RC_ASSERT(seen.insert(b.seq).second);  // a sequence appears once per step
      RC_ASSERT(b.num_tokens >= 1);
      tokens += b.num_tokens;
      const block_table& table = s.kv().table(b.seq);
      const std::span<const token_id> history = s.kv().tokens(b.seq);
      RC_ASSERT(b.first_position == s.kv().num_computed_tokens(b.seq));
      // Attention reads positions [0, first_position): they must hold this sequence's history.
      for (std::int32_t p = 0; p < b.first_position; ++p) {
        RC_ASSERT((device_kv[static_cast<std::size_t>(table.slot(p))] == stamp{history[static_cast<std::size_t>(p)], p}));
      }
      for (std::int32_t i = 0; i < b.num_tokens; ++i) {
        const std::int32_t p = b.first_position + i;
        const slot_id slot = plan.slot_mapping[b.slot_offset + static_cast<std::size_t>(i)];
        RC_ASSERT(slot == table.slot(p));
        device_kv[static_cast<std::size_t>(slot)] = {history[static_cast<std::size_t>(p)], p};
      }
    }
    RC_ASSERT(tokens == plan.num_tokens);
    for (request_id id : s.complete(plan, [&](const sampling_request& r) { return sample(r); })) {
      RC_ASSERT(finished.insert(id).second);
    }
  }
};

struct model {
  std::vector<request_id> ids;
  request_id next_id = 1;
  std::int32_t block_size = 1;
  std::int32_t num_blocks = 1;
};

/// Device blocks a request holds at its last step, when each of its `ways` sequences holds
/// prompt + max_new_tokens - 1 tokens (the last sampled token is never written): the prompt's whole
/// blocks once, the rest once per sequence. An upper bound for beams, which may share more; exact
/// for samples, whose first tokens differ. With one new token nothing is appended after the prompt.
std::int32_t blocks_needed(const request_params& p, std::int32_t block_size) {
  const auto prompt = static_cast<std::int32_t>(p.prompt.size());
  const auto blocks = [&](std::int32_t tokens) { return (tokens + block_size - 1) / block_size; };
  if (p.max_new_tokens == 1) return blocks(prompt);
  const std::int32_t ways = std::max(p.num_samples, p.beam_width);
  const std::int32_t shared = prompt / block_size;
  return shared + ways * (blocks(prompt + p.max_new_tokens - 1) - shared);
}

/// How often each edge was reached over all cases of one property.
struct coverage {
  std::int64_t cases = 0;
  std::int64_t fit_only_by_sharing = 0;  ///< finished; unshared, its sequences would not fit
  std::int64_t never_fit = 0;            ///< rejected, as it had to be
  std::int64_t rejected_running = 0;     ///< of those, rejected after it started
  std::int64_t group_recomputed = 0;     ///< a group of several sequences re-admitted after recompute
  std::int64_t swap_fallbacks = 0;       ///< preempt_by_swap found the host pool short
  std::int64_t swapped = 0;
};

template <class Scheduler>
using command = rc::state::Command<model, engine<Scheduler>>;

template <class Scheduler>
struct add_cmd : command<Scheduler> {
  request_id id;
  request_params params;
  explicit add_cmd(const model& m) : id(m.next_id) {
    const auto ways = *rc::gen::inRange(1, 4);
    const bool beams = *rc::gen::weightedElement<bool>({{3, false}, {1, true}});
    params.max_new_tokens = *rc::gen::inRange(1, 12);
    // Shared first tokens make prefix hits. Long prompts make groups that fit only by sharing them,
    // and some that never fit (see blocks_needed).
    const auto shared = *rc::gen::inRange(0, 10);
    const auto own = *rc::gen::weightedElement<int>({{3, *rc::gen::inRange(1, 14)}, {1, *rc::gen::inRange(14, 48)}});
    for (int i = 0; i < shared; ++i) params.prompt.push_back(100 + i);
    for (int i = 0; i < own; ++i) params.prompt.push_back(*rc::gen::inRange(0, 4));
    (beams ? params.beam_width : params.num_samples) = ways;
    // Mostly requests that fit, so that the pool is contended rather than idle.
    RC_PRE(blocks_needed(params, m.block_size) <= m.num_blocks + 8 || *rc::gen::inRange(0, 4) == 0);
    params.priority = *rc::gen::inRange(0, 3);
  }
  void apply(model& m) const override {
    m.ids.push_back(id);
    ++m.next_id;
  }
  void run(const model&, engine<Scheduler>& e) const override {
    e.s.add_request(id, params);
    e.submitted.emplace(id, params);
  }
  void show(std::ostream& os) const override {
    os << "add " << id << " (" << params.prompt.size() << " + " << params.max_new_tokens << " x "
       << std::max(params.num_samples, params.beam_width) << (params.beam_width ? " beams)" : " samples)");
  }
};

template <class Scheduler>
struct step_cmd : command<Scheduler> {
  std::int32_t count;
  explicit step_cmd(const model&) : count(*rc::gen::inRange(1, 6)) {}
  void run(const model&, engine<Scheduler>& e) const override {
    for (std::int32_t i = 0; i < count; ++i) e.step();
  }
  void show(std::ostream& os) const override { os << "step x" << count; }
};

template <class Scheduler>
struct abort_cmd : command<Scheduler> {
  request_id id;
  explicit abort_cmd(const model& m) {
    RC_PRE(!m.ids.empty());
    id = *rc::gen::elementOf(m.ids);
  }
  void checkPreconditions(const model& m) const override {  // shrinking may drop the add
    RC_PRE(std::find(m.ids.begin(), m.ids.end(), id) != m.ids.end());
  }
  void run(const model&, engine<Scheduler>& e) const override {
    const std::int32_t free_before = e.s.kv().num_free_blocks();
    const bool live = !e.finished.contains(id) && !e.aborted.contains(id) &&
                      e.s.output(id).state != request_state::rejected;
    RC_ASSERT(e.s.abort(id) == live);
    if (live) {
      e.aborted.insert(id);
      RC_ASSERT(e.s.kv().num_free_blocks() >= free_before);
    }
  }
  void show(std::ostream& os) const override { os << "abort " << id; }
};

template <class Scheduler>
void run_scheduler_property(bool swap, coverage& seen) {
  const auto block_size = *rc::gen::element(1, 2, 4, 16);
  const auto num_blocks = *rc::gen::inRange(48 / block_size + 2, 160 / block_size + 4);
  const scheduler_options so{.max_tokens_per_step = *rc::gen::inRange(4, 64), .max_num_seqs = *rc::gen::inRange(3, 12)};
  constexpr bool extents = locality_free_list_policy<typename Scheduler::manager_type::pool_type::free_list_type>;
  const kv_cache_options ko{.block_size = block_size,
                            .num_device_blocks = num_blocks,
                            .num_host_blocks = swap ? *rc::gen::inRange(0, 24) : 0,
                            .enable_prefix_caching = *rc::gen::arbitrary<bool>(),
                            .watermark_blocks = *rc::gen::inRange(0, 2),
                            .extent_blocks = extents ? *rc::gen::inRange(1, num_blocks + 1) : 0};
  RC_PRE(so.max_num_seqs >= 3);
  engine<Scheduler> e(so, ko, *rc::gen::arbitrary<unsigned>());
  model initial;
  initial.block_size = block_size;
  initial.num_blocks = num_blocks - ko.watermark_blocks;
  rc::state::check(initial, e,
                   rc::state::gen::execOneOfWithArgs<add_cmd<Scheduler>, add_cmd<Scheduler>, step_cmd<Scheduler>,
                                                     step_cmd<Scheduler>, step_cmd<Scheduler>, abort_cmd<Scheduler>>());
  // Drain: everything ends (the null model never stops early), well within a step bound.
  for (int i = 0; i < 20000 && e.s.has_unfinished(); ++i) e.step();
  RC_ASSERT(!e.s.has_unfinished());
  ++seen.cases;
  for (const auto& [id, params] : e.submitted) {
    const request_output& out = e.s.output(id);
    if (e.aborted.contains(id)) {
      RC_ASSERT(out.state == request_state::aborted);
      RC_ASSERT(!e.finished.contains(id));
      continue;
    }
    const std::int32_t ways = std::max(params.num_samples, params.beam_width);
    if (out.num_preemptions > 0 && ways > 1 && !swap) ++seen.group_recomputed;
    // Admission keeps the watermark free; appends may take it.
    const std::int32_t needed = blocks_needed(params, block_size);
    if (needed + ko.watermark_blocks <= num_blocks) {
      RC_ASSERT(out.state == request_state::finished);
    } else if (needed > num_blocks && params.beam_width == 0) {
      RC_ASSERT(out.state == request_state::rejected);
      ++seen.never_fit;
      continue;
    } else if (out.state == request_state::rejected) {
      continue;  // between the two bounds either is right
    }
    RC_ASSERT(out.state == request_state::finished);
    RC_ASSERT(e.finished.contains(id));
    const std::int32_t unshared = ways * ((static_cast<std::int32_t>(params.prompt.size()) + params.max_new_tokens - 1 + block_size - 1) / block_size);
    if (params.max_new_tokens > 1 && unshared > num_blocks) ++seen.fit_only_by_sharing;
    RC_ASSERT(out.sequences.size() == static_cast<std::size_t>(ways));
    for (const auto& tokens : out.sequences) RC_ASSERT(tokens.size() == static_cast<std::size_t>(params.max_new_tokens));
  }
  const scheduler_stats& stats = e.s.stats();
  RC_ASSERT(stats.rejected_at_admission + stats.rejected_running ==
            std::count_if(e.submitted.begin(), e.submitted.end(), [&](const auto& r) {
              return e.s.output(r.first).state == request_state::rejected;
            }));
  seen.rejected_running += stats.rejected_running;
  seen.swapped += stats.preempted_by_swap;
  if (swap) seen.swap_fallbacks += stats.preempted_by_recompute;
  RC_ASSERT(e.finished.size() + e.aborted.size() + static_cast<std::size_t>(stats.rejected_at_admission + stats.rejected_running) ==
            e.submitted.size());
  auto& kv = e.s.kv();
  RC_ASSERT(kv.num_sequences() == 0u);
  RC_ASSERT(kv.num_free_blocks() == num_blocks);
  kv.reset_prefix_cache();
  RC_ASSERT(kv.device_pool().num_free_blocks() == num_blocks);
  RC_ASSERT(kv.num_free_host_blocks() == ko.num_host_blocks);
}

/// Runs one property for the configured number of cases (RC_PARAMS, set by tests/core/CMakeLists.txt)
/// and checks that each edge was reached: at least one case in `per` for each path.
template <class Scheduler>
void check_with_coverage(bool swap) {
  coverage seen;
  ASSERT_TRUE(rc::check([&] { run_scheduler_property<Scheduler>(swap, seen); }));
  const std::int64_t at_least = seen.cases / 100;  // of the ~1% to 10% each path reaches at 1500 cases
  EXPECT_GE(seen.fit_only_by_sharing, at_least);
  EXPECT_GE(seen.never_fit, at_least);
  EXPECT_GE(seen.rejected_running, at_least);
  if (swap) {
    EXPECT_GE(seen.swapped, at_least);
    EXPECT_GE(seen.swap_fallbacks, at_least);
  } else {
    EXPECT_GE(seen.group_recomputed, at_least);
  }
  std::cout << "coverage over " << seen.cases << " cases: fit only by sharing " << seen.fit_only_by_sharing
            << ", never fit " << seen.never_fit << " (rejected running " << seen.rejected_running
            << "), groups recomputed " << seen.group_recomputed << ", swapped " << seen.swapped
            << ", swap fallbacks " << seen.swap_fallbacks << "\n";
}

TEST(SchedulerStateful, FcfsRecompute) { check_with_coverage<scheduler<fcfs_admission, preempt_by_recompute>>(false); }
TEST(SchedulerStateful, FcfsSwap) { check_with_coverage<scheduler<fcfs_admission, preempt_by_swap>>(true); }
TEST(SchedulerStateful, PriorityRecompute) { check_with_coverage<scheduler<priority_admission, preempt_by_recompute>>(false); }
TEST(SchedulerStateful, PrioritySwap) { check_with_coverage<scheduler<priority_admission, preempt_by_swap>>(true); }
TEST(SchedulerStateful, FcfsSwapExtents) {
  check_with_coverage<scheduler<fcfs_admission, preempt_by_swap, kv_cache_manager<extent_free_list>>>(true);
}

TEST(SchedulerStateful, RunsTheConfiguredNumberOfCases) {
  // RC_PARAMS must reach this test: before 2026-11-25 the ctest registration dropped it, and each
  // property ran RapidCheck's default of 100 cases.
  EXPECT_EQ(rc::detail::configuration().testParams.maxSuccess, PAGEDKV_RC_CASES);
}

}  // namespace
}  // namespace pagedkv
