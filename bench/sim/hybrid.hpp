// The interleaved sliding-window half of the simulator (issue 22, "Measure" 1): replays long-context
// requests through pagedkv's hybrid_kv_cache_manager for a Gemma-2-like model (half the layers
// full attention, half a sliding window) with window freeing on or off, and measures the KV blocks
// each group holds and the sequences the pool runs at once.
//
// The driver is a small FCFS loop with chunked prefill, as an engine runs the manager (the library's
// scheduler does not drive the hybrid manager yet, docs/design.md): a request is admitted when its
// first chunk fits; each step every running request prefills its next chunk (within the token
// budget) or decodes one token, allocating per chunk with append(), and mark_computed() after the
// step releases what fell out of the window. When an append does not fit, the newest running
// request is preempted by recompute (freed, back to the head of the queue). Null model: one token
// per decoding request per step; prompts of distinct random tokens, so no prefix is shared.
//
// One block of the pool is one group's KV for block_size tokens: the two groups have as many
// layers each, so their blocks are the same size and one pool serves both.
#pragma once

#include "sim/random.hpp"

#include <pagedkv/hybrid_kv_cache_manager.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <span>
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

/// Replays `workload` (every request arriving at step 0) through a hybrid_kv_cache_manager of two
/// groups, full attention (0) and sliding_window(window_tokens) (1). Appends each step's counts to
/// `timeline` if given. Errors: invalid_argument for a capacity that is not a positive multiple of
/// the block size; out_of_blocks when one request alone cannot fit the pool.
inline hybrid_summary run_hybrid(const hybrid_workload& workload, const hybrid_config& config,
                                 std::vector<hybrid_step>* timeline = nullptr) {
  if (config.capacity_slots < config.block_size || config.capacity_slots % config.block_size != 0) {
    pagedkv::detail::fail(errc::invalid_argument, "run_hybrid: capacity ", config.capacity_slots,
                          " slots is not a positive multiple of the block size ", config.block_size);
  }
  constexpr std::int32_t full = 0, window = 1;
  hybrid_kv_cache_manager<> kv({.block_size = config.block_size,
                                .num_device_blocks = static_cast<std::int32_t>(config.capacity_slots / config.block_size),
                                .groups = {kv_cache_spec::full_attention(), kv_cache_spec::sliding_window(config.window_tokens)},
                                .free_outside_window = config.free_outside_window});
  std::mt19937_64 rng(workload.seed);
  struct request {
    std::vector<token_id> prompt;
    std::int32_t generated = 0;
  };
  std::vector<request> requests(static_cast<std::size_t>(workload.num_requests));
  for (request& r : requests) {
    const auto span = static_cast<std::uint64_t>(workload.max_prompt_tokens - workload.min_prompt_tokens + 1);
    r.prompt.resize(static_cast<std::size_t>(workload.min_prompt_tokens + static_cast<std::int32_t>(uniform_below(rng, span))));
    for (token_id& t : r.prompt) t = static_cast<token_id>(uniform_below(rng, 1u << 30));
  }
  std::deque<seq_id> waiting;
  for (seq_id i = 0; i < requests.size(); ++i) waiting.push_back(i);
  std::vector<seq_id> running;  // in admission order: the last is preempted first
  std::vector<slot_id> slots;
  std::uint64_t token_state = 0x243f6a8885a308d3ULL;
  const auto preempt = [&] {
    const seq_id victim = running.back();
    running.pop_back();
    kv.free(victim);
    requests[victim].generated = 0;
    waiting.push_front(victim);
  };
  hybrid_summary out;
  std::size_t finished = 0;
  while (finished < requests.size()) {
    std::int32_t budget = config.max_tokens_per_step;
    for (std::size_t i = 0; i < running.size() && budget > 0;) {
      const seq_id seq = running[i];
      request& r = requests[seq];
      const std::int32_t held = kv.num_tokens(seq);
      const auto prompt_len = static_cast<std::int32_t>(r.prompt.size());
      const std::int32_t count = held < prompt_len ? std::min(prompt_len - held, budget) : 1;
      std::vector<token_id> tokens;
      if (held < prompt_len) {
        tokens.assign(r.prompt.begin() + held, r.prompt.begin() + held + count);
      } else {
        token_state = token_state * 6364136223846793005ULL + 1442695040888963407ULL;
        tokens.push_back(static_cast<token_id>(token_state >> 34));
      }
      while (!kv.can_append(seq, count) && running.back() != seq) {
        preempt();
        ++out.preemptions;
      }
      if (!kv.can_append(seq, count)) {
        if (running.size() == 1) pagedkv::detail::fail(errc::out_of_blocks, "run_hybrid: request ", seq, " alone does not fit");
        preempt();
        ++out.preemptions;
        break;
      }
      slots.resize(tokens.size() * 2);
      kv.append(seq, tokens, slots);
      budget -= count;
      ++i;
    }
    while (!waiting.empty() && budget > 0 && static_cast<std::int32_t>(running.size()) < config.max_running_sequences) {
      const seq_id seq = waiting.front();
      const std::span<const token_id> prompt = requests[seq].prompt;
      const std::span<const token_id> chunk = prompt.first(std::min(prompt.size(), static_cast<std::size_t>(budget)));
      if (!kv.can_allocate(chunk)) {
        if (running.empty()) pagedkv::detail::fail(errc::out_of_blocks, "run_hybrid: request ", seq, " alone does not fit");
        break;
      }
      kv.allocate(seq, chunk);
      waiting.pop_front();
      running.push_back(seq);
      budget -= static_cast<std::int32_t>(chunk.size());
    }
    hybrid_step sample{kv.num_held_blocks(window), kv.num_held_blocks(full), static_cast<std::int32_t>(running.size())};
    const std::int32_t used = kv.usage().num_used_blocks;
    if (timeline) timeline->push_back(sample);
    out.peak_window_blocks = std::max(out.peak_window_blocks, sample.window_blocks);
    out.peak_full_blocks = std::max(out.peak_full_blocks, sample.full_blocks);
    out.peak_used_blocks = std::max(out.peak_used_blocks, used);
    out.peak_running = std::max(out.peak_running, sample.running);
    out.mean_window_blocks += sample.window_blocks;
    out.mean_full_blocks += sample.full_blocks;
    out.mean_used_blocks += used;
    out.mean_running += sample.running;
    ++out.steps;
    // The step ran: every token is computed, windows release, finished requests leave.
    for (std::size_t i = 0; i < running.size();) {
      const seq_id seq = running[i];
      request& r = requests[seq];
      kv.mark_computed(seq, kv.num_tokens(seq));
      if (kv.num_tokens(seq) >= static_cast<std::int32_t>(r.prompt.size())) {
        // The prompt's last token, or a decoded one, yields the next token.
        if (++r.generated >= workload.output_tokens) {
          kv.free(seq);
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
          ++finished;
          continue;
        }
      }
      ++i;
    }
  }
  const auto steps = static_cast<double>(out.steps);
  out.mean_window_blocks /= steps;
  out.mean_full_blocks /= steps;
  out.mean_used_blocks /= steps;
  out.mean_running /= steps;
  out.misses = kv.miss_totals();
  return out;
}

}  // namespace pagedkv::sim
