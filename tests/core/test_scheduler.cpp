#include <pagedkv/retention.hpp>
#include <pagedkv/scheduler.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

namespace pagedkv {
namespace {

using test::iota_tokens;

/// The null model's sampler: every sequence continues with token 1; a first sampling forks n ways.
std::vector<continuation> null_sample(const sampling_request& r) {
  std::vector<continuation> next;
  const std::int32_t ways = r.first ? std::max(r.params->num_samples, r.params->beam_width) : 1;
  for (seq_id seq : r.seqs) {
    for (std::int32_t i = 0; i < (r.first ? ways : 1); ++i) next.push_back({seq, 1, false});
  }
  return next;
}

template <class Scheduler>
std::int32_t run_to_completion(Scheduler& s, std::int32_t max_steps = 10000) {
  std::int32_t steps = 0;
  while (s.has_unfinished() && steps < max_steps) {
    const step_plan plan = s.schedule();
    s.complete(plan, null_sample);
    ++steps;
  }
  return steps;
}

TEST(Scheduler, ChunkedPrefillLeavesRoomForDecodes) {
  scheduler<> s({.max_tokens_per_step = 8, .max_num_seqs = 8}, {.block_size = 4, .num_device_blocks = 64});
  s.add_request(1, {.prompt = iota_tokens(3), .max_new_tokens = 5});
  step_plan p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u);
  EXPECT_EQ(p.num_tokens, 3);
  EXPECT_TRUE(p.batch[0].produces_logits);
  s.complete(p, null_sample);
  s.add_request(2, {.prompt = iota_tokens(20, 100), .max_new_tokens = 1});
  p = s.schedule();
  ASSERT_EQ(p.batch.size(), 2u);
  EXPECT_EQ(p.batch[0].num_tokens, 1) << "request 1 decodes first";
  EXPECT_EQ(p.batch[1].num_tokens, 7) << "request 2's prefill takes what the budget leaves";
  EXPECT_FALSE(p.batch[1].produces_logits);
  EXPECT_EQ(p.num_tokens, 8);
  EXPECT_EQ(p.slot_mapping.size(), 8u);
  s.complete(p, null_sample);
  p = s.schedule();
  EXPECT_EQ(p.batch[1].first_position, 7);
  run_to_completion(s);
  EXPECT_EQ(s.output(1).sequences, (std::vector<std::vector<token_id>>{std::vector<token_id>(5, 1)}));
  EXPECT_EQ(s.output(2).state, request_state::finished);
}

TEST(Scheduler, DecodesGoBeforeTheLongPrefillOfAnEarlierOrderedRequest) {
  // Request 2 outranks request 1, so it comes first in running order; its 40-token prompt must
  // still leave request 1 its decode token every step.
  scheduler<priority_admission> s({.max_tokens_per_step = 8}, {.block_size = 4, .num_device_blocks = 64});
  s.add_request(1, {.prompt = iota_tokens(2), .max_new_tokens = 20, .priority = 0});
  s.complete(s.schedule(), null_sample);
  s.add_request(2, {.prompt = iota_tokens(40, 100), .max_new_tokens = 1, .priority = 5});
  for (int step = 0; step < 5; ++step) {
    const step_plan p = s.schedule();
    ASSERT_FALSE(p.batch.empty());
    EXPECT_EQ(p.batch.front().request, 1u) << "step " << step << ": the decode comes first";
    EXPECT_EQ(p.batch.front().num_tokens, 1);
    EXPECT_EQ(p.num_tokens, 8) << "the prefill takes the rest of the budget";
    s.complete(p, null_sample);
  }
}

TEST(Scheduler, PrefixHitsShortenThePrefill) {
  scheduler<> s({.max_tokens_per_step = 64}, {.block_size = 4, .num_device_blocks = 64});
  s.add_request(1, {.prompt = iota_tokens(13), .max_new_tokens = 1});
  run_to_completion(s);
  s.add_request(2, {.prompt = iota_tokens(13), .max_new_tokens = 1});
  const step_plan p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u);
  EXPECT_EQ(p.batch[0].first_position, 12);
  EXPECT_EQ(p.num_tokens, 1);
  EXPECT_EQ(s.output(2).num_cached_prompt_tokens, 12);
}

TEST(Scheduler, ParallelSamplesShareThePromptThroughFork) {
  scheduler<> s({}, {.block_size = 4, .num_device_blocks = 64, .enable_prefix_caching = false});
  s.add_request(1, {.prompt = iota_tokens(8), .max_new_tokens = 3, .num_samples = 4});
  s.complete(s.schedule(), null_sample);
  EXPECT_EQ(s.num_running_seqs(), 4);
  EXPECT_EQ(s.kv().usage().num_used_blocks, 2) << "the prompt's two full blocks are shared, nothing else yet";
  run_to_completion(s);
  EXPECT_EQ(s.output(1).sequences.size(), 4u);
  EXPECT_EQ(s.kv().num_free_blocks(), 64);
}

TEST(Scheduler, SequencesAreListedInContinuationOrder) {
  scheduler<> s({}, {.block_size = 4, .num_device_blocks = 64});
  s.add_request(1, {.prompt = iota_tokens(5), .max_new_tokens = 4, .num_samples = 3});
  const std::vector<seq_id> prompt = s.sequences(1);
  ASSERT_EQ(prompt.size(), 1u) << "the prompt's one sequence before the first sampling";
  std::vector<seq_id> order;
  s.complete(s.schedule(), [&](const sampling_request& r) {  // three samples; the second stops at once
    return std::vector<continuation>{{r.seqs[0], 7, false}, {r.seqs[0], 8, true}, {r.seqs[0], 9, false}};
  });
  const std::vector<seq_id> live = s.sequences(1);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0], prompt[0]) << "the first continuation keeps its parent";
  s.complete(s.schedule(), [&](const sampling_request& r) {
    order.assign(r.seqs.begin(), r.seqs.end());
    // the last-listed sample continues first: the order follows the continuations
    return std::vector<continuation>{{r.seqs[1], 1, false}, {r.seqs[0], 1, false}};
  });
  EXPECT_EQ(order, live) << "sampling_request lists what sequences() listed";
  EXPECT_EQ(s.sequences(1), (std::vector<seq_id>{live[1], live[0]}));
  run_to_completion(s);
  EXPECT_THROW((void)s.sequences(1), error) << "finished";
  EXPECT_THROW((void)s.sequences(99), error) << "never added";
}

TEST(Scheduler, PreemptsTheNewestGroupAndStillFinishesEverything) {
  // 6 blocks of 2 tokens: three requests that grow to 8 tokens each cannot all stay resident.
  scheduler<> s({.max_tokens_per_step = 64}, {.block_size = 2, .num_device_blocks = 6, .enable_prefix_caching = false});
  for (request_id id : {1, 2, 3}) s.add_request(id, {.prompt = iota_tokens(2, static_cast<token_id>(10 * id)), .max_new_tokens = 6});
  bool saw_newest_preempted = false;
  while (s.has_unfinished()) {
    const step_plan p = s.schedule();
    if (!p.preempted.empty() && p.preempted.front() == 3) saw_newest_preempted = true;
    if (!p.preempted.empty()) {
      EXPECT_NE(p.preempted.front(), 1u) << "the oldest request is preempted last";
    }
    s.complete(p, null_sample);
  }
  EXPECT_TRUE(saw_newest_preempted);
  EXPECT_GT(s.num_preemptions(), 0);
  for (request_id id : {1, 2, 3}) {
    EXPECT_EQ(s.output(id).state, request_state::finished);
    EXPECT_EQ(s.output(id).sequences.at(0).size(), 6u);
  }
}

TEST(Scheduler, SwapModeMovesBlocksToTheHostAndBack) {
  scheduler<fcfs_admission, preempt_by_swap> s(
      {.max_tokens_per_step = 64},
      {.block_size = 2, .num_device_blocks = 6, .num_host_blocks = 16, .enable_prefix_caching = false});
  for (request_id id : {1, 2, 3}) s.add_request(id, {.prompt = iota_tokens(2), .max_new_tokens = 6});
  std::size_t swapped_out = 0, swapped_in = 0;
  while (s.has_unfinished()) {
    const step_plan p = s.schedule();
    swapped_out += p.swap_out.size();
    swapped_in += p.swap_in.size();
    s.complete(p, null_sample);
  }
  EXPECT_GT(swapped_out, 0u);
  EXPECT_EQ(swapped_out, swapped_in);
  EXPECT_EQ(s.kv().num_free_host_blocks(), 16);
}

TEST(Scheduler, AbortFreesBlocksAtOnce) {
  scheduler<> s({}, {.block_size = 4, .num_device_blocks = 16, .enable_prefix_caching = false});
  s.add_request(1, {.prompt = iota_tokens(30), .max_new_tokens = 100});
  s.complete(s.schedule(), null_sample);
  EXPECT_LT(s.kv().num_free_blocks(), 16);
  EXPECT_TRUE(s.abort(1));
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
  EXPECT_EQ(s.output(1).state, request_state::aborted);
  EXPECT_FALSE(s.abort(1));
  EXPECT_FALSE(s.has_unfinished());
}

TEST(Scheduler, ABurstComputesASharedPrefixOnceAndAnAbortedSourceHandsItOver) {
  scheduler<> s({.max_tokens_per_step = 64, .max_num_seqs = 8}, {.block_size = 4, .num_device_blocks = 64});
  const auto prompt = [](token_id first, token_id own) {
    std::vector<token_id> p = iota_tokens(16, first);
    p.insert(p.end(), {own, own});
    return p;
  };
  for (const request_id id : {1, 2, 3}) s.add_request(id, {.prompt = prompt(0, 100 + id), .max_new_tokens = 1});
  step_plan p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u) << "the others wait for the first to compute the shared prefix";
  EXPECT_EQ(p.num_tokens, 18);
  EXPECT_EQ(s.stats().shared_tokens, 32);
  EXPECT_EQ(s.output(2).num_cached_prompt_tokens, 16);
  EXPECT_EQ(s.output(3).cache_lookup.num_shared_tokens, 16);
  s.complete(p, null_sample);
  p = s.schedule();
  ASSERT_EQ(p.batch.size(), 2u);
  for (const auto& chunk : p.batch) {
    EXPECT_EQ(chunk.first_position, 16) << "request " << chunk.request;
    EXPECT_EQ(chunk.num_tokens, 2);
  }
  run_to_completion(s);
  EXPECT_EQ(s.stats().waiters_released, 0);

  // The source is aborted before its step completes: its waiter computes the prefix itself.
  s.add_request(4, {.prompt = prompt(500, 1), .max_new_tokens = 1});
  s.add_request(5, {.prompt = prompt(500, 2), .max_new_tokens = 1});
  p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u);
  EXPECT_TRUE(s.abort(4));
  EXPECT_EQ(s.stats().waiters_released, 1);
  s.complete(p, null_sample);
  p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u);
  EXPECT_EQ(p.batch[0].request, 5u);
  EXPECT_EQ(p.batch[0].first_position, 0);
  EXPECT_EQ(p.batch[0].num_tokens, 18);
  run_to_completion(s);
  EXPECT_EQ(s.output(5).state, request_state::finished);
}

// Each request of a burst shares the longest prefix a running request holds past what it has
// computed: request 3 shares 32 tokens with request 1 (request 2, compared second, holds only 16 of
// them); request 4, after request 1 has computed its prompt, shares nothing in flight and hits
// the cache instead.
TEST(Scheduler, ABurstSharesTheLongestPrefixInFlight) {
  scheduler<> s({.max_tokens_per_step = 256, .max_num_seqs = 8}, {.block_size = 4, .num_device_blocks = 64});
  const auto prompt = [](std::int32_t shared, token_id own) {
    std::vector<token_id> p = iota_tokens(shared);
    p.push_back(own);
    return p;
  };
  s.add_request(1, {.prompt = prompt(32, 1001), .max_new_tokens = 2});
  s.add_request(2, {.prompt = prompt(16, 1002), .max_new_tokens = 2});
  s.add_request(3, {.prompt = prompt(32, 1003), .max_new_tokens = 2});
  step_plan p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u) << "requests 2 and 3 wait for request 1's prefix";
  EXPECT_EQ(s.output(2).cache_lookup.num_shared_tokens, 16);
  EXPECT_EQ(s.output(3).cache_lookup.num_shared_tokens, 32);
  EXPECT_EQ(s.stats().shared_tokens, 48);
  const std::vector<seq_id> first = s.sequences(1), third = s.sequences(3);
  for (std::int32_t j = 0; j < 8; ++j) EXPECT_EQ(s.table(third[0]).block(j), s.table(first[0]).block(j)) << "block " << j;
  s.complete(p, null_sample);
  s.add_request(4, {.prompt = prompt(32, 1004), .max_new_tokens = 2});
  p = s.schedule();
  EXPECT_EQ(s.stats().shared_tokens, 48);
  EXPECT_EQ(s.output(4).num_cached_prompt_tokens, 32);
  EXPECT_EQ(s.output(4).cache_lookup.num_shared_tokens, 0);
  s.complete(p, null_sample);
  run_to_completion(s);
  for (const request_id id : {1, 2, 3, 4}) EXPECT_EQ(s.output(id).state, request_state::finished) << "request " << id;
}

TEST(Scheduler, PriorityAdmissionRunsUrgentRequestsFirst) {
  scheduler<priority_admission> s({.max_tokens_per_step = 4}, {.block_size = 4, .num_device_blocks = 16});
  s.add_request(1, {.prompt = iota_tokens(4), .max_new_tokens = 1, .priority = 0});
  s.add_request(2, {.prompt = iota_tokens(4, 50), .max_new_tokens = 1, .priority = 5});
  const step_plan p = s.schedule();
  ASSERT_EQ(p.batch.size(), 1u);
  EXPECT_EQ(p.batch[0].request, 2u);
}

TEST(Scheduler, RejectsARequestThatCanNeverFit) {
  scheduler<> s({}, {.block_size = 4, .num_device_blocks = 2});
  s.add_request(1, {.prompt = iota_tokens(9), .max_new_tokens = 1});
  s.add_request(2, {.prompt = iota_tokens(3), .max_new_tokens = 2});
  run_to_completion(s);
  EXPECT_EQ(s.output(1).state, request_state::rejected);
  EXPECT_EQ(s.output(2).state, request_state::finished);
  s.add_request(3, {.prompt = iota_tokens(4), .max_new_tokens = 20});  // fits at first, then outgrows the pool
  run_to_completion(s);
  EXPECT_EQ(s.output(3).state, request_state::rejected);
  EXPECT_EQ(s.kv().num_free_blocks(), 2);
}

/// Samples of one request continue with different tokens: sample i of a first sampling takes
/// token 10 + i, later steps append 1, so the samples share their prompt and nothing after it.
std::vector<continuation> distinct_sample(const sampling_request& r) {
  std::vector<continuation> next;
  if (r.first) {
    const std::int32_t ways = std::max(r.params->num_samples, r.params->beam_width);
    for (std::int32_t i = 0; i < ways; ++i) next.push_back({r.seqs[0], 10 + i, false});
  } else {
    for (seq_id seq : r.seqs) next.push_back({seq, 1, false});
  }
  return next;
}

TEST(Scheduler, RecomputedSamplesShareTheirPromptAgain) {
  // Issue 27's repro: the 30-token request with n = 2 needs 8 + 2 x 4 blocks sharing its prompt,
  // 2 x 11 without. It finishes alone; beside three others it is preempted by recompute, and was
  // rejected once re-admitted without sharing ("it can never finish in this pool").
  scheduler<> s({.max_tokens_per_step = 512}, {.block_size = 4, .num_device_blocks = 16});
  const std::int32_t lengths[] = {7, 19, 30, 1};
  for (request_id id = 1; id <= 4; ++id) {
    s.add_request(id, {.prompt = iota_tokens(static_cast<std::size_t>(lengths[id - 1]), static_cast<token_id>(100 * id)),
                       .max_new_tokens = 12, .num_samples = 2});
  }
  std::int32_t steps = 0;
  while (s.has_unfinished() && steps < 1000) {
    const step_plan plan = s.schedule();
    // Whatever is re-prefilled, a shared prompt block is computed once a step.
    std::vector<slot_id> slots = plan.slot_mapping;
    std::sort(slots.begin(), slots.end());
    EXPECT_EQ(std::adjacent_find(slots.begin(), slots.end()), slots.end()) << "step " << steps << " writes a slot twice";
    s.complete(plan, distinct_sample);
    ++steps;
  }
  EXPECT_GE(s.output(3).num_preemptions, 1) << "the repro must preempt the 30-token request";
  for (request_id id = 1; id <= 4; ++id) {
    const request_output& out = s.output(id);
    EXPECT_EQ(out.state, request_state::finished) << "request " << id;
    ASSERT_EQ(out.sequences.size(), 2u) << "request " << id;
    EXPECT_EQ(out.sequences[0].front() + out.sequences[1].front(), 21) << "request " << id << ": one of each sample";
    for (const auto& tokens : out.sequences) EXPECT_EQ(tokens.size(), 12u) << "request " << id;
  }
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
}

TEST(Scheduler, MisuseIsRefused) {
  scheduler<> s({}, {.block_size = 4, .num_device_blocks = 8});
  EXPECT_THROW(s.add_request(1, {.prompt = {}}), error);
  s.add_request(1, {.prompt = iota_tokens(2)});
  EXPECT_THROW(s.add_request(1, {.prompt = iota_tokens(2)}), error);
  EXPECT_THROW((void)s.output(7), error);
  EXPECT_THROW((scheduler<>({.max_tokens_per_step = 0}, {.block_size = 4, .num_device_blocks = 8})), error);
  s.add_request(2, {.prompt = iota_tokens(2, 10)});
  const step_plan p = s.schedule();
  ASSERT_EQ(p.batch.size(), 2u);
  // The sampler breaks the contract for request 1 only: it is aborted, request 2 still advances.
  auto sampler = [](const sampling_request& r) {
    return r.request == 1 ? std::vector<continuation>{} : null_sample(r);
  };
  try {
    s.complete(p, sampler);
    FAIL() << "a first sampling must return n continuations";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("request 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.output(1).state, request_state::aborted);
  EXPECT_EQ(s.output(2).state, request_state::running);
  EXPECT_EQ(s.kv().num_tokens(s.schedule().batch.at(0).seq), 3) << "request 2 got its token";
}

// ---- what a step_plan hands the forward --------------------------------------------------------

/// Token `position` of a request whose prompt is `prompt` and whose sampler is null_sample.
token_id expected_token(const std::vector<token_id>& prompt, std::int32_t position) {
  return position < static_cast<std::int32_t>(prompt.size()) ? prompt[static_cast<std::size_t>(position)] : 1;
}

TEST(Scheduler, PlanCarriesEachChunksTokensAndTableRowUpToItsKvLen) {
  // An 11-token prompt chunked by a budget of 5 beside a decoding request: the chunk's table holds
  // the whole prompt, its row only the blocks up to its kv_len.
  constexpr std::int32_t bs = 4;
  scheduler<> s({.max_tokens_per_step = 5}, {.block_size = bs, .num_device_blocks = 32});
  const std::vector<std::vector<token_id>> prompts{iota_tokens(3), iota_tokens(11, 100)};
  s.add_request(1, {.prompt = prompts[0], .max_new_tokens = 6});
  s.add_request(2, {.prompt = prompts[1], .max_new_tokens = 2});
  std::int32_t rows_shorter_than_their_table = 0, steps = 0;
  for (; s.has_unfinished() && steps < 100; ++steps) {
    const step_plan p = s.schedule();
    ASSERT_EQ(p.input_tokens.size(), p.slot_mapping.size());
    ASSERT_EQ(p.kv_lens.size(), p.batch.size());
    ASSERT_EQ(p.block_tables.size(), p.batch.size() * static_cast<std::size_t>(p.max_blocks_per_seq));
    std::int32_t longest = 0;
    for (std::size_t i = 0; i < p.batch.size(); ++i) {
      const scheduled_sequence& q = p.batch[i];
      const auto row = std::span<const block_id>(p.block_tables)
                           .subspan(i * static_cast<std::size_t>(p.max_blocks_per_seq),
                                    static_cast<std::size_t>(p.max_blocks_per_seq));
      const std::int32_t used = (q.kv_len() + bs - 1) / bs;
      EXPECT_EQ(p.kv_lens[i], q.kv_len());
      for (std::int32_t j = 0; j < q.num_tokens; ++j) {
        const std::int32_t position = q.first_position + j;
        const std::size_t at = q.slot_offset + static_cast<std::size_t>(j);
        EXPECT_EQ(p.input_tokens[at], expected_token(prompts[q.request - 1], position)) << "step " << steps;
        EXPECT_EQ(p.slot_mapping[at], slot_id{row[static_cast<std::size_t>(position / bs)]} * bs + position % bs)
            << "step " << steps << ": the row maps the token to its slot";
      }
      const block_table& table = s.kv().table(q.seq);
      EXPECT_TRUE(std::equal(row.begin(), row.begin() + used, table.blocks().begin())) << "step " << steps;
      EXPECT_TRUE(std::all_of(row.begin() + used, row.end(), [](block_id b) { return b == null_block; }));
      rows_shorter_than_their_table += table.num_blocks() > used ? 1 : 0;
      longest = std::max(longest, used);
    }
    EXPECT_EQ(p.max_blocks_per_seq, longest);
    s.complete(p, null_sample);
  }
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_EQ(rows_shorter_than_their_table, 2) << "the first two chunks of the 11-token prompt end before its table";
}

TEST(Scheduler, PlanListsEachRejectedRequestOnce) {
  // Request 1 cannot fit an empty pool; request 3 fits at first and then outgrows it.
  scheduler<> s({}, {.block_size = 4, .num_device_blocks = 2});
  s.add_request(1, {.prompt = iota_tokens(9), .max_new_tokens = 1});
  s.add_request(2, {.prompt = iota_tokens(3, 20), .max_new_tokens = 2});
  s.add_request(3, {.prompt = iota_tokens(4, 40), .max_new_tokens = 20});
  std::vector<request_id> rejected;
  for (std::int32_t steps = 0; s.has_unfinished() && steps < 100; ++steps) {
    const step_plan p = s.schedule();
    for (const scheduled_sequence& q : p.batch) {
      EXPECT_EQ(std::count(rejected.begin(), rejected.end(), q.request), 0) << "a rejected request ran";
    }
    for (request_id id : p.rejected) {
      EXPECT_EQ(s.output(id).state, request_state::rejected);
      rejected.push_back(id);
    }
    s.complete(p, null_sample);
  }
  EXPECT_EQ(rejected, (std::vector<request_id>{1, 3}));
  EXPECT_EQ(s.output(2).state, request_state::finished);
}

TEST(Scheduler, SwapWithoutAHostPoolPreemptsByRecompute) {
  // The same requests through preempt_by_recompute and through preempt_by_swap with no host pool:
  // every preemption falls back to recompute, so the plans are the same step for step.
  const scheduler_options so{.max_tokens_per_step = 64};
  const kv_cache_options ko{.block_size = 2, .num_device_blocks = 8, .enable_prefix_caching = false};
  scheduler<> recompute(so, ko);
  scheduler<fcfs_admission, preempt_by_swap> swap(so, ko);
  for (request_id id : {1, 2, 3}) {
    const request_params params{.prompt = iota_tokens(3, static_cast<token_id>(10 * id)), .max_new_tokens = 6,
                                .num_samples = id == 2 ? 2 : 1};
    recompute.add_request(id, params);
    swap.add_request(id, params);
  }
  std::int32_t steps = 0;
  for (; recompute.has_unfinished() && steps < 1000; ++steps) {
    ASSERT_TRUE(swap.has_unfinished());
    const step_plan a = recompute.schedule();
    const step_plan b = swap.schedule();
    EXPECT_TRUE(b.swap_out.empty() && b.swap_in.empty());
    EXPECT_EQ(b.preempted, a.preempted) << "step " << steps;
    EXPECT_EQ(b.slot_mapping, a.slot_mapping) << "step " << steps;
    EXPECT_EQ(b.input_tokens, a.input_tokens) << "step " << steps;
    EXPECT_EQ(b.block_tables, a.block_tables) << "step " << steps;
    EXPECT_EQ(b.copies, a.copies) << "step " << steps;
    recompute.complete(a, null_sample);
    swap.complete(b, null_sample);
  }
  EXPECT_FALSE(swap.has_unfinished());
  EXPECT_GT(recompute.num_preemptions(), 0);
  EXPECT_EQ(swap.num_preemptions(), recompute.num_preemptions());
  for (request_id id : {1, 2, 3}) EXPECT_EQ(swap.output(id).sequences, recompute.output(id).sequences);
}

// Asynchronous scheduling: complete() takes stand-in tokens, the next step is planned, and the
// real tokens are set before that step completes; the prefix cache hashes only the real ones.
TEST(Scheduler, StandInTokensAreSetBeforeTheirBlocksArePublished) {
  constexpr token_id stand_in = 0;
  scheduler<> s({.max_tokens_per_step = 64, .max_num_seqs = 4}, {.block_size = 4, .num_device_blocks = 16});
  s.add_request(1, {.prompt = iota_tokens(6), .max_new_tokens = 3});
  const auto stand_ins = [&](const sampling_request& r) {
    std::vector<continuation> next;
    for (seq_id seq : r.seqs) next.push_back({seq, stand_in, false});
    return next;
  };
  std::vector<token_id> real = {100, 101, 102};
  step_plan plan = s.schedule();  // the prompt
  for (std::size_t t = 0; t < real.size(); ++t) {
    const seq_id seq = plan.batch.at(0).seq;
    const std::int32_t position = plan.batch.at(0).kv_len();
    const std::vector<request_id> finished = s.complete(plan, stand_ins);
    const step_plan next = finished.empty() ? s.schedule() : step_plan{};
    if (!next.empty()) {
      ASSERT_EQ(next.input_tokens.size(), 1u);
      EXPECT_EQ(next.input_tokens[0], stand_in) << "planned before the token is known";
    }
    s.set_token(1, seq, position, real[t]);
    if (!next.empty()) {
      EXPECT_THROW(s.set_token(1, seq, position - 1, 7), error) << "a computed token cannot change";
      EXPECT_EQ(s.kv().tokens(seq)[std::size_t(position)], real[t]);
      plan = next;
    } else {
      EXPECT_EQ(s.output(1).state, request_state::finished);
    }
  }
  ASSERT_EQ(s.output(1).sequences.size(), 1u);
  EXPECT_EQ(s.output(1).sequences[0], real) << "the finished output holds the real tokens";
  EXPECT_EQ(s.output(1).sequence_ids.size(), 1u);
  EXPECT_THROW(s.set_token(1, 999, 6, 5), error);
  EXPECT_THROW(s.set_token(1, s.output(1).sequence_ids[0], 9, 5), error) << "past what it generated";
  // The prompt and the first two real tokens fill two blocks; a request with that prefix hits them.
  std::vector<token_id> prefix = iota_tokens(6);
  prefix.insert(prefix.end(), {100, 101, 7});
  s.add_request(2, {.prompt = prefix, .max_new_tokens = 1});
  const step_plan hit = s.schedule();
  ASSERT_EQ(hit.batch.size(), 1u);
  EXPECT_EQ(hit.batch[0].first_position, 8) << "two blocks of real tokens were cached";
  EXPECT_EQ(s.output(2).num_cached_prompt_tokens, 8);
}

/// Each schedule() is one step of a TTL in steps: a finished request's blocks stay protected for
/// the TTL's steps, then become evictable, with no call from the engine.
TEST(Scheduler, AdvancesATtlInStepsEachSchedule) {
  using manager = kv_cache_manager<lifo_free_list, xxh3_hash, ttl_eviction<>>;
  // Partial reuse off: the prompt's last, partly filled block would stay cached (and protected) too.
  scheduler<fcfs_admission, preempt_by_recompute, manager> s(
      {.max_tokens_per_step = 64, .max_num_seqs = 4},
      {.block_size = 4, .num_device_blocks = 16, .enable_partial_reuse = false});
  auto& queue = s.kv().cache().eviction_queue();
  queue.set_ttl(steps{3});
  s.add_request(1, {.prompt = iota_tokens(9), .max_new_tokens = 1});  // two full blocks stay cached
  run_to_completion(s);
  const step_clock::time_point finished = queue.clock().now();
  EXPECT_EQ(queue.num_protected(), 2);
  EXPECT_EQ(s.kv().num_free_blocks(), 14);
  for (int step = 1; step <= 3; ++step) {
    EXPECT_TRUE(s.schedule().empty());
    EXPECT_EQ(queue.clock().now() - finished, steps{step});
    EXPECT_EQ(queue.num_protected(), step < 3 ? 2 : 0) << "after " << step << " steps";
  }
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
}

/// A TTL in seconds on a manual_clock follows the scheduler's injected time source.
TEST(Scheduler, SetsATtlInSecondsFromItsTimeSource) {
  using manager = kv_cache_manager<lifo_free_list, xxh3_hash, pin_budget_eviction<ttl_eviction<lru_eviction, manual_clock>>>;
  scheduler<fcfs_admission, preempt_by_recompute, manager> s(
      {.max_tokens_per_step = 64, .max_num_seqs = 4},
      {.block_size = 4, .num_device_blocks = 16, .enable_partial_reuse = false});  // whole blocks only
  double now = 100.0;
  s.set_time_source([&] { return now; });
  auto& ttl = s.kv().cache().eviction_queue().inner();  // wrapped in a pin budget: the scheduler finds it
  ttl.set_ttl(manual_clock::duration{2.5});
  s.add_request(1, {.prompt = iota_tokens(9), .max_new_tokens = 1});
  run_to_completion(s);  // at t = 100: the blocks went idle then
  EXPECT_EQ(ttl.clock().now().time_since_epoch().count(), 100.0);
  EXPECT_EQ(ttl.num_protected(), 2);
  EXPECT_EQ(s.kv().num_held_blocks(), 2) << "the pin budget passes its inner TTL's held blocks on";
  now = 102.0;
  s.schedule();
  EXPECT_EQ(ttl.num_protected(), 2);
  now = 90.0;  // a time source that goes back does not move the clock back
  s.schedule();
  EXPECT_EQ(ttl.clock().now().time_since_epoch().count(), 102.0);
  now = 102.5;
  s.schedule();
  EXPECT_EQ(ttl.num_protected(), 0);
  EXPECT_EQ(s.kv().num_held_blocks(), 0);
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
}

/// Regression (found by the tiersim simulator): idle blocks within a TTL are not free, and a
/// request running alone that had to grow into them was rejected as outgrowing the pool. A TTL is a
/// hold that time ends: the request waits for the blocks to expire, the hold is kept meanwhile,
/// and it finishes.
TEST(Scheduler, ARunningRequestWaitsForATtlsBlocksInsteadOfBeingRejected) {
  using manager = kv_cache_manager<lifo_free_list, xxh3_hash, ttl_eviction<>>;
  scheduler<fcfs_admission, preempt_by_recompute, manager> s({.max_tokens_per_step = 64, .max_num_seqs = 4},
                                                             {.block_size = 4, .num_device_blocks = 8});
  auto& queue = s.kv().cache().eviction_queue();
  queue.set_ttl(steps{40});
  s.add_request(1, {.prompt = iota_tokens(16), .max_new_tokens = 1});
  run_to_completion(s);
  ASSERT_EQ(queue.num_protected(), 4);  // the prompt's four blocks, held for 40 steps
  ASSERT_EQ(s.kv().num_free_blocks(), 4);
  ASSERT_EQ(s.kv().num_held_blocks(), 4);
  const step_clock::time_point idle_since = queue.clock().now();
  // 8 prompt tokens and 12 new: 5 blocks, one more than is free before the TTL ends.
  s.add_request(2, {.prompt = iota_tokens(8, 100), .max_new_tokens = 12});
  std::int32_t waits = 0;
  while (s.has_unfinished()) {
    const step_plan plan = s.schedule();
    ASSERT_TRUE(plan.rejected.empty()) << "rejected at step " << (queue.clock().now() - idle_since).count();
    if (plan.empty()) {
      ASSERT_TRUE(s.waiting_for_retention());
      ASSERT_LT(queue.clock().now() - idle_since, steps{40}) << "waits only while the TTL holds";
      EXPECT_EQ(queue.num_protected(), 4) << "the hold is kept while the request waits";
      ++waits;
    }
    s.complete(plan, null_sample);
    ASSERT_LT(queue.clock().now() - idle_since, steps{200});
  }
  EXPECT_EQ(s.output(2).state, request_state::finished);
  EXPECT_EQ(s.output(2).sequences[0].size(), 12u);
  EXPECT_GT(waits, 0);
  EXPECT_EQ(s.stats().retention_waits, waits);
  EXPECT_EQ(s.stats().rejected_running, 0);
}

/// The hold does not make a request that can never fit wait forever: once the TTL's blocks have
/// expired (and been taken), a request that still outgrows the pool is rejected as before; and a
/// waiting request that needs held blocks waits, with an empty plan that is not a deadlock.
TEST(Scheduler, ATtlWaitEndsInAdmissionOrRejection) {
  using manager = kv_cache_manager<lifo_free_list, xxh3_hash, ttl_eviction<>>;
  scheduler<fcfs_admission, preempt_by_recompute, manager> s({.max_tokens_per_step = 64, .max_num_seqs = 4},
                                                             {.block_size = 4, .num_device_blocks = 8});
  s.kv().cache().eviction_queue().set_ttl(steps{10});
  s.add_request(1, {.prompt = iota_tokens(16), .max_new_tokens = 1});
  run_to_completion(s);
  // 24 prompt tokens: 6 blocks, 4 free: admission waits for the TTL, then takes the expired blocks.
  s.add_request(2, {.prompt = iota_tokens(24, 200), .max_new_tokens = 1});
  step_plan plan = s.schedule();
  EXPECT_TRUE(plan.empty());
  EXPECT_TRUE(s.waiting_for_retention());
  EXPECT_EQ(s.output(2).state, request_state::waiting);
  EXPECT_LE(run_to_completion(s, 20), 20);
  EXPECT_EQ(s.output(2).state, request_state::finished);
  EXPECT_FALSE(s.waiting_for_retention());
  EXPECT_GT(s.stats().retention_waits, 0);
  // 8 prompt tokens and 30 new: 10 blocks of a pool of 8. It waits while the TTL holds the last
  // request's blocks, then is rejected.
  s.add_request(3, {.prompt = iota_tokens(8, 300), .max_new_tokens = 30});
  EXPECT_LT(run_to_completion(s, 100), 100);
  EXPECT_EQ(s.output(3).state, request_state::rejected);
  EXPECT_EQ(s.stats().rejected_running, 1);
}

}  // namespace
}  // namespace pagedkv
