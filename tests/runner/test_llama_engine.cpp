// The engine's invariances on a tiny random-weight model: what a request generates does not depend
// on what else runs, on prefix caching, on preemption (recompute or swap), on chunked prefill, on
// n, or on beam width 1 against greedy. Each test also checks that the mechanism it varies really
// ran (sequences batched, cached tokens, preemptions by swap or recompute, prefill chunks, blocks
// copied on write), from the engine's stats and results, so it cannot pass vacuously. The
// invariance tests run on every backend: the CPU's, and the CUDA one where a GPU is visible (on a
// model of head_dim 64, so that pagedkv's decode and prefill kernels and the decode graphs serve
// it, not the backend's plain attention); without one, the CUDA cases skip.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "engine.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv::llama;
using namespace pagedkv::llama::test;
using pagedkv::preemption_mode;
using pagedkv::token_id;

/// The model the CUDA cases run: tiny_weights of a head_dim the kernels compile, Q and K scaled down
/// as trained models attend (test_cuda_backend.cpp's shaped_weights says why).
struct kernel_shaped_model {
  llama_config config;
  llama_weights weights;
  kernel_shaped_model() {
    config = tiny_config();
    config.num_heads = 4;
    config.num_kv_heads = 2;
    config.head_dim = config.rope_dim = 64;
    config.embedding_dim = 256;
    config.ffn_dim = 384;
    config.vocab_size = 300;
    weights = tiny_weights(config, 7);
    for (llama_layer_weights& l : weights.layers)
      for (std::vector<float>* m : {&l.wq, &l.wk})
        for (float& x : *m) x *= 0.25f;
  }
};

/// The backend the current test runs on ("cpu" outside the parameterised tests).
std::string& current_device() {
  static std::string device = "cpu";
  return device;
}

struct model_view {
  const llama_config& config;
  const llama_weights& weights;
};

model_view model() {
  if (current_device() == "cuda") {
    static const kernel_shaped_model m;
    return {m.config, m.weights};
  }
  return {shared_tiny_model().config, shared_tiny_model().weights};
}

std::unique_ptr<model_backend> backend() {
  return make_model_backend(model().config, model().weights, {.device = current_device()});
}

/// The invariance tests, once a backend.
class engine_invariance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == "cuda" && !cuda_backend_available(&why)) GTEST_SKIP() << why;
    current_device() = GetParam();
  }
  void TearDown() override { current_device() = "cpu"; }
};

std::vector<token_id> random_prompt(std::uint32_t seed, std::int32_t length) {
  std::mt19937 rng(seed);
  // ids of the tiny model's vocabulary, which the CUDA cases' larger one contains: prompts() is
  // made once, by whichever backend's test asks first
  std::uniform_int_distribution<token_id> token(0, token_id(shared_tiny_model().config.vocab_size - 1));
  std::vector<token_id> p(static_cast<std::size_t>(length));
  for (token_id& t : p) t = token(rng);
  return p;
}

engine_options small_options() {
  engine_options o;
  o.block_size = 4;
  o.num_blocks = 64;
  o.eos_id = -1;  // random weights: run every request to max_tokens
  return o;
}

sampling_params greedy(std::int32_t max_tokens = 12) { return {.max_tokens = max_tokens}; }

/// A generate() run's engine and its requests in prompt order: what the mechanism checks read.
struct run {
  engine* e = nullptr;
  std::vector<pagedkv::request_id> ids;

  [[nodiscard]] std::vector<std::int32_t> prefill_chunks() const {
    std::vector<std::int32_t> out;
    for (const auto id : ids) out.push_back(e->result(id).num_prefill_chunks);
    return out;
  }
};

/// Runs the prompts together in one engine; returns each request's completions' tokens.
std::vector<std::vector<std::vector<token_id>>> generate(const engine_options& options,
                                                          const std::vector<std::vector<token_id>>& prompts,
                                                          const sampling_params& params, run* out = nullptr) {
  static std::unique_ptr<engine> keep;
  keep = std::make_unique<engine>(backend(), nullptr, options);
  std::vector<pagedkv::request_id> ids;
  for (const auto& p : prompts) ids.push_back(keep->add_request(p, params));
  keep->run();
  std::vector<std::vector<std::vector<token_id>>> out_tokens;
  for (const auto id : ids) {
    const request_result& r = keep->result(id);
    EXPECT_TRUE(r.finished);
    std::vector<std::vector<token_id>> seqs;
    for (const completion& c : r.completions) seqs.push_back(c.tokens);
    out_tokens.push_back(seqs);
  }
  if (out) *out = {keep.get(), ids};
  return out_tokens;
}

const std::vector<std::vector<token_id>>& prompts() {
  static const std::vector<std::vector<token_id>> p = {random_prompt(1, 7), random_prompt(2, 19), random_prompt(3, 30),
                                                       random_prompt(4, 1)};
  return p;
}

std::vector<std::vector<std::vector<token_id>>> alone(const std::vector<std::vector<token_id>>& ps) {
  std::vector<std::vector<std::vector<token_id>>> out;
  for (const auto& p : ps) out.push_back(generate(small_options(), {p}, greedy())[0]);
  return out;
}

TEST_P(engine_invariance, batched_equals_alone) {
  const auto expected = alone(prompts());
  for (const auto& seqs : expected) {
    ASSERT_EQ(seqs.size(), 1u);
    EXPECT_EQ(seqs[0].size(), 12u);
  }
  run batched;
  EXPECT_EQ(generate(small_options(), prompts(), greedy(), &batched), expected);
  EXPECT_EQ(batched.e->stats().max_seqs_per_step, 4) << "the four requests share steps";
}

TEST_P(engine_invariance, prefix_caching_does_not_change_output) {
  // Two prompts share a 16-token prefix; the second runs after the first so its prefix is cached.
  std::vector<token_id> a = random_prompt(9, 16), b = a;
  a.push_back(3);
  b.insert(b.end(), {5, 6, 7});
  engine_options cached = small_options(), uncached = small_options();
  uncached.enable_prefix_caching = false;
  for (const auto* options : {&cached, &uncached}) {
    engine e(backend(), nullptr, *options);
    const auto first = e.add_request(a, greedy());
    e.run();
    const auto second = e.add_request(b, greedy());
    e.run();
    EXPECT_EQ(e.result(first).completions[0].tokens, alone({a})[0][0]);
    EXPECT_EQ(e.result(second).completions[0].tokens, alone({b})[0][0]);
    EXPECT_EQ(e.result(second).num_cached_prompt_tokens, options->enable_prefix_caching ? 16 : 0);
  }
}

TEST_P(engine_invariance, partial_reuse_does_not_change_output) {
  // The second prompt shares 14 tokens with the first: three whole blocks of 4 and two tokens of
  // the first's fourth block, which partial reuse copies instead of computing.
  const std::vector<token_id> a = random_prompt(11, 14);
  std::vector<token_id> b(a.begin(), a.end());
  b.insert(b.end(), {5, 6, 7});
  const token_id first_generated = alone({a})[0][0][0];
  b[14] = first_generated == 5 ? 8 : 5;  // so that the first's generated tokens do not continue the match
  engine_options on = small_options(), off = small_options();
  off.enable_partial_reuse = false;
  const auto expected = alone({b})[0][0];
  for (const auto* options : {&on, &off}) {
    engine e(backend(), nullptr, *options);
    e.add_request(a, greedy());
    e.run();
    const auto second = e.add_request(b, greedy());
    e.run();
    EXPECT_EQ(e.result(second).completions[0].tokens, expected);
    const std::int32_t cached = e.result(second).num_cached_prompt_tokens;
    EXPECT_EQ(cached, options->enable_partial_reuse ? 14 : 12);
    EXPECT_EQ(e.kv_usage().partial_hit_rate > 0, options->enable_partial_reuse);
  }
}

TEST_P(engine_invariance, a_burst_sharing_a_prefix_computes_it_once) {
  // Four requests that share 16 tokens (four blocks of 4) arrive together: the first computes the
  // prefix and the others attach to its blocks while they are in flight, and wait for them; also
  // when its prefill is chunked (the others join at its second chunk, which computes the fourth
  // shared block), and when a small pool then preempts.
  const std::vector<token_id> prefix = random_prompt(13, 16);
  std::vector<std::vector<token_id>> ps;
  for (std::uint32_t i = 0; i < 4; ++i) {
    ps.push_back(prefix);
    const std::vector<token_id> own = random_prompt(20 + i, 3);
    ps.back().insert(ps.back().end(), own.begin(), own.end());
  }
  const auto expected = alone(ps);
  engine_options burst = small_options(), chunked = small_options(), small_pool = small_options();
  chunked.max_tokens_per_step = 12;
  small_pool.max_tokens_per_step = 12;
  small_pool.num_blocks = 12;
  for (const auto* options : {&burst, &chunked, &small_pool}) {
    run r;
    EXPECT_EQ(generate(*options, ps, greedy(), &r), expected);
    EXPECT_GT(r.e->kv_usage().shared_hit_rate, 0.0);
    if (options == &burst) {
      for (std::size_t i = 1; i < ps.size(); ++i) EXPECT_EQ(r.e->result(r.ids[i]).num_cached_prompt_tokens, 16);
    }
  }
}

TEST_P(engine_invariance, preemption_by_recompute_or_swap_does_not_change_output) {
  const auto expected = alone(prompts());
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    engine_options tiny_pool = small_options();
    tiny_pool.num_blocks = 12;  // 48 tokens: the four requests (up to 42 tokens each) cannot all stay
    tiny_pool.preemption = mode;
    run r;
    const char* name = mode == preemption_mode::swap ? "swap" : "recompute";
    EXPECT_EQ(generate(tiny_pool, prompts(), greedy(), &r), expected) << name;
    EXPECT_GT(r.e->num_preemptions(), 0) << name;
    const engine_stats& stats = r.e->stats();
    if (mode == preemption_mode::swap) {
      EXPECT_GT(stats.num_swapped_out_blocks, 0) << "swap preemption swapped";
      EXPECT_EQ(stats.num_swapped_in_blocks, stats.num_swapped_out_blocks) << "and swapped everything back";
    } else {
      EXPECT_EQ(stats.num_swapped_out_blocks, 0) << "recompute preemption freed its blocks";
    }
  }
}

TEST_P(engine_invariance, chunked_prefill_does_not_change_output) {
  const auto expected = alone(prompts());
  engine_options chunked = small_options();
  chunked.max_tokens_per_step = 5;  // the 30-token prompt takes six steps
  // Alone, a prompt of p tokens takes ceil(p / 5) chunks; batched, decodes take budget first.
  const std::vector<std::int32_t> alone_chunks{2, 4, 6, 1};  // prompts of 7, 19, 30 and 1 tokens
  for (std::size_t i = 0; i < prompts().size(); ++i) {
    run r;
    EXPECT_EQ(generate(chunked, {prompts()[i]}, greedy(), &r)[0], expected[i]) << "prompt " << i << " alone";
    EXPECT_EQ(r.prefill_chunks(), std::vector{alone_chunks[i]}) << "prompt " << i << " alone";
  }
  run batched;
  EXPECT_EQ(generate(chunked, prompts(), greedy(), &batched), expected);
  const std::vector<std::int32_t> chunks = batched.prefill_chunks();
  for (std::size_t i = 0; i < chunks.size(); ++i) EXPECT_GE(chunks[i], alone_chunks[i]) << "prompt " << i;
  run whole;
  generate(small_options(), prompts(), greedy(), &whole);
  EXPECT_EQ(whole.prefill_chunks(), (std::vector<std::int32_t>{1, 1, 1, 1})) << "a budget of 512 takes each at once";
}

TEST_P(engine_invariance, n_greedy_samples_equal_one) {
  const auto expected = alone(prompts());
  sampling_params two = greedy();
  two.n = 2;
  run r;
  const auto got = generate(small_options(), prompts(), two, &r);
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), 2u);
    EXPECT_EQ(got[i][0], expected[i][0]);
    EXPECT_EQ(got[i][1], expected[i][0]);
  }
  // The two samples share one prefill of the prompt, then each prompt's partly filled last block
  // is copied on the first append after the fork (7, 19, 30 and 1 tokens in blocks of 4).
  EXPECT_EQ(r.prefill_chunks(), (std::vector<std::int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(r.e->stats().num_copied_blocks, 4);
}

TEST_P(engine_invariance, forked_groups_survive_preemption_and_chunking) {
  // n = 2 and beam width 2 with a pool that forces recompute preemption and a budget that
  // chunks every re-prefill, so a group's sequences finish their prefills in different steps.
  engine_options tight = small_options();
  tight.num_blocks = 16;
  tight.max_tokens_per_step = 5;
  const auto expected = alone(prompts());
  sampling_params two = greedy();
  two.n = 2;
  run r;
  const auto got = generate(tight, prompts(), two, &r);
  EXPECT_GT(r.e->num_preemptions(), 0);
  EXPECT_GT(r.e->stats().num_copied_blocks, 0) << "the samples forked";
  EXPECT_GE(r.prefill_chunks()[2], 6) << "the 30-token prompt was chunked";
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), 2u);
    EXPECT_EQ(got[i][0], expected[i][0]);
    EXPECT_EQ(got[i][1], expected[i][0]);
  }
  sampling_params beams = greedy();
  beams.beam_width = 2;
  const auto roomy_beams = generate(small_options(), prompts(), beams);
  EXPECT_EQ(generate(tight, prompts(), beams, &r), roomy_beams);
  EXPECT_GT(r.e->num_preemptions(), 0);
  EXPECT_GT(r.e->stats().num_copied_blocks, 0) << "the beams forked";
}

TEST_P(engine_invariance, beam_width_one_is_greedy) {
  const auto expected = alone(prompts());
  sampling_params beam = greedy();
  beam.beam_width = 1;
  EXPECT_EQ(generate(small_options(), prompts(), beam), expected);
}

/// Every request of `params_of` together; returns each one's completions' tokens and the engine's stats.
std::pair<std::vector<std::vector<std::vector<token_id>>>, engine_stats> generate_mixed(
    const engine_options& options, const std::vector<std::vector<token_id>>& ps,
    const std::vector<sampling_params>& params_of) {
  engine e(backend(), nullptr, options);
  std::vector<pagedkv::request_id> ids;
  for (std::size_t i = 0; i < ps.size(); ++i) ids.push_back(e.add_request(ps[i], params_of[i % params_of.size()]));
  e.run();
  std::vector<std::vector<std::vector<token_id>>> out;
  for (const auto id : ids) {
    std::vector<std::vector<token_id>> seqs;
    for (const completion& c : e.result(id).completions) seqs.push_back(c.tokens);
    out.push_back(seqs);
  }
  return {out, e.stats()};
}

TEST_P(engine_invariance, async_scheduling_does_not_change_output) {
  // Greedy alone and batched, under recompute and swap preemption and chunked prefill: the steps
  // planned ahead compute what synchronous steps compute.
  engine_options sync = small_options();
  sync.async_scheduling = false;
  engine_options tight = small_options();
  tight.num_blocks = 12;
  tight.max_tokens_per_step = 5;
  engine_options tight_swap = tight;
  tight_swap.preemption = preemption_mode::swap;
  const auto expected = alone(prompts());
  for (const engine_options* o : {&sync, &tight, &tight_swap}) {
    for (const bool async : {false, true}) {
      engine_options options = *o;
      options.async_scheduling = async;
      const auto [got, stats] = generate_mixed(options, prompts(), {greedy()});
      EXPECT_EQ(got, expected) << "async " << async << ", " << options.num_blocks << " blocks";
      if (async) EXPECT_GT(stats.num_async_steps, stats.num_steps / 2) << "most steps were planned ahead";
      else EXPECT_EQ(stats.num_async_steps, 0);
    }
  }
}

TEST_P(engine_invariance, async_scheduling_keeps_every_sampling_mode) {
  // Seeded sampling, top_logprobs, n = 2 and beams in one batch: steps that sample a request of
  // several sequences run synchronously, the others ahead; every request's tokens are the same.
  sampling_params seeded{.max_tokens = 10, .temperature = 0.9f, .top_k = 40, .seed = 11};
  sampling_params two = greedy(9);
  two.n = 2;
  sampling_params beams = greedy(8);
  beams.beam_width = 2;
  sampling_params logprobs = greedy(11);
  logprobs.top_logprobs = 3;
  std::vector<std::vector<token_id>> ps = prompts();
  ps.push_back(random_prompt(5, 13));
  for (const std::vector<sampling_params>& mix :
       {std::vector<sampling_params>{seeded}, std::vector<sampling_params>{seeded, two, beams, logprobs, greedy()}}) {
    engine_options sync = small_options(), async = small_options();
    sync.async_scheduling = false;
    const auto [want, sync_stats] = generate_mixed(sync, ps, mix);
    const auto [got, async_stats] = generate_mixed(async, ps, mix);
    EXPECT_EQ(got, want) << mix.size() << " kinds of request";
    EXPECT_GT(async_stats.num_async_steps, 0);
    if (mix.size() == 1) EXPECT_EQ(async_stats.num_async_steps + 1, async_stats.num_steps) << "all but the first";
    else EXPECT_LT(async_stats.num_async_steps + 1, async_stats.num_steps) << "n = 2 and beams ran synchronously";
  }
}

TEST_P(engine_invariance, a_token_that_ends_a_sequence_discards_what_was_planned_ahead) {
  // An EOS in the middle of prompt 1's greedy output ends it (and any other that draws it); the
  // step planned ahead had continued it, and what it computed for it is discarded.
  const auto expected = alone(prompts());
  const token_id eos = expected[1][0][4];
  engine_options sync = small_options(), async = small_options();
  sync.eos_id = async.eos_id = eos;
  sync.async_scheduling = false;
  const auto [want, sync_stats] = generate_mixed(sync, prompts(), {greedy()});
  const auto [got, async_stats] = generate_mixed(async, prompts(), {greedy()});
  ASSERT_LE(want[1][0].size(), 5u);
  EXPECT_EQ(want[1][0].back(), eos);
  EXPECT_EQ(got, want);
  EXPECT_EQ(sync_stats.num_discarded_tokens, 0);
  EXPECT_GT(async_stats.num_discarded_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(backends, engine_invariance, testing::Values("cpu", "cuda"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(engine_sampling, seeded_sampling_is_reproducible_alone_or_batched) {
  sampling_params hot{.max_tokens = 10, .temperature = 1.0f, .top_k = 20, .top_p = 0.9f, .seed = 42, .n = 3};
  const auto batched = generate(small_options(), prompts(), hot);
  EXPECT_EQ(generate(small_options(), {prompts()[1]}, hot)[0], batched[1]);
  EXPECT_NE(batched[1][0], batched[1][1]);  // three draws at temperature 1 differ (checked for this seed)
  hot.seed = 43;
  EXPECT_NE(generate(small_options(), {prompts()[1]}, hot)[0], batched[1]);
}

TEST(engine_sampling, seeded_sampling_survives_preemption_and_chunking) {
  // Each draw's uniform is a function of (seed, sample, token index): a tight pool that preempts
  // and re-prefills the samples, in chunks, draws the same tokens as a roomy one.
  engine_options tight = small_options();
  tight.num_blocks = 16;
  tight.max_tokens_per_step = 5;
  sampling_params hot{.max_tokens = 12, .temperature = 1.0f, .top_p = 0.95f, .seed = 7, .n = 2};
  run r;
  const auto got = generate(tight, prompts(), hot, &r);
  EXPECT_GT(r.e->num_preemptions(), 0);
  EXPECT_GE(r.prefill_chunks()[2], 6) << "the 30-token prompt was chunked";
  EXPECT_EQ(got, generate(small_options(), prompts(), hot));
  EXPECT_NE(got[2][0], got[2][1]) << "the two samples differ (checked for this seed)";
}

TEST(engine_sampling, top_k_one_and_a_tiny_top_p_are_greedy) {
  const auto expected = alone(prompts());
  EXPECT_EQ(generate(small_options(), prompts(), {.max_tokens = 12, .temperature = 1.5f, .top_k = 1, .seed = 1}), expected);
  EXPECT_EQ(generate(small_options(), prompts(), {.max_tokens = 12, .temperature = 1.5f, .top_p = 1e-6f, .seed = 1}),
            expected);
  EXPECT_NE(generate(small_options(), prompts(), {.max_tokens = 12, .temperature = 1.5f, .seed = 1}), expected);
}

TEST(engine_sampling, beam_search_returns_width_hypotheses_best_first) {
  sampling_params beam{.max_tokens = 8, .beam_width = 3};
  for (const auto& prompt : prompts()) {
    run r;
    const auto got = generate(small_options(), {prompt}, beam, &r);
    ASSERT_EQ(got[0].size(), 3u);
    for (const auto& hyp : got[0]) EXPECT_EQ(hyp.size(), 8u);
    EXPECT_NE(got[0][0], got[0][1]);
    EXPECT_NE(got[0][1], got[0][2]);
    // Best first: all are 8 tokens long, so the order by log-probability per token is the order
    // by log-probability.
    const std::vector<completion>& hyps = r.e->result(r.ids[0]).completions;
    EXPECT_GT(hyps[0].logprob, hyps[1].logprob);
    EXPECT_GT(hyps[1].logprob, hyps[2].logprob);
  }
}

// Per-token log-probabilities sum to the completion's; top_logprobs lists the k most likely tokens
// of each step, most likely first, and asking for them (which takes the logits path rather than
// the backend's greedy choice) changes no greedy token. Beams keep theirs the same way.
TEST(engine_sampling, token_logprobs_and_their_alternatives) {
  for (const std::int32_t beam_width : {0, 3}) {
    sampling_params plain{.max_tokens = 8, .beam_width = beam_width};
    sampling_params with_top = plain;
    with_top.top_logprobs = 4;
    run a, b;
    const auto without = generate(small_options(), prompts(), plain, &a);
    std::vector<request_result> plain_results;
    for (const auto id : a.ids) plain_results.push_back(a.e->result(id));
    EXPECT_EQ(generate(small_options(), prompts(), with_top, &b), without) << "beam width " << beam_width;
    for (std::size_t i = 0; i < b.ids.size(); ++i) {
      const request_result& r = b.e->result(b.ids[i]);
      for (std::size_t c = 0; c < r.completions.size(); ++c) {
        const completion& got = r.completions[c];
        ASSERT_EQ(got.token_logprobs.size(), got.tokens.size());
        ASSERT_EQ(got.top_logprobs.size(), got.tokens.size());
        EXPECT_TRUE(plain_results[i].completions[c].top_logprobs.empty());
        EXPECT_NEAR(std::accumulate(got.token_logprobs.begin(), got.token_logprobs.end(), 0.0), got.logprob, 1e-9);
        for (std::size_t t = 0; t < got.tokens.size(); ++t) {
          const std::vector<pagedkv::llama::token_logprob>& top = got.top_logprobs[t];
          ASSERT_EQ(top.size(), 4u);
          for (std::size_t k = 1; k < top.size(); ++k) EXPECT_GE(top[k - 1].logprob, top[k].logprob);
          EXPECT_LE(top[0].logprob, 0.0);
          if (beam_width == 0) {  // greedy: the chosen token is the most likely, with its logprob
            EXPECT_EQ(top[0].token, got.tokens[t]);
            EXPECT_NEAR(top[0].logprob, got.token_logprobs[t], 1e-9);
            EXPECT_NEAR(got.token_logprobs[t], plain_results[i].completions[c].token_logprobs[t], 1e-4);
          }
        }
      }
    }
  }
}

// The stream's events release each sample's tokens exactly once, with their log-probabilities and
// top alternatives: concatenated, they are the completion's (what a streamed response's logprobs
// are built from). Without a tokenizer each token comes in an event of its own; an aborted request
// releases what it generated too.
TEST(engine_api, stream_events_release_each_token_once) {
  engine e(model().config, model().weights, nullptr, small_options());
  struct released {
    std::vector<token_id> tokens;
    std::vector<double> logprobs;
    std::vector<std::vector<pagedkv::llama::token_logprob>> tops;
    finish_reason reason = finish_reason::none;
  };
  std::map<std::pair<pagedkv::request_id, std::int32_t>, released> got;
  e.on_stream([&](const stream_event& ev) {
    released& r = got[{ev.request, ev.sample}];
    EXPECT_EQ(r.reason, finish_reason::none) << "an event after the sample's end";
    EXPECT_EQ(ev.token_logprobs.size(), ev.tokens.size());
    if (ev.finished == finish_reason::none) {
      EXPECT_EQ(ev.tokens.size(), 1u) << "no tokenizer: a token an event";
    }
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    r.logprobs.insert(r.logprobs.end(), ev.token_logprobs.begin(), ev.token_logprobs.end());
    r.tops.insert(r.tops.end(), ev.top_logprobs.begin(), ev.top_logprobs.end());
    r.reason = ev.finished;
  });
  const auto sampled = e.add_request(prompts()[0], {.max_tokens = 6, .temperature = 1.0f, .seed = 3, .n = 2, .top_logprobs = 2});
  const auto greedy_one = e.add_request(prompts()[1], greedy(5));
  const auto aborted = e.add_request(prompts()[2], {.max_tokens = 50, .top_logprobs = 1});
  e.step();
  e.step();
  EXPECT_TRUE(e.abort(aborted));
  e.run();
  for (const auto id : {sampled, greedy_one, aborted}) {
    const request_result& r = e.result(id);
    for (std::size_t c = 0; c < r.completions.size(); ++c) {
      const completion& want = r.completions[c];
      const released& have = got[{id, std::int32_t(c)}];
      EXPECT_EQ(have.reason, want.reason);
      EXPECT_EQ(have.tokens, want.tokens);
      EXPECT_EQ(have.logprobs, want.token_logprobs);
      ASSERT_EQ(have.tops.size(), want.top_logprobs.size());
      for (std::size_t t = 0; t < have.tops.size(); ++t) {
        ASSERT_EQ(have.tops[t].size(), want.top_logprobs[t].size());
        for (std::size_t k = 0; k < have.tops[t].size(); ++k) {
          EXPECT_EQ(have.tops[t][k].token, want.top_logprobs[t][k].token);
          EXPECT_EQ(have.tops[t][k].logprob, want.top_logprobs[t][k].logprob);
        }
      }
    }
  }
  EXPECT_EQ(e.result(aborted).completions.at(0).reason, finish_reason::aborted);
  EXPECT_GE(e.result(aborted).completions.at(0).tokens.size(), 1u);
  EXPECT_EQ(got.size(), 4u);
}

TEST(engine_api, forget_drops_only_finished_results) {
  engine e(model().config, model().weights, nullptr, small_options());
  const auto id = e.add_request(prompts()[0], greedy(4));
  EXPECT_FALSE(e.forget(id));  // not finished: kept
  e.run();
  EXPECT_EQ(e.result(id).completions.at(0).tokens.size(), 4u);
  EXPECT_TRUE(e.forget(id));
  EXPECT_FALSE(e.forget(id));
  EXPECT_FALSE(e.forget(12345));
  EXPECT_THROW((void)e.result(id), pagedkv::error);
}

TEST(engine_api, abort_and_bad_requests) {
  engine e(model().config, model().weights, nullptr, small_options());
  const auto kept = e.add_request(prompts()[0], greedy());
  const auto dropped = e.add_request(prompts()[1], greedy());
  e.step();
  EXPECT_TRUE(e.abort(dropped));
  EXPECT_FALSE(e.abort(dropped));
  e.run();
  EXPECT_TRUE(e.result(dropped).finished);
  ASSERT_EQ(e.result(dropped).completions.size(), 1u);
  EXPECT_EQ(e.result(dropped).completions[0].reason, finish_reason::aborted);
  EXPECT_EQ(e.result(kept).completions[0].reason, finish_reason::length);
  EXPECT_THROW(e.add_request({}, greedy()), pagedkv::error);
  EXPECT_THROW(e.add_request({1000}, greedy()), pagedkv::error);
  EXPECT_THROW(e.add_request({1}, {.stop = {"x"}}), pagedkv::error);  // no tokenizer
  EXPECT_THROW((void)e.result(999), pagedkv::error);
}

TEST(engine_api, a_prompt_larger_than_the_pool_is_rejected) {
  engine_options o = small_options();
  o.num_blocks = 2;
  engine e(model().config, model().weights, nullptr, o);
  const auto id = e.add_request(prompts()[2], greedy());
  e.run();
  EXPECT_TRUE(e.result(id).rejected);
  EXPECT_TRUE(e.result(id).completions.empty());
}

// A group that fits at admission but outgrows the pool running alone is rejected mid-generation;
// each sample keeps the tokens it generated, marked rejected, so that a caller can still show them.
TEST(engine_api, a_request_outgrowing_the_pool_keeps_what_it_generated) {
  engine_options o = small_options();  // 4-token blocks
  o.num_blocks = 5;
  engine e(model().config, model().weights, nullptr, o);
  const auto id = e.add_request(prompts()[0], {.max_tokens = 12, .n = 2});  // 7 + 12 tokens a sample
  e.run();
  const request_result& r = e.result(id);
  EXPECT_TRUE(r.rejected);
  ASSERT_EQ(r.completions.size(), 2u);
  for (const completion& c : r.completions) {
    EXPECT_EQ(c.reason, finish_reason::rejected);
    EXPECT_GE(c.tokens.size(), 1u);
    EXPECT_LT(c.tokens.size(), 12u);
  }
}

// kv_usage() is the manager's usage of the engine's own pool, under either preemption mode: blocks
// in use while a request runs, none once it is done, and the hit rate of a second prompt that
// shares the first one's full blocks.
TEST(engine_api, kv_usage_follows_the_requests) {
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap})
  for (const bool async : {false, true}) {
    engine_options o = small_options();  // 4-token blocks
    o.preemption = mode;
    o.async_scheduling = async;
    engine e(model().config, model().weights, nullptr, o);
    pagedkv::kv_cache_usage u = e.kv_usage();
    EXPECT_EQ(u.num_blocks, o.num_blocks);
    EXPECT_EQ(u.num_free_blocks, o.num_blocks);
    EXPECT_EQ(u.num_used_blocks, 0);
    EXPECT_EQ(u.prefix_hit_rate, 0.0);

    std::vector<token_id> prompt = random_prompt(7, 13);
    const auto first = e.add_request(prompt, greedy(5));
    // The prompt's 13 tokens in 4 blocks; the sampled token gets its slot when the next step is
    // planned: after step() returns, synchronously, or before, with the next step launched ahead.
    ASSERT_TRUE(e.step());
    u = e.kv_usage();
    const std::int32_t live = async ? 14 : 13;
    EXPECT_EQ(u.num_used_blocks, 4);
    EXPECT_EQ(u.num_live_tokens, live);
    EXPECT_DOUBLE_EQ(u.utilization, live / 16.0);
    EXPECT_EQ(u.num_free_blocks, o.num_blocks - 4);
    e.run();
    u = e.kv_usage();
    EXPECT_EQ(u.num_used_blocks, 0);
    EXPECT_GE(u.num_cached_blocks, 3);  // the prompt's full blocks stay cached
    EXPECT_EQ(u.prefix_hit_rate, 0.0);

    prompt.back() = (prompt.back() + 1) % token_id(model().config.vocab_size);  // same first 12 tokens
    const auto second = e.add_request(prompt, greedy(5));
    e.run();
    const std::int32_t cached = e.result(second).num_cached_prompt_tokens;
    EXPECT_EQ(cached, 12);
    EXPECT_EQ(e.result(first).num_cached_prompt_tokens, 0);
    EXPECT_DOUBLE_EQ(e.kv_usage().prefix_hit_rate, 12.0 / 26.0);
  }
}

}  // namespace
