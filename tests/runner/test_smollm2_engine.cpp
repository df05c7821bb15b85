// The engine on the real SmolLM2-135M-Instruct: a chat answer that names Paris, and the greedy
// answer unchanged by batching, chunked prefill, a tiny pool (preemption) and n = 2, each shown to
// have run by the engine's stats. Streaming concatenates to the completion's text; a stop string
// ends it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine.hpp"
#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "tokenizer.hpp"

namespace {

using namespace pagedkv::llama;
using pagedkv::token_id;

struct smollm2 {
  gguf_file file = gguf_file::open(PAGEDKV_SMOLLM2_PATH);
  llama_config config = config_from_gguf(file);
  llama_weights weights = load_llama_weights(file, config);
  tokenizer tok = tokenizer::from_gguf(file);

  [[nodiscard]] std::vector<token_id> chat(const std::string& question) const {
    const std::vector<chat_message> messages = {{"user", question}};
    return tok.encode(format_chatml(messages));
  }
};

const smollm2& model() {
  static const smollm2 m;
  return m;
}

constexpr std::int32_t answer_tokens = 12;   // "The capital of France is Paris." and a little more
constexpr std::int32_t invariant_tokens = 8;  // enough to differ anywhere a cache bug would show; keeps CI short

engine_options options() {
  engine_options o;
  o.num_blocks = 64;
  return o;
}

std::vector<std::vector<token_id>> answers(const engine_options& o, const std::vector<std::vector<token_id>>& prompts,
                                           const sampling_params& params, std::int64_t* preemptions = nullptr,
                                           engine_stats* stats = nullptr) {
  engine e(model().config, model().weights, &model().tok, o);
  std::vector<pagedkv::request_id> ids;
  for (const auto& p : prompts) ids.push_back(e.add_request(p, params));
  e.run();
  std::vector<std::vector<token_id>> out;
  for (const auto id : ids)
    for (const completion& c : e.result(id).completions) out.push_back(c.tokens);
  if (preemptions) *preemptions = e.num_preemptions();
  if (stats) *stats = e.stats();
  return out;
}

TEST(smollm2_engine, answers_a_chat_question_and_streams_it) {
  engine e(model().config, model().weights, &model().tok, options());
  std::string streamed;
  bool ended = false;
  e.on_stream([&](const stream_event& ev) {
    streamed += ev.text;
    ended = ended || ev.finished != finish_reason::none;
  });
  const auto id = e.add_request(model().chat("What is the capital of France?"), {.max_tokens = answer_tokens});
  e.run();
  const completion& c = e.result(id).completions.at(0);
  EXPECT_NE(c.text.find("Paris"), std::string::npos) << c.text;
  EXPECT_EQ(streamed, c.text);
  EXPECT_TRUE(ended);
}

TEST(smollm2_engine, stop_string_ends_the_text_before_it) {
  engine e(model().config, model().weights, &model().tok, options());
  std::string streamed;
  std::vector<token_id> streamed_tokens;  // each released once: with the text it completes, or at the end
  e.on_stream([&](const stream_event& ev) {
    streamed += ev.text;
    streamed_tokens.insert(streamed_tokens.end(), ev.tokens.begin(), ev.tokens.end());
  });
  const auto id = e.add_request(model().chat("What is the capital of France?"),
                                {.max_tokens = answer_tokens, .stop = {"Paris"}});
  e.run();
  const completion& c = e.result(id).completions.at(0);
  EXPECT_EQ(c.reason, finish_reason::stop_string);
  EXPECT_EQ(c.text.find("Paris"), std::string::npos);
  EXPECT_EQ(streamed, c.text);
  EXPECT_EQ(streamed_tokens, c.tokens);  // the stop string's tokens too, past the text
}

TEST(smollm2_engine, greedy_answer_is_invariant) {
  const std::vector<token_id> france = model().chat("What is the capital of France?");
  const std::vector<token_id> other = model().chat("Name three colors.");
  const sampling_params greedy{.max_tokens = invariant_tokens, .ignore_eos = true};
  const auto alone = answers(options(), {france}, greedy);
  ASSERT_EQ(alone.size(), 1u);
  ASSERT_EQ(alone[0].size(), std::size_t(invariant_tokens));

  engine_stats stats;
  EXPECT_EQ(answers(options(), {other, france}, greedy, nullptr, &stats)[1], alone[0]) << "batched";
  EXPECT_EQ(stats.max_seqs_per_step, 2);

  engine_options chunked = options();
  chunked.max_tokens_per_step = 7;
  EXPECT_EQ(answers(chunked, {france, other}, greedy, nullptr, &stats)[0], alone[0]) << "chunked prefill";
  // The first prompt in chunks of at most 7 tokens; the second hits the cached system prompt.
  EXPECT_GE(stats.num_prefill_chunks, std::int64_t((france.size() + 6) / 7) + 1) << "chunks";

  engine_options tiny = options();
  tiny.block_size = 8;
  // Both 37-token prompts are admitted (5 blocks each) but cannot both grow to 45 tokens (6 each);
  // admitted in one step, they share the full blocks of their common chat-template prefix.
  const auto common = std::mismatch(france.begin(), france.end(), other.begin(), other.end()).first - france.begin();
  tiny.num_blocks = 11 - std::int32_t(common / tiny.block_size);
  std::int64_t preemptions = 0;
  EXPECT_EQ(answers(tiny, {other, france}, greedy, &preemptions)[1], alone[0]) << "preemption";
  EXPECT_GT(preemptions, 0);

  sampling_params two = greedy;
  two.n = 2;
  const auto both = answers(options(), {france}, two, nullptr, &stats);
  EXPECT_EQ(stats.num_prefill_chunks, 1) << "the samples share one prefill";
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0], alone[0]);
  EXPECT_EQ(both[1], alone[0]);
}

}  // namespace
