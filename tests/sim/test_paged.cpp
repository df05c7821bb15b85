// run_paged: the paged half of the simulator, which replays a trace through the real scheduler;
// run_hybrid: the interleaved sliding-window runs over the hybrid manager.
#include "sim/hybrid.hpp"
#include "sim/paged.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace pagedkv::sim {
namespace {

request make_request(std::uint64_t id, std::int32_t prompt_len, std::int32_t output_len, std::int64_t arrival = 0,
                     std::int32_t samples = 1) {
  request r;
  r.id = id;
  r.arrival_step = arrival;
  for (std::int32_t i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<token_id>(id * 1000 + i));
  r.output_len = output_len;
  r.max_output_len = output_len;
  r.num_samples = samples;
  return r;
}

/// A progress callback that ends a run gone on for far longer than any test trace needs (progress
/// is called every 1024 steps), so that a regression to the old endless loop fails, not hangs.
progress_fn step_limit(std::size_t max_calls = 100) {
  return [calls = std::size_t{0}, max_calls](std::size_t, std::size_t) mutable {
    if (++calls > max_calls) throw std::runtime_error("run_paged ran past 100k steps: it does not end");
  };
}

// One request, prompt 3, output 4, blocks of 4: the prefill step then three decodes. Each step's
// table holds the tokens scheduled so far: 3, 4, 5, 6 tokens in 1, 1, 2, 2 blocks.
TEST(Paged, SingleRequestByHand) {
  const trace requests{make_request(0, 3, 4)};
  const summary s = run_paged(requests, {.block_size = 4,
                                         .limits = {.capacity_slots = 16, .max_running_sequences = 4,
                                                    .max_tokens_per_step = 8}},
                              step_limit());
  EXPECT_EQ(s.finished_requests, 1);
  EXPECT_EQ(s.total_steps, 4);
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_EQ(s.peak_reserved_slots, 8);
  EXPECT_DOUBLE_EQ(s.all.kv_utilization, (3.0 + 4 + 5 + 6) / (4.0 + 4 + 8 + 8));
}

// Parallel samples share their prompt's blocks; without sharing each sample holds its own copy.
TEST(Paged, SamplesShareThePrompt) {
  const trace requests{make_request(0, 16, 4, 0, 4)};
  const paged_config shared{.block_size = 4,
                            .limits = {.capacity_slots = 256, .max_running_sequences = 8, .max_tokens_per_step = 64}};
  paged_config unshared = shared;
  unshared.sharing = false;
  const summary with = run_paged(requests, shared, step_limit());
  const summary without = run_paged(requests, unshared, step_limit());
  EXPECT_EQ(with.finished_requests, 1);
  EXPECT_EQ(without.finished_requests, 4);  // each sample its own request
  EXPECT_GT(with.sharing_saving, 0.0);
  EXPECT_LT(with.peak_reserved_slots, without.peak_reserved_slots);
}

// A generated trace larger than the pool: requests wait, are preempted and recomputed, and all
// finish.
TEST(Paged, ContendedTraceFinishes) {
  const trace requests = generate({.profile = alpaca_profile, .num_requests = 200, .seed = 3});
  const summary s = run_paged(requests, {.block_size = 16,
                                         .limits = {.capacity_slots = 2048, .max_running_sequences = 64,
                                                    .max_tokens_per_step = 512}},
                              step_limit());
  EXPECT_EQ(s.finished_requests, 200);
  EXPECT_GT(s.saturated.steps, 0);
  EXPECT_LE(s.peak_reserved_slots, 2048);
  EXPECT_GT(s.preemptions, 0);
}

/// Runs a trace with one request that can never fit: the run must end by naming it.
void expect_rejected(const trace& requests, std::uint64_t id) {
  const paged_config config{.block_size = 4,
                            .limits = {.capacity_slots = 16, .max_running_sequences = 4, .max_tokens_per_step = 8}};
  try {
    run_paged(requests, config, step_limit());
    FAIL() << "run_paged returned with a request that cannot fit";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
    const std::string named = "request " + std::to_string(id) + " was rejected";
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
}

// A request whose prompt alone needs more blocks than the pool holds is rejected by the scheduler;
// the run reports it instead of looping forever.
TEST(Paged, NeverFittingRequestEndsTheRun) {
  expect_rejected({make_request(0, 3, 2), make_request(1, 20, 2, 1), make_request(2, 3, 2, 2)}, 1);
}

// The same when the request fits at admission and only its output outgrows the pool: it is
// rejected once it runs alone and still cannot grow.
TEST(Paged, RequestOutgrowingThePoolEndsTheRun) { expect_rejected({make_request(0, 6, 40)}, 0); }

// A group of more samples than the sequence limit is never admitted: the run ends with an error.
TEST(Paged, GroupOverTheSequenceLimitEndsTheRun) {
  const trace requests{make_request(0, 3, 2, 0, 8)};
  const paged_config config{.block_size = 4,
                            .limits = {.capacity_slots = 256, .max_running_sequences = 4, .max_tokens_per_step = 8}};
  EXPECT_THROW(run_paged(requests, config, step_limit()), error);
}

// Blocks of 4, a window of 8, chunks of 8, one sequence at a time: a 32-token prompt and 4 output
// tokens hold 9 blocks a group without freeing. With it, the window group holds at most the window
// and a chunk: after computing 16 tokens it keeps blocks 2-3 (positions 9..15), then takes 4-5.
TEST(RunHybrid, WindowFreeingKeepsTheWindowAndAChunk) {
  const hybrid_workload w{.num_requests = 2, .min_prompt_tokens = 32, .max_prompt_tokens = 32, .output_tokens = 4};
  hybrid_config c{.block_size = 4, .window_tokens = 8, .capacity_slots = 256, .max_running_sequences = 1,
                  .max_tokens_per_step = 8, .free_outside_window = false};
  std::vector<hybrid_step> off_steps;
  const hybrid_summary off = run_hybrid(w, c, &off_steps);
  c.free_outside_window = true;
  const hybrid_summary on = run_hybrid(w, c);
  EXPECT_EQ(off.peak_full_blocks, 9);
  EXPECT_EQ(off.peak_window_blocks, 9);
  EXPECT_EQ(on.peak_full_blocks, 9);
  EXPECT_EQ(on.peak_window_blocks, 4);
  EXPECT_EQ(off.steps, 2 * 7);  // each request: 4 prefill chunks (the last yields a token), 3 decodes
  EXPECT_EQ(on.steps, off.steps);
  EXPECT_EQ(off.preemptions, 0);
  ASSERT_EQ(off_steps.size(), static_cast<std::size_t>(off.steps));
  EXPECT_EQ(off_steps[3].window_blocks, 8);  // the whole prompt, before its first output token
  EXPECT_EQ(on.misses.missed(miss_reason::never_stored) + on.misses.missed(miss_reason::partial_block),
            on.misses.num_prompt_tokens);  // distinct prompts: nothing to hit
}

// A pool of 28 blocks: without freeing one sequence fits at a time (the scheduler allocates its
// prompt's 16 blocks at admission, 18 by its last token); with freeing the scheduler allocates
// chunk by chunk and reserves 15 blocks (the prompt's 8 and the window and a chunk, 7), so two fit.
TEST(RunHybrid, WindowFreeingRunsMoreSequencesInOnePool) {
  const hybrid_workload w{.num_requests = 6, .min_prompt_tokens = 32, .max_prompt_tokens = 32, .output_tokens = 4};
  hybrid_config c{.block_size = 4, .window_tokens = 8, .capacity_slots = 28 * 4, .max_running_sequences = 4,
                  .max_tokens_per_step = 16, .free_outside_window = false};
  const hybrid_summary off = run_hybrid(w, c);
  c.free_outside_window = true;
  const hybrid_summary on = run_hybrid(w, c);
  EXPECT_LE(off.peak_used_blocks, 28);
  EXPECT_LE(on.peak_used_blocks, 28);
  EXPECT_GT(on.mean_running, off.mean_running);
  EXPECT_LT(on.steps, off.steps);
  c.capacity_slots = 8 * 4;
  c.free_outside_window = false;
  EXPECT_THROW(run_hybrid(w, c), error);  // 18 blocks: it alone does not fit
  c.capacity_slots = 30;
  EXPECT_THROW(run_hybrid(w, c), error);  // not a multiple of the block size
}

}  // namespace
}  // namespace pagedkv::sim
