// RapidCheck stateful test of the scheduler with a null model: random arrivals, lengths, group
// sizes (parallel samples, beams), aborts and tiny pools that force preemption, for each admission
// and preemption policy. The harness plays the engine: it executes each plan's swaps and copies on
// a stamped KV array, writes (token, position) at every scheduled slot, and checks that every
// scheduled sequence reads back its whole computed history before its new tokens.
//
// Invariants: the token budget and sequence limit are never exceeded; no request is lost or
// duplicated; every request that is not aborted finishes with exactly num_samples (or beam_width)
// sequences of exactly max_new_tokens tokens; at the end every block is free.
#include <pagedkv/scheduler.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

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
      for (std::int32_t i = 0; i < r.params->num_samples; ++i) next.push_back({r.seqs[0], token(), false});
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
    // Shared first tokens make prefix hits; the request must fit an empty pool on its own.
    const auto shared = *rc::gen::inRange(0, 10);
    const auto own = *rc::gen::inRange(1, 14);
    for (int i = 0; i < shared; ++i) params.prompt.push_back(100 + i);
    for (int i = 0; i < own; ++i) params.prompt.push_back(*rc::gen::inRange(0, 4));
    const std::int32_t per_seq = (static_cast<std::int32_t>(params.prompt.size()) + params.max_new_tokens + m.block_size - 1) / m.block_size;
    RC_PRE(ways * per_seq <= m.num_blocks);
    (beams ? params.beam_width : params.num_samples) = ways;
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
    const bool live = !e.finished.contains(id) && !e.aborted.contains(id);
    RC_ASSERT(e.s.abort(id) == live);
    if (live) {
      e.aborted.insert(id);
      RC_ASSERT(e.s.kv().num_free_blocks() >= free_before);
    }
  }
  void show(std::ostream& os) const override { os << "abort " << id; }
};

template <class Scheduler>
void run_scheduler_property(bool swap) {
  const auto block_size = *rc::gen::element(1, 2, 4, 16);
  const auto num_blocks = *rc::gen::inRange(48 / block_size + 2, 160 / block_size + 4);
  const scheduler_options so{.max_tokens_per_step = *rc::gen::inRange(4, 64), .max_num_seqs = *rc::gen::inRange(3, 12)};
  constexpr bool extents = locality_free_list_policy<typename Scheduler::manager_type::pool_type::free_list_type>;
  const kv_cache_options ko{.block_size = block_size,
                            .num_device_blocks = num_blocks,
                            .num_host_blocks = swap ? *rc::gen::inRange(0, 40) : 0,
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
  // Drain: everything finishes (the null model never stops early), well within a step bound.
  for (int i = 0; i < 20000 && e.s.has_unfinished(); ++i) e.step();
  RC_ASSERT(!e.s.has_unfinished());
  for (const auto& [id, params] : e.submitted) {
    const request_output& out = e.s.output(id);
    if (e.aborted.contains(id)) {
      RC_ASSERT(out.state == request_state::aborted);
      RC_ASSERT(!e.finished.contains(id));
      continue;
    }
    RC_ASSERT(out.state == request_state::finished);  // requests are sized to fit: none is rejected
    RC_ASSERT(e.finished.contains(id));
    const auto ways = static_cast<std::size_t>(std::max(params.num_samples, params.beam_width));
    RC_ASSERT(out.sequences.size() == ways);
    for (const auto& tokens : out.sequences) RC_ASSERT(tokens.size() == static_cast<std::size_t>(params.max_new_tokens));
  }
  RC_ASSERT(e.finished.size() + e.aborted.size() == e.submitted.size());
  auto& kv = e.s.kv();
  RC_ASSERT(kv.num_sequences() == 0u);
  RC_ASSERT(kv.num_free_blocks() == num_blocks);
  kv.reset_prefix_cache();
  RC_ASSERT(kv.device_pool().num_free_blocks() == num_blocks);
  RC_ASSERT(kv.num_free_host_blocks() == ko.num_host_blocks);
}

RC_GTEST_PROP(SchedulerStateful, FcfsRecompute, ()) { run_scheduler_property<scheduler<fcfs_admission, preempt_by_recompute>>(false); }
RC_GTEST_PROP(SchedulerStateful, FcfsSwap, ()) { run_scheduler_property<scheduler<fcfs_admission, preempt_by_swap>>(true); }
RC_GTEST_PROP(SchedulerStateful, PriorityRecompute, ()) { run_scheduler_property<scheduler<priority_admission, preempt_by_recompute>>(false); }
RC_GTEST_PROP(SchedulerStateful, PrioritySwap, ()) { run_scheduler_property<scheduler<priority_admission, preempt_by_swap>>(true); }
RC_GTEST_PROP(SchedulerStateful, FcfsSwapExtents, ()) {
  run_scheduler_property<scheduler<fcfs_admission, preempt_by_swap, kv_cache_manager<extent_free_list>>>(true);
}

}  // namespace
}  // namespace pagedkv
