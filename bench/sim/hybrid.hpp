// The interleaved sliding-window half of the simulator (issue 22, "Measure" 1): replays long-context
// requests through pagedkv's scheduler over a hybrid_kv_cache_manager for a Gemma-2-like model
// (half the layers full attention, half a sliding window) with window freeing on or off, and
// measures the KV blocks each group holds and the sequences the pool runs at once.
//
// The driver is the library's scheduler (FCFS, recompute preemption, chunked prefill within the
// token budget): with window freeing on it allocates a prompt chunk by chunk and reserves what the
// rest of each prefill takes, so a window group holds at most its window and a chunk; with it off
// a prompt's blocks are all allocated at admission. Null model: each decode yields one token;
// prompts of distinct random tokens, so no prefix is shared.
//
// One block of the pool is one group's KV for block_size tokens: the two groups have as many
// layers each, so their blocks are the same size and one pool serves both.
#pragma once

#include "sim/random.hpp"

#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/scheduler.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace pagedkv::sim {

struct hybrid_config {
  std::int32_t block_size = 16;
  std::int32_t window_tokens = 4096;  ///< the window of the sliding-window group (Gemma 2: 4096)
  std::int64_t capacity_slots = 0;    ///< pool capacity in token slots, a multiple of block_size
  std::int32_t max_running_sequences = 256;
  std::int32_t max_tokens_per_step = 2048;  ///< also the prefill chunk
  bool free_outside_window = true;
};

struct hybrid_workload {
  std::int32_t num_requests = 64;
  std::int32_t min_prompt_tokens = 8192;
  std::int32_t max_prompt_tokens = 32768;  ///< prompts uniform in [min, max]
  std::int32_t output_tokens = 256;
  std::uint64_t seed = 1;
};

struct hybrid_summary {
  std::int64_t steps = 0;
  std::int64_t preemptions = 0;
  std::int32_t peak_window_blocks = 0;  ///< the window group's blocks, most at once
  std::int32_t peak_full_blocks = 0;    ///< the full-attention group's
  std::int32_t peak_used_blocks = 0;    ///< both groups (kv_cache_usage::num_used_blocks)
  double mean_window_blocks = 0.0;      ///< means over steps
  double mean_full_blocks = 0.0;
  double mean_used_blocks = 0.0;
  std::int32_t peak_running = 0;        ///< sequences running at once
  double mean_running = 0.0;
  prefix_lookup misses{};               ///< the manager's miss totals (every allocation)
};

/// Per step: the window group's and the full group's blocks and the running sequences.
struct hybrid_step {
  std::int32_t window_blocks = 0;
  std::int32_t full_blocks = 0;
  std::int32_t running = 0;
};

/// Replays `workload` (every request arriving at step 0) through a scheduler over a
/// hybrid_kv_cache_manager of two groups, full attention (0) and sliding_window(window_tokens)
/// (1). Appends each step's counts (after schedule(), when the step's blocks are all held) to
/// `timeline` if given. Errors: invalid_argument for a capacity that is not a positive multiple
/// of the block size; out_of_blocks when one request alone cannot fit the pool.
inline hybrid_summary run_hybrid(const hybrid_workload& workload, const hybrid_config& config,
                                 std::vector<hybrid_step>* timeline = nullptr) {
  if (config.capacity_slots < config.block_size || config.capacity_slots % config.block_size != 0) {
    pagedkv::detail::fail(errc::invalid_argument, "run_hybrid: capacity ", config.capacity_slots,
                          " slots is not a positive multiple of the block size ", config.block_size);
  }
  constexpr std::int32_t full = 0, window = 1;
  scheduler<fcfs_admission, preempt_by_recompute, hybrid_kv_cache_manager<>> s(
      {.max_tokens_per_step = config.max_tokens_per_step, .max_num_seqs = config.max_running_sequences},
      {.block_size = config.block_size,
       .num_device_blocks = static_cast<std::int32_t>(config.capacity_slots / config.block_size),
       .groups = {kv_cache_spec::full_attention(), kv_cache_spec::sliding_window(config.window_tokens)},
       .free_outside_window = config.free_outside_window});
  std::mt19937_64 rng(workload.seed);
  for (std::int32_t i = 0; i < workload.num_requests; ++i) {
    request_params p{.max_new_tokens = workload.output_tokens};
    const auto span = static_cast<std::uint64_t>(workload.max_prompt_tokens - workload.min_prompt_tokens + 1);
    p.prompt.resize(static_cast<std::size_t>(workload.min_prompt_tokens + static_cast<std::int32_t>(uniform_below(rng, span))));
    for (token_id& t : p.prompt) t = static_cast<token_id>(uniform_below(rng, 1u << 30));
    s.add_request(static_cast<request_id>(i), std::move(p));
  }
  std::uint64_t token_state = 0x243f6a8885a308d3ULL;
  const auto sample = [&](const sampling_request& r) {
    std::vector<continuation> next;
    for (seq_id seq : r.seqs) {
      token_state = token_state * 6364136223846793005ULL + 1442695040888963407ULL;
      next.push_back({seq, static_cast<token_id>(token_state >> 34), false});
    }
    return next;
  };
  hybrid_summary out;
  while (s.has_unfinished()) {
    const step_plan plan = s.schedule();
    if (!plan.rejected.empty()) {
      pagedkv::detail::fail(errc::out_of_blocks, "run_hybrid: request ", plan.rejected.front(), " alone does not fit");
    }
    const auto& kv = s.kv();
    hybrid_step sample_now{kv.num_held_blocks(window), kv.num_held_blocks(full), s.num_running_seqs()};
    const std::int32_t used = kv.usage().num_used_blocks;
    if (timeline) timeline->push_back(sample_now);
    out.peak_window_blocks = std::max(out.peak_window_blocks, sample_now.window_blocks);
    out.peak_full_blocks = std::max(out.peak_full_blocks, sample_now.full_blocks);
    out.peak_used_blocks = std::max(out.peak_used_blocks, used);
    out.peak_running = std::max(out.peak_running, sample_now.running);
    out.mean_window_blocks += sample_now.window_blocks;
    out.mean_full_blocks += sample_now.full_blocks;
    out.mean_used_blocks += used;
    out.mean_running += sample_now.running;
    ++out.steps;
    s.complete(plan, sample);  // the step ran: windows release, finished requests leave
  }
  const auto steps = static_cast<double>(out.steps);
  out.mean_window_blocks /= steps;
  out.mean_full_blocks /= steps;
  out.mean_used_blocks /= steps;
  out.mean_running /= steps;
  out.preemptions = s.num_preemptions();
  out.misses = s.miss_totals();
  return out;
}

}  // namespace pagedkv::sim
