// The threading contract of `pagedkv-llama serve` (examples/llama/serving_loop.hpp) over a fake
// engine: here rather than in tests/runner so that the TSan build, which leaves the examples (and
// so the model and the real engine) out, runs it where the client threads and the engine thread
// meet. The fake engine has no lock of its own, so TSan reports any touch from a client thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "serving_loop.hpp"

namespace {

using namespace std::chrono_literals;
using namespace pagedkv::llama;
using pagedkv::request_id;
using pagedkv::token_id;

/// Runs at most two requests at a time, first come first served; each step gives every running
/// request one token whose text is the letter of its first prompt token ('a' + t % 26). A request
/// holds one KV block per 4 tokens of prompt and output, so kv_usage shows what aborts free.
class fake_engine {
 public:
  request_id add_request(std::vector<token_id> prompt, const sampling_params& params) {
    if (prompt.empty()) throw std::invalid_argument("add_request: the prompt is empty");
    const request_id id = next_id_++;
    live_[id] = {.prompt_tokens = std::int64_t(prompt.size()), .letter = char('a' + prompt[0] % 26), .params = params};
    results_[id] = {};
    return id;
  }
  bool step() {
    std::this_thread::sleep_for(100us);  // a forward's time, so that clients read while it runs
    std::int32_t running = 0;
    std::vector<request_id> done;
    for (auto& [id, r] : live_) {
      if (running++ == max_running) break;
      r.output.tokens.push_back(token_id(r.letter));
      r.output.text += r.letter;
      if (token_) token_(id, 0, token_id(r.letter));
      if (stream_) stream_({.request = id, .sample = 0, .token = token_id(r.letter), .text = std::string(1, r.letter)});
      if (std::int32_t(r.output.tokens.size()) == r.params.max_tokens) done.push_back(id);
    }
    for (const request_id id : done) finish(id, finish_reason::length);
    return running > 0;
  }
  bool abort(request_id id) {
    if (!live_.contains(id)) return false;
    finish(id, finish_reason::aborted);
    return true;
  }
  bool forget(request_id id) {
    const auto it = results_.find(id);
    if (it == results_.end() || !it->second.finished) return false;
    results_.erase(it);
    return true;
  }
  void on_stream(std::function<void(const stream_event&)> callback) { stream_ = std::move(callback); }
  void on_token(std::function<void(request_id, std::int32_t, token_id)> callback) { token_ = std::move(callback); }
  /// Results the engine still keeps; for the test's thread once the loop is gone.
  [[nodiscard]] std::size_t num_results() const { return results_.size(); }
  [[nodiscard]] bool has_unfinished() const { return !live_.empty(); }
  [[nodiscard]] const request_result& result(request_id id) const { return results_.at(id); }
  [[nodiscard]] std::int64_t num_running() const { return std::min<std::int64_t>(max_running, std::int64_t(live_.size())); }
  [[nodiscard]] std::int64_t num_waiting() const { return std::int64_t(live_.size()) - num_running(); }
  [[nodiscard]] std::int64_t num_preemptions() const { return 0; }
  [[nodiscard]] pagedkv::kv_cache_usage kv_usage() const {
    pagedkv::kv_cache_usage usage{.num_blocks = 1000};
    std::int32_t running = 0;
    for (const auto& [id, r] : live_)
      if (running++ < max_running) usage.num_used_blocks += std::int32_t((r.prompt_tokens + std::int64_t(r.output.tokens.size()) + 3) / 4);
    usage.num_free_blocks = usage.num_blocks - usage.num_used_blocks;
    return usage;
  }

 private:
  static constexpr std::int32_t max_running = 2;
  struct live_request {
    std::int64_t prompt_tokens = 0;
    char letter = 'a';
    sampling_params params{};
    completion output{};
  };
  void finish(request_id id, finish_reason reason) {
    live_request& r = live_.at(id);
    r.output.reason = reason;
    if (stream_) stream_({.request = id, .sample = 0, .token = -1, .text = {}, .finished = reason});
    results_[id] = {.finished = true, .completions = {std::move(r.output)}};
    live_.erase(id);
  }

  std::map<request_id, live_request> live_;  // ordered: first come, first run
  std::map<request_id, request_result> results_;
  std::function<void(const stream_event&)> stream_;
  std::function<void(request_id, std::int32_t, token_id)> token_;
  request_id next_id_ = 1;
};
static_assert(serving_engine<fake_engine>);

/// Reads a stream to its end: its text and the finish reason its last chunk carried.
std::pair<std::string, finish_reason> read_all(request_stream& stream) {
  std::string text;
  finish_reason reason = finish_reason::none;
  stream_chunk chunk;
  for (stream_status s; (s = stream.next(chunk, 10ms)) != stream_status::finished;) {
    if (s != stream_status::chunk) continue;
    text += chunk.text;
    if (chunk.finished != finish_reason::none) reason = chunk.finished;
  }
  return {text, reason};
}

/// Polls the published metrics until `done` holds of them, for up to 5 s.
template <class Predicate>
serving_metrics wait_for_metrics(const serving_loop<fake_engine>& loop, Predicate done) {
  serving_metrics m = loop.metrics();
  for (int i = 0; i < 500 && !done(m); ++i) {
    std::this_thread::sleep_for(10ms);
    m = loop.metrics();
  }
  return m;
}

TEST(ServingLoop, ConcurrentClientsEachReadTheirOwnWholeStream) {
  fake_engine engine;
  serving_loop loop(engine, {.max_queued_requests = 16});
  constexpr int clients = 8;
  std::vector<std::string> texts(clients);
  std::vector<finish_reason> reasons(clients);
  std::vector<std::size_t> result_tokens(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      const std::shared_ptr<request_stream> s = loop.submit({token_id(c), 100, 101}, {.max_tokens = 5 + c});
      std::tie(texts[c], reasons[c]) = read_all(*s);
      result_tokens[c] = s->result()->completions.at(0).tokens.size();
    });
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < clients; ++c) {
    EXPECT_EQ(texts[c], std::string(std::size_t(5 + c), char('a' + c))) << "client " << c;
    EXPECT_EQ(reasons[c], finish_reason::length) << "client " << c;
    EXPECT_EQ(result_tokens[c], std::size_t(5 + c)) << "client " << c;
  }
  const serving_metrics m = wait_for_metrics(loop, [](const serving_metrics& m) { return m.num_finished == clients; });
  EXPECT_EQ(m.num_finished, clients);
  EXPECT_EQ(m.num_aborted, 0);
  EXPECT_EQ(m.num_running + m.num_waiting, 0);
  EXPECT_EQ(m.kv.num_used_blocks, 0);
}

TEST(ServingLoop, CancelMidStreamAbortsAndFreesTheBlocks) {
  fake_engine engine;
  serving_loop loop(engine, {.max_queued_requests = 4});
  const std::shared_ptr<request_stream> s = loop.submit(std::vector<token_id>(40, 3), {.max_tokens = 1 << 30});
  stream_chunk chunk;
  for (int read = 0; read < 3;)
    if (s->next(chunk, 1s) == stream_status::chunk) ++read;
  // Running with its 40 prompt tokens: at least 10 blocks.
  EXPECT_GE(wait_for_metrics(loop, [](const serving_metrics& m) { return m.kv.num_used_blocks >= 10; }).kv.num_used_blocks, 10);
  loop.cancel(s);
  const auto [text, reason] = read_all(*s);
  EXPECT_EQ(reason, finish_reason::aborted);
  EXPECT_EQ(s->result()->completions.at(0).reason, finish_reason::aborted);
  const serving_metrics m = wait_for_metrics(loop, [](const serving_metrics& m) { return m.num_finished == 1; });
  EXPECT_EQ(m.num_aborted, 1);
  EXPECT_EQ(m.kv.num_used_blocks, 0);
  EXPECT_EQ(m.num_running, 0);
  loop.cancel(s);  // again, once finished: nothing to do
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(loop.metrics().num_aborted, 1);
}

TEST(ServingLoop, AFullQueueRefusesUntilARequestFinishes) {
  fake_engine engine;
  serving_loop loop(engine, {.max_queued_requests = 3});
  std::vector<std::shared_ptr<request_stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(loop.submit({1}, {.max_tokens = 1 << 30}));
  EXPECT_THROW(loop.submit({1}, {.max_tokens = 1}), queue_full);
  // Two run, the third waits in the engine.
  const serving_metrics m = wait_for_metrics(loop, [](const serving_metrics& m) { return m.num_running == 2; });
  EXPECT_EQ(m.num_running, 2);
  EXPECT_EQ(m.num_waiting, 1);
  loop.cancel(streams[2]);
  streams[2]->wait();
  const std::shared_ptr<request_stream> next = loop.submit({1}, {.max_tokens = 1 << 30});
  EXPECT_THROW(loop.submit({1}, {.max_tokens = 1}), queue_full);
  EXPECT_FALSE(next->finished());
}

TEST(ServingLoop, TheEngineRefusalComesBackAsTheStreamError) {
  fake_engine engine;
  serving_loop loop(engine, {.max_queued_requests = 1});
  const std::shared_ptr<request_stream> s = loop.submit({}, {.max_tokens = 4});
  s->wait();
  EXPECT_FALSE(s->result().has_value());
  EXPECT_EQ(s->error(), "add_request: the prompt is empty");
  // Its place in the queue is free again.
  const std::shared_ptr<request_stream> ok = loop.submit({2}, {.max_tokens = 4});
  EXPECT_EQ(read_all(*ok).first, "cccc");
}

TEST(ServingLoop, StoppingAbortsWhatIsInFlight) {
  fake_engine engine;
  std::vector<std::shared_ptr<request_stream>> streams;
  {
    serving_loop loop(engine, {.max_queued_requests = 8});
    for (int i = 0; i < 5; ++i) streams.push_back(loop.submit({token_id(i)}, {.max_tokens = 1 << 30}));
  }
  for (const std::shared_ptr<request_stream>& s : streams) {
    ASSERT_TRUE(s->finished());
    // Aborted by the engine, or refused before it took the request.
    EXPECT_TRUE(s->result() ? s->result()->completions.at(0).reason == finish_reason::aborted
                            : s->error() == "the server is stopping");
  }
  EXPECT_FALSE(engine.has_unfinished());
}

TEST(ServingLoop, DeliveredResultsLeaveTheEngineAndTimesAreCounted) {
  fake_engine engine;
  {
    serving_loop loop(engine, {.max_queued_requests = 64});
    for (int round = 0; round < 50; ++round) {
      const std::shared_ptr<request_stream> s = loop.submit({token_id(round)}, {.max_tokens = 3});
      s->wait();
      ASSERT_EQ(s->result()->completions.at(0).tokens.size(), 3u);
    }
    const serving_metrics m = wait_for_metrics(loop, [](const serving_metrics& m) { return m.num_finished == 50; });
    // One first token a request, two later steps of one token each.
    EXPECT_EQ(m.ttft.count, 50);
    EXPECT_EQ(m.tpot.count, 100);
    EXPECT_EQ(m.ttft.counts.back(), 50);  // all within the last bound, 80 s
    EXPECT_GT(m.ttft.sum_s, 0.0);
    for (std::size_t i = 1; i < m.ttft.counts.size(); ++i) EXPECT_LE(m.ttft.counts[i - 1], m.ttft.counts[i]) << "cumulative";
  }
  EXPECT_EQ(engine.num_results(), 0u);  // every result moved to its stream and forgotten
}

TEST(ServingLoop, DrainLetsRequestsInFlightFinishAndRefusesNewOnes) {
  fake_engine engine;
  serving_loop loop(engine, {.max_queued_requests = 8});
  std::vector<std::shared_ptr<request_stream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(loop.submit({token_id(i)}, {.max_tokens = 20}));
  EXPECT_FALSE(loop.stopping());
  EXPECT_EQ(loop.drain(10s), 0);
  EXPECT_TRUE(loop.stopping());  // what /health reads
  for (const std::shared_ptr<request_stream>& s : streams) {
    ASSERT_TRUE(s->finished());
    EXPECT_EQ(s->result()->completions.at(0).reason, finish_reason::length);
  }
  EXPECT_THROW(loop.submit({1}, {.max_tokens = 1}), server_stopping);
}

TEST(ServingLoop, DrainAbortsWhatOutlivesTheTimeout) {
  fake_engine engine;
  serving_loop loop(engine, {.max_queued_requests = 8});
  std::vector<std::shared_ptr<request_stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(loop.submit({token_id(i)}, {.max_tokens = 1 << 30}));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(loop.drain(50ms), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (const std::shared_ptr<request_stream>& s : streams) {
    ASSERT_TRUE(s->finished());
    EXPECT_EQ(s->result()->completions.at(0).reason, finish_reason::aborted);
  }
  const serving_metrics m = wait_for_metrics(loop, [](const serving_metrics& m) { return m.num_aborted == 3; });
  EXPECT_EQ(m.num_aborted, 3);
  EXPECT_EQ(m.kv.num_used_blocks, 0);
}

}  // namespace
