// The paged half of the simulator: replays a trace through pagedkv's scheduler and
// kv_cache_manager with the null model. NOT YET IMPLEMENTED: run_paged() is the hook the lead fills
// once include/pagedkv/ has the scheduler; until then it returns nothing and the driver writes no
// paged rows (no placeholder numbers).
#pragma once

#include "sim/beam_model.hpp"   // beam_model, plan_beam_step
#include "sim/limits.hpp"
#include "sim/metrics.hpp"
#include "sim/workload.hpp"

#include <cstdint>
#include <functional>
#include <optional>

namespace pagedkv::sim {

struct paged_config {
  std::int32_t block_size = 16;  ///< tokens per block; the sweep runs 1, 2, 4, ..., 256
  /// The same capacity (in token slots), sequence limit and token budget as the baselines. The pool
  /// has capacity_slots / block_size blocks (16384 divides by every swept block size).
  scheduler_limits limits;
  /// Fork sharing (samples, beams) and prefix caching on. With false every sequence owns its blocks,
  /// for the "same workload without sharing" reference run.
  bool sharing = true;
};

using progress_fn = std::function<void(std::size_t finished, std::size_t total)>;

/// HOOK FOR THE LEAD: replay `requests` through the paged scheduler and return the metrics, or
/// nothing while the paged side does not exist. What it must do, step by step (as
/// contiguous_simulator::step() does for the baselines, so that the numbers compare):
///   - hand requests with arrival_step <= step to the scheduler (a group of
///     request::num_sequences() sequences; split_groups() gives the no-sharing trace);
///   - run one scheduler step with limits.max_running_sequences and limits.max_tokens_per_step;
///     every scheduled sequence produces one token (the null model: a prefill produces the first
///     output token; a request is done after output_len tokens on every sequence);
///   - beam groups: one beam_model(request.beam_width, request.seed) per group; call step() once
///     per step of the group (the prefill step included: it forks the prompt into k beams) and
///     apply plan_beam_step(parents, beams before the step): free, then fork, then append;
///   - after the step's tokens and before finished sequences free their blocks, record one
///     step_sample into a metrics_accumulator(num_blocks * block_size):
///       live_slots         physical slots holding tokens (a shared block's tokens count once)
///       reserved_slots     allocated blocks * block_size
///       future_slots       0 (blocks are taken on demand; a last block's empty slots count as
///                          internal fragmentation)
///       free_slots         free blocks * block_size (reserved + free = capacity)
///       unusable_free_slots 0 (any free block serves)
///       running_sequences, finished_requests (this step), waiting_requests (incl. preempted
///       groups waiting to come back), preemptions (groups preempted this step)
///       unshared_reserved_slots  sum over running sequences of ceil(len / block_size) *
///                          block_size, len = prompt + tokens generated: what they would hold
///                          without sharing
///   - call progress(finished, requests.size()) now and then; return accumulator.result().
inline std::optional<summary> run_paged(const trace& requests, const paged_config& config,
                                        const progress_fn& progress = {}) {
  (void)requests;
  (void)config;
  (void)progress;
  return std::nullopt;
}

}  // namespace pagedkv::sim
