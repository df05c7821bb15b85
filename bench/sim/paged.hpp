// The paged half of the simulator: replays a trace through pagedkv's scheduler and
// kv_cache_manager (or hybrid_kv_cache_manager, for a model of KV cache groups) with the null
// model (every scheduled sequence that reaches the end of its history yields one token), so the
// simulated numbers are the engine's numbers.
#pragma once

#include "sim/beam_model.hpp"   // beam_model, plan_beam_step
#include "sim/limits.hpp"
#include "sim/metrics.hpp"
#include "sim/workload.hpp"

#include <pagedkv/host_tier.hpp>
#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/kv_cache_spec.hpp>
#include <pagedkv/retention.hpp>
#include <pagedkv/scheduler.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace pagedkv::sim {

struct paged_config {
  std::int32_t block_size = 16;  ///< tokens per block; the sweep runs 1, 2, 4, ..., 256
  /// The same capacity (in token slots), sequence limit and token budget as the baselines. The pool
  /// has capacity_slots / block_size blocks (16384 divides by every swept block size).
  scheduler_limits limits;
  /// Fork sharing (samples, beams) and prefix caching on. With false every sequence owns its blocks,
  /// for the "same workload without sharing" reference run.
  bool sharing = true;
  /// A host tier of the prefix cache (host_prefix_tier, attached to the scheduler) of this many
  /// blocks of block_size; 0 for none.
  std::int32_t host_tier_blocks = 0;
  /// The TTL, in steps, of a ttl_eviction device cache and host tier (their clocks advance one a
  /// step); ignored by other policies.
  std::int64_t ttl_steps = 0;
  /// The host tier copies every block the device cache stores, not only those it evicts.
  bool write_through = false;
  /// Partial prefix hits (kv_cache_options::enable_partial_reuse): a cached block's first tokens
  /// copied when the prompt matches only them.
  bool partial_reuse = true;
  /// run_paged<hybrid_kv_cache_manager<...>>: the model's KV cache groups (one block of the pool is
  /// one group's KV for block_size tokens). Ignored by kv_cache_manager.
  std::vector<kv_cache_spec> groups{};
};

using progress_fn = std::function<void(std::size_t finished, std::size_t total)>;

/// A digest of 64-bit words in order, for summary::kv_event_digest: FNV-1a's step on whole words
/// with a fold of the high half (a byte loop cost 6% of a 10,000-request run).
struct event_digest {
  std::uint64_t value = 0xcbf29ce484222325ULL;
  void add(std::uint64_t word) {
    value = (value ^ word) * 0x100000001b3ULL;
    value ^= value >> 32;
  }
};

/// Replays `requests` through the paged scheduler (FCFS, recompute preemption, over a Manager:
/// kv_cache_manager<> unless a sweep picks other free-list or eviction policies) at the capacity,
/// sequence limit and token budget of `config`, and returns the metrics. Each step: hand the
/// arrived requests to the scheduler, plan, record one step_sample (after this step's tokens have
/// their slots, before finished sequences free their blocks), then complete the step with the null
/// model. Beam groups follow one beam_model per request, which picks each step's parents. A
/// session turn generates its request's output_tokens, and one with `after` is handed to the
/// scheduler at its arrival or the step after that turn finished, whichever is later.
/// With config.sharing false, each sample or beam is its own request and prefix caching is off:
/// the same token demand without any block sharing.
/// Errors: invalid_argument for limits or a block size that does not divide the capacity;
/// out_of_blocks, naming the request, when the scheduler rejects a request that cannot fit the
/// pool or admits none (as the contiguous baselines refuse a request that cannot fit empty
/// memory), so that a run always ends.
/// With config.host_tier_blocks > 0, a Tier (host_prefix_tier<Eviction>) of that many blocks is
/// attached: the device cache's evictions are offloaded to it and admissions load from it, as the
/// engine's plan.offload and plan.load (the null model runs no copies; it counts the tokens).
/// With a hybrid_kv_cache_manager there is no host tier (host_tier_blocks must be 0).
template <class Manager = kv_cache_manager<>, class Tier = host_prefix_tier<>>
summary run_paged(const trace& requests_in, const paged_config& config, const progress_fn& progress = {}) {
  constexpr bool grouped = pagedkv::detail::grouped_kv_manager<Manager>;
  check_limits(config.limits);
  const std::int32_t block_size = config.block_size;
  if (block_size < 1 || config.limits.capacity_slots % block_size != 0) {
    pagedkv::detail::fail(errc::invalid_argument, "run_paged: block size ", block_size,
                          " does not divide the capacity of ", config.limits.capacity_slots, " slots");
  }
  const trace requests = config.sharing ? requests_in : split_groups(requests_in);
  const auto num_blocks = static_cast<std::int32_t>(config.limits.capacity_slots / block_size);
  if (config.host_tier_blocks < 0 || config.ttl_steps < 0 || (grouped && config.host_tier_blocks > 0)) {
    pagedkv::detail::fail(errc::invalid_argument, "run_paged: host tier of ", config.host_tier_blocks,
                          " blocks, TTL of ", config.ttl_steps, " steps");
  }
  std::optional<Tier> tier;  // declared before the scheduler, which calls it
  if (config.host_tier_blocks > 0) {
    tier.emplace(host_tier_options{
        .num_blocks = config.host_tier_blocks, .block_size = block_size, .write_through = config.write_through});
  }
  const auto manager_options = [&] {
    if constexpr (grouped) {
      return hybrid_kv_cache_options{.block_size = block_size, .num_device_blocks = num_blocks, .groups = config.groups,
                                     .enable_prefix_caching = config.sharing, .enable_partial_reuse = config.partial_reuse};
    } else {
      return kv_cache_options{.block_size = block_size, .num_device_blocks = num_blocks,
                              .enable_prefix_caching = config.sharing, .enable_partial_reuse = config.partial_reuse};
    }
  }();
  scheduler<fcfs_admission, preempt_by_recompute, Manager> s({.max_tokens_per_step = config.limits.max_tokens_per_step,
                 .max_num_seqs = config.limits.max_running_sequences}, manager_options);
  if constexpr (!grouped) {
    if (tier) s.attach_prefix_tier(*tier);
  }
  // Every device cache event goes into the run's digest, then on to the tier (the scheduler's own
  // listener, replaced here and chained).
  event_digest digest;
  std::int64_t num_events = 0;
  s.kv().cache().set_event_callback([&](const cache_event& e) {
    ++num_events;
    digest.add(static_cast<std::uint64_t>(e.type));
    digest.add(static_cast<std::uint64_t>(e.block));
    digest.add(e.generation);
    digest.add(e.hash);
    digest.add(e.parent_hash.value_or(0));
    for (token_id t : e.tokens) digest.add(static_cast<std::uint64_t>(t));
    if (tier) tier->observe(e);
  });
  // A TTL counts steps: set it on every queue that has one, and advance their clocks each step.
  auto ttl_queues = [&](auto&& visit) {
    if constexpr (requires { s.kv().cache().eviction_queue().set_ttl(steps{}); }) visit(s.kv().cache().eviction_queue());
    if constexpr (requires { tier->eviction_queue().set_ttl(steps{}); }) {
      if (tier) visit(tier->eviction_queue());
    }
  };
  ttl_queues([&](auto& queue) { queue.set_ttl(steps{config.ttl_steps}); });
  metrics_accumulator metrics(config.limits.capacity_slots);
  std::unordered_map<request_id, beam_model> beams;
  std::size_t next_arrival = 0;
  std::size_t finished = 0;
  std::unordered_set<request_id> in_flight;  // handed to the scheduler, not finished
  std::uint64_t token_state = 0x243f6a8885a308d3ULL;
  auto next_token = [&] {  // the null model's tokens: distinct continuations never share blocks
    token_state = token_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<token_id>((token_state >> 33) % 32000);
  };
  // Session turns generate their trace's output tokens, which the next turn's prompt continues.
  std::unordered_map<request_id, std::pair<const request*, std::size_t>> scripted;  // request, tokens produced
  auto null_model = [&](const sampling_request& r) {
    std::vector<continuation> next;
    if (const auto it = scripted.find(r.request); it != scripted.end()) {
      auto& [req, produced] = it->second;
      next.push_back({r.seqs[0], req->output_tokens[std::min(produced++, req->output_tokens.size() - 1)]});
    } else if (r.params->beam_width > 0) {
      const auto it = beams.find(r.request);
      for (std::int32_t parent : it->second.step()) next.push_back({r.seqs[static_cast<std::size_t>(parent)], next_token()});
    } else if (r.first) {
      for (std::int32_t i = 0; i < r.params->num_samples; ++i) next.push_back({r.seqs[0], next_token()});
    } else {
      for (seq_id seq : r.seqs) next.push_back({seq, next_token()});
    }
    return next;
  };

  // A session turn that arrives before the turn it continues has finished waits here, by the id
  // of that turn; it is added when that turn finishes.
  std::unordered_set<request_id> done_ids;
  std::unordered_map<request_id, std::vector<const request*>> held;
  std::vector<const request*> ready;
  for (std::int64_t step = 0; finished < requests.size(); ++step) {
    for (; next_arrival < requests.size() && requests[next_arrival].arrival_step <= step; ++next_arrival) {
      const request& r = requests[next_arrival];
      if (r.after && !done_ids.contains(*r.after)) {
        held[*r.after].push_back(&r);
      } else {
        ready.push_back(&r);
      }
    }
    for (const request* ready_request : std::exchange(ready, {})) {
      const request& r = *ready_request;
      if (!r.output_tokens.empty()) scripted.emplace(r.id, std::pair{&r, std::size_t{0}});
      request_params params{.prompt = r.prompt, .max_new_tokens = r.output_len, .cache_priority = r.cache_priority};
      if (r.beam_width > 1) {
        params.beam_width = r.beam_width;
        beams.emplace(r.id, beam_model(r.beam_width, r.seed));
      } else {
        params.num_samples = r.num_samples;
      }
      s.add_request(r.id, std::move(params));
      in_flight.insert(r.id);
    }
    const step_plan plan = s.schedule();
    // A rejected request leaves the scheduler without finishing: the run would never end.
    if (s.num_waiting() + s.num_running() + s.num_swapped() < in_flight.size()) {
      for (request_id id : in_flight) {
        if (s.output(id).state == request_state::rejected) {
          pagedkv::detail::fail(errc::out_of_blocks, "run_paged: request ", id,
                                " was rejected: it cannot fit in ", num_blocks, " blocks of ", block_size);
        }
      }
    }
    if (plan.empty() && s.num_running() == 0 && next_arrival == requests.size() && s.has_unfinished() &&
        !s.waiting_for_retention()) {
      pagedkv::detail::fail(errc::out_of_blocks, "run_paged: no request fits in ", num_blocks, " blocks of ", block_size);
    }

    const kv_cache_usage usage = s.kv().usage();
    step_sample sample;
    sample.live_slots = usage.num_live_tokens;
    sample.reserved_slots = std::int64_t{usage.num_used_blocks} * block_size;
    sample.free_slots = config.limits.capacity_slots - sample.reserved_slots;
    sample.running_sequences = s.num_running_seqs();
    sample.waiting_requests = static_cast<std::int64_t>(s.num_waiting() + s.num_swapped());
    sample.preemptions = static_cast<std::int64_t>(plan.preempted.size());
    s.kv().for_each_sequence([&](seq_id, const auto& tables, location where) {
      if (where != location::device) return;
      if constexpr (grouped) {
        for (const block_table& table : tables) sample.unshared_reserved_slots += table.capacity_tokens();
      } else {
        sample.unshared_reserved_slots += tables.capacity_tokens();
      }
    });

    const std::vector<request_id> done = s.complete(plan, null_model);
    for (request_id id : done) {
      in_flight.erase(id);
      beams.erase(id);
      scripted.erase(id);
      s.forget(id);
      done_ids.insert(id);
      if (const auto it = held.find(id); it != held.end()) {
        ready.insert(ready.end(), it->second.begin(), it->second.end());
        held.erase(it);
      }
    }
    finished += done.size();
    sample.finished_requests = static_cast<std::int64_t>(done.size());
    metrics.record(sample);
    ttl_queues([](auto& queue) { queue.clock().advance(); });
    if (progress && step % 1024 == 0) progress(finished, requests.size());
  }
  if (progress) progress(finished, requests.size());
  summary result = metrics.result();
  const kv_cache_usage final_usage = s.kv().usage();
  result.prefix_hit_rate = final_usage.prefix_hit_rate + final_usage.partial_hit_rate + final_usage.shared_hit_rate;
  result.partial_hit_rate = final_usage.partial_hit_rate;
  result.shared_hit_rate = final_usage.shared_hit_rate;
  result.prompt_tokens = s.kv().cache().queried_tokens();
  result.cached_prompt_tokens =
      s.kv().cache().hit_tokens() + s.kv().cache().partial_hit_tokens() + s.kv().cache().shared_hit_tokens();
  result.loaded_prompt_tokens = s.stats().loaded_tokens;
  result.kv_events = num_events;
  result.kv_event_digest = digest.value;
  if constexpr (!grouped) {
    if (tier) s.detach_prefix_tier();
  }
  result.prefix_misses = s.miss_totals();
  return result;
}

}  // namespace pagedkv::sim
