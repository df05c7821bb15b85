// The reference harness of pagedkv::scheduler that the scheduler conformance runs check a
// scheduler against (pagedkv::testing; scheduler_commands.hpp drives it, conformance.hpp runs it).
// scheduler_model<Scheduler> plays the engine around the scheduler under test with a null
// language model:
// - it executes each plan's swaps and copies on simulated KV (device and host arrays of stamps,
//   kv_cache_manager_model.hpp's), writes (token, position, context) at every scheduled slot of
//   every KV cache group, and checks that every scheduled sequence reads back, group by group and
//   addressed through that group's block table, the computed history its attention reads (all of
//   it for full attention, the window or chunk for a windowed group) before its new tokens;
// - with KV cache groups (hybrid_kv_cache_manager), after every step no table of a live sequence
//   holds a block wholly before what its group's next query reads, and none is null inside it;
//   the scheduler's kept count of blocks reserved for running prefills equals a fresh count after
//   every schedule(), complete() and abort();
// - it checks each plan against the limits: the token budget and the sequence limit, a sequence
//   at most once per step, slots equal to the table's;
// - it samples: parallel samples get distinct first tokens (so that what a request needs is known
//   exactly: blocks_needed), later tokens and beam parents are random.
// The run's end checks (scheduler_commands.hpp) are: no request lost or duplicated; a request that
// fits the pool with its prompt's blocks shared finishes with exactly its sequences of exactly
// max_new_tokens tokens, one that cannot fit even so is rejected; every block is free at the end.
// The coverage counters say which paths a run reached. Pulls in RapidCheck.
#pragma once

#include <pagedkv/pool_guard.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/testing/kv_cache_manager_model.hpp>

#include <rapidcheck.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace pagedkv::testing {

/// A scheduler's policies, for a run to know whether preemption swaps.
template <class Scheduler>
struct scheduler_policies;
template <class Admission, class Preemption, class Manager>
struct scheduler_policies<scheduler<Admission, Preemption, Manager>> {
  using admission = Admission;
  using preemption = Preemption;
  static constexpr bool swaps = Preemption::mode == preemption_mode::swap;
};

/// Counted over every case of one property (shrinking included) and checked after its run.
struct scheduler_coverage {
  std::int64_t cases = 0;
  std::int64_t fit_only_by_sharing = 0;  ///< finished; unshared, its sequences would not fit
  std::int64_t never_fit = 0;            ///< rejected, as it had to be
  std::int64_t rejected_running = 0;     ///< of those, rejected after it started
  std::int64_t group_recomputed = 0;     ///< a group of several sequences re-admitted after recompute
  std::int64_t swap_fallbacks = 0;       ///< preempt_by_swap found the host pool short
  std::int64_t swapped = 0;
  std::int64_t poisoned_blocks = 0;      ///< with a pool_guard: blocks it poisoned (freed or fresh)
  std::int64_t shared_in_flight = 0;     ///< prompt tokens admitted on blocks another request was computing
  std::int64_t waiters_released = 0;     ///< ... whose source left (preempted, aborted) before computing them
  std::int64_t chunked_prefills = 0;     ///< prefill chunks of a sequence holding only up to the chunk
  std::int64_t reserved_steps = 0;       ///< steps that left blocks reserved for running prefills
  std::int64_t partial_hit_tokens = 0;   ///< prompt tokens a partial hit's copies served

  friend std::ostream& operator<<(std::ostream& os, const scheduler_coverage& c) {
    return os << c.cases << " cases: fit only by sharing " << c.fit_only_by_sharing << ", never fit " << c.never_fit
              << " (rejected running " << c.rejected_running << "), groups recomputed " << c.group_recomputed
              << ", swapped " << c.swapped << ", swap fallbacks " << c.swap_fallbacks
              << ", tokens shared in flight " << c.shared_in_flight << ", waiters released " << c.waiters_released
              << ", chunked prefills " << c.chunked_prefills << ", steps with reserved blocks " << c.reserved_steps
              << ", partial hit tokens " << c.partial_hit_tokens
              << (c.poisoned_blocks > 0 ? ", blocks poisoned by the guard " + std::to_string(c.poisoned_blocks) : "");
  }
};

/// Device blocks a request holds at its last step, when each of its `ways` sequences holds
/// prompt + max_new_tokens - 1 tokens (the last sampled token is never written): the prompt's whole
/// blocks once, the rest once per sequence. An upper bound for beams, which may share more; exact
/// for samples, whose first tokens differ. With one new token nothing is appended after the prompt.
inline std::int32_t blocks_needed(const request_params& p, std::int32_t block_size) {
  const auto prompt = static_cast<std::int32_t>(p.prompt.size());
  const auto blocks = [&](std::int32_t tokens) { return (tokens + block_size - 1) / block_size; };
  if (p.max_new_tokens == 1) return blocks(prompt);
  const std::int32_t ways = std::max(p.num_samples, p.beam_width);
  const std::int32_t shared = prompt / block_size;
  return shared + ways * (blocks(prompt + p.max_new_tokens - 1) - shared);
}

/// The scheduler under test and the engine around it; commands (scheduler_commands.hpp) submit,
/// step and abort through it.
template <class Scheduler>
struct scheduler_model {
  Scheduler scheduler;
  std::int32_t block_size;
  std::vector<stamp> device_kv;
  std::vector<stamp> host_kv;
  std::map<request_id, request_params> submitted;
  std::set<request_id> aborted;
  std::set<request_id> finished;
  std::mt19937 rng;
  /// With a guard (pool_guard.hpp) every step is audited and the blocks it hands over are
  /// poisoned in device_kv before the plan runs: the read-back checks then prove it never poisons
  /// a block whose contents are still read.
  std::optional<pool_guard<typename Scheduler::manager_type>> guard;
  std::int64_t poisoned_blocks = 0;  ///< blocks the guard handed over to poison
  std::int64_t chunked_prefills = 0;  ///< scheduler_coverage's, this run's
  std::int64_t reserved_steps = 0;

  static constexpr bool grouped = pagedkv::detail::grouped_kv_manager<typename Scheduler::manager_type>;

  scheduler_model(const scheduler_options& so, const typename Scheduler::manager_options& ko, unsigned seed,
                  bool guarded = false)
      : scheduler(so, ko),
        block_size(ko.block_size),
        device_kv(static_cast<std::size_t>(ko.num_device_blocks * ko.block_size), poison),
        host_kv(static_cast<std::size_t>(std::max(ko.num_host_blocks, 1) * ko.block_size), poison),
        rng(seed) {
    if constexpr (!grouped) {  // pool_guard audits kv_cache_manager's one table per sequence
      if (guarded) {
        guard.emplace(scheduler.kv(), [this](std::span<const block_id> blocks) {
          for (block_id b : blocks) {
            std::fill_n(device_kv.begin() + static_cast<std::ptrdiff_t>(b) * block_size, block_size, poison);
          }
        });
      }
    }
  }
  scheduler_model(const scheduler_model&) = delete;  // the guard's hook holds this

  void copy_block(const std::vector<stamp>& from, block_id src, std::vector<stamp>& to, block_id dst) {
    const auto n = static_cast<std::ptrdiff_t>(block_size);
    std::copy_n(from.begin() + src * n, n, to.begin() + dst * n);
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

  /// The first position of history that group `group`'s query at `position` reads (0 for full
  /// attention, and for every group when the manager keeps every block).
  [[nodiscard]] std::int32_t first_read(std::int32_t group, std::int32_t position) const {
    if constexpr (grouped) {
      const auto& kv = scheduler.kv();
      return kv.options().free_outside_window ? kv.spec(group).first_needed_position(position) : 0;
    } else {
      return 0;
    }
  }

  /// No table holds a block wholly before what its group's next query reads, nor null after it.
  void check_windows() const {
    if constexpr (grouped) {
      scheduler.kv().for_each_sequence([&](seq_id seq, std::span<const block_table> tables, location) {
        const std::int32_t next = scheduler.kv().num_computed_tokens(seq);
        for (std::size_t g = 0; g < tables.size(); ++g) {
          const std::int32_t first = first_read(static_cast<std::int32_t>(g), next) / block_size;
          for (std::int32_t j = 0; j < tables[g].num_blocks(); ++j) RC_ASSERT((tables[g].block(j) == null_block) == (j < first));
        }
      });
    }
  }

  /// Chunk by chunk (a group frees outside its window): no sequence holds more than a step's
  /// tokens past what it computed, so no windowed table holds more than the window and a chunk;
  /// the reservations the scheduler keeps are those its tables give, counted afresh; and admission
  /// never over-commits: the blocks reserved for the running prefills are free.
  void check_chunks(const step_plan& plan) {
    if constexpr (grouped) {
      const auto& kv = scheduler.kv();
      const std::int32_t chunk = scheduler.options().max_tokens_per_step;
      bool per_chunk = false;
      for (std::int32_t g = 0; g < kv.num_groups(); ++g) {
        per_chunk = per_chunk || (kv.options().free_outside_window && kv.spec(g).kind != attention_kind::full);
      }
      if (!per_chunk) return;
      kv.for_each_sequence([&](seq_id seq, std::span<const block_table> tables, location where) {
        if (where != location::device) return;
        RC_ASSERT(kv.num_tokens(seq) - kv.num_computed_tokens(seq) <= chunk);
        for (std::size_t g = 0; g < tables.size(); ++g) {
          const kv_cache_spec& spec = kv.spec(static_cast<std::int32_t>(g));
          if (spec.kind == attention_kind::full) continue;
          const std::int32_t held = static_cast<std::int32_t>(
              std::count_if(tables[g].blocks().begin(), tables[g].blocks().end(), [](block_id b) { return b != null_block; }));
          // The chunk's first query reads window - 1 tokens before it: at most this many blocks.
          RC_ASSERT(held <= (spec.window_tokens - 1 + chunk + block_size - 2) / block_size + 1);
        }
      });
      const std::int32_t reserved = scheduler.num_reserved_blocks();
      RC_ASSERT(reserved == scheduler.count_reserved_blocks());  // the kept count is the tables'
      RC_ASSERT(kv.num_free_blocks() >= reserved);
      reserved_steps += reserved > 0 ? 1 : 0;
      for (const scheduled_sequence& b : plan.batch) {
        chunked_prefills += !b.produces_logits && kv.num_tokens(b.seq) == b.kv_len() ? 1 : 0;
      }
    }
  }

  /// One engine step: schedule, check the plan, execute it on the simulated KV, complete it.
  void step() {
    const step_plan plan = scheduler.schedule();
    check_chunks(plan);
    RC_ASSERT(plan.num_tokens <= scheduler.options().max_tokens_per_step);
    RC_ASSERT(scheduler.num_running_seqs() <= scheduler.options().max_num_seqs);
    if constexpr (!grouped) {
      if (guard) poisoned_blocks += static_cast<std::int64_t>(guard->before_step(plan).size());
    }
    for (const block_copy& c : plan.swap_out) copy_block(device_kv, c.src, host_kv, c.dst);
    for (const block_copy& c : plan.swap_in) copy_block(host_kv, c.src, device_kv, c.dst);
    for (const block_copy& c : plan.copies) copy_block(device_kv, c.src, device_kv, c.dst);
    std::int32_t tokens = 0;
    std::set<seq_id> seen;
    RC_ASSERT(plan.num_groups == scheduler.num_groups());
    RC_ASSERT(plan.slot_mapping.size() == static_cast<std::size_t>(plan.num_tokens * plan.num_groups));
    for (std::size_t row = 0; row < plan.batch.size(); ++row) {
      const scheduled_sequence& b = plan.batch[row];
      RC_ASSERT(seen.insert(b.seq).second);  // a sequence appears once per step
      RC_ASSERT(b.num_tokens >= 1);
      tokens += b.num_tokens;
      const auto& kv = scheduler.kv();
      const std::span<const token_id> history = kv.tokens(b.seq);
      const std::vector<std::uint64_t> context = contexts(submitted.at(b.request).adapter_id, history);
      RC_ASSERT(b.first_position == kv.num_computed_tokens(b.seq));
      const auto expected = [&](std::int32_t p) {
        const auto i = static_cast<std::size_t>(p);
        return stamp{history[i], p, context[i]};
      };
      for (std::int32_t g = 0; g < plan.num_groups; ++g) {
        const block_table& table = scheduler.table(b.seq, g);
        const std::span<const block_id> row_blocks =
            plan.group_block_tables(g).subspan(row * static_cast<std::size_t>(plan.max_blocks_per_seq),
                                               static_cast<std::size_t>(plan.max_blocks_per_seq));
        for (std::int32_t j = 0; j < (b.kv_len() + block_size - 1) / block_size; ++j) {
          RC_ASSERT(row_blocks[static_cast<std::size_t>(j)] == table.block(j));
        }
        // The chunk's first query reads [first_read, first_position): this sequence's history.
        for (std::int32_t p = first_read(g, b.first_position); p < b.first_position; ++p) {
          RC_ASSERT(device_kv.at(static_cast<std::size_t>(table.slot(p))) == expected(p));
        }
        for (std::int32_t i = 0; i < b.num_tokens; ++i) {
          const std::int32_t p = b.first_position + i;
          const slot_id slot = plan.group_slots(g)[b.slot_offset + static_cast<std::size_t>(i)];
          RC_ASSERT(slot == table.slot(p));
          device_kv.at(static_cast<std::size_t>(slot)) = expected(p);
        }
      }
    }
    RC_ASSERT(tokens == plan.num_tokens);
    for (request_id id : scheduler.complete(plan, [&](const sampling_request& r) { return sample(r); })) {
      RC_ASSERT(finished.insert(id).second);
    }
    RC_ASSERT(scheduler.num_reserved_blocks() == scheduler.count_reserved_blocks());
    check_windows();
  }
};

/// What command generation knows: the requests submitted so far, the next id, and the pool's
/// shape (for drawing requests that mostly fit).
struct scheduler_command_state {
  std::vector<request_id> ids;
  request_id next_id = 1;
  std::int32_t block_size = 1;
  std::int32_t num_blocks = 1;  ///< admission's share: the device pool less the watermark
};

}  // namespace pagedkv::testing
