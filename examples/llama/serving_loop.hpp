// The threading contract of `pagedkv-llama serve`: one engine thread owns the engine and runs its
// steps; any number of client threads (the HTTP handlers) submit requests and read each request's
// stream through a request_stream, a mutex + condition variable queue of its text chunks.
//
//   serving_loop<engine> loop(e, {.max_queued_requests = 64});
//   std::shared_ptr<request_stream> s = loop.submit(prompt_ids, params);  // throws queue_full
//   stream_chunk chunk;
//   while (s->next(chunk, 100ms) != stream_status::finished) ... send chunk.text ...;
//   loop.cancel(s);  // the client hung up: the engine thread aborts it, its blocks return to the pool
//   loop.drain(10s);  // SIGTERM: refuse new requests, let those in flight finish, abort the rest
//
// Nothing but the engine thread touches the engine: submit and cancel queue commands that it
// applies between steps, and the metrics are a snapshot it publishes after each step. A finished
// request's result moves into its stream and the engine forgets it, so memory stays bounded by the
// requests in flight (and the streams their clients still hold). A template
// over the engine so that tests/core runs the contract under TSan with a fake engine, where the
// TSan build has no examples. The Engine must provide what `serving_engine` names.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <pagedkv/kv_cache_manager.hpp>

#include "engine_types.hpp"
#include "sampling_params.hpp"

namespace pagedkv::llama {

/// What serving_loop needs of an engine: engine.hpp's members of the same names.
template <class Engine>
concept serving_engine = requires(Engine& e, const Engine& ce, std::vector<token_id> prompt, const sampling_params& p,
                                  request_id id, std::function<void(const stream_event&)> callback) {
  { e.add_request(std::move(prompt), p) } -> std::same_as<request_id>;
  { e.step() } -> std::same_as<bool>;
  { e.abort(id) } -> std::same_as<bool>;
  { e.forget(id) } -> std::same_as<bool>;
  e.on_stream(std::move(callback));
  e.on_token(std::function<void(request_id, std::int32_t, token_id)>{});
  { ce.has_unfinished() } -> std::same_as<bool>;
  { ce.result(id) } -> std::convertible_to<const request_result&>;
  { ce.num_running() } -> std::convertible_to<std::int64_t>;
  { ce.num_waiting() } -> std::convertible_to<std::int64_t>;
  { ce.num_preemptions() } -> std::convertible_to<std::int64_t>;
  { ce.kv_usage() } -> std::same_as<kv_cache_usage>;
};

/// New text of one sample, or its end (finished != none), with the tokens it releases
/// (stream_event's: each token of the sample once over its chunks).
struct stream_chunk {
  std::int32_t sample = 0;
  std::string text{};
  finish_reason finished = finish_reason::none;
  std::vector<token_id> tokens{};
  std::vector<double> token_logprobs{};
  std::vector<std::vector<token_logprob>> top_logprobs{};
};

enum class stream_status { chunk, finished, timeout };

/// A Prometheus histogram of seconds: cumulative counts at fixed upper bounds, their sum and count.
template <std::size_t N>
struct latency_histogram {
  std::array<double, N> upper_bounds_s{};  ///< ascending; +Inf is implied
  std::array<std::int64_t, N> counts{};    ///< observations <= each bound (cumulative)
  double sum_s = 0.0;
  std::int64_t count = 0;

  void observe(double seconds) {
    for (std::size_t i = 0; i < N; ++i) counts[i] += seconds <= upper_bounds_s[i] ? 1 : 0;
    sum_s += seconds;
    ++count;
  }
};

// vLLM's buckets, so that dashboards made for it read these.
using ttft_histogram = latency_histogram<19>;
using tpot_histogram = latency_histogram<19>;
inline constexpr std::array<double, 19> ttft_bounds_s = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                                         0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
inline constexpr std::array<double, 19> tpot_bounds_s = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};

/// What the engine thread last published: for GET /metrics.
struct serving_metrics {
  std::int64_t num_running = 0;   ///< requests the engine's scheduler runs (or holds swapped out)
  std::int64_t num_waiting = 0;   ///< requests submitted and not yet running
  std::int64_t num_preemptions = 0;
  std::int64_t num_finished = 0;  ///< requests whose stream has finished, aborted ones included
  std::int64_t num_aborted = 0;   ///< of those, ended by cancel() or by the loop stopping
  kv_cache_usage kv{};
  /// Time to first token: from submit() to the step that sampled the request's first token.
  ttft_histogram ttft{.upper_bounds_s = ttft_bounds_s};
  /// Time per output token: between successive steps that sampled a request's tokens (one
  /// observation a step, however many samples it has).
  tpot_histogram tpot{.upper_bounds_s = tpot_bounds_s};
};

/// submit() when max_queued_requests are already in flight: HTTP 429.
class queue_full : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// submit() once drain() has begun: HTTP 503.
class server_stopping : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One request's handoff: the engine thread pushes chunks and then the result; one reader thread
/// takes them. Shared by both sides through a shared_ptr, so a reader that leaves early is safe.
class request_stream {
 public:
  /// Blocks up to `timeout` for the next chunk. chunk: `out` holds it; finished: every chunk has
  /// been read and result() is ready; timeout: neither yet.
  stream_status next(stream_chunk& out, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !chunks_.empty() || done_; })) return stream_status::timeout;
    if (chunks_.empty()) return stream_status::finished;
    out = std::move(chunks_.front());
    chunks_.pop_front();
    return stream_status::chunk;
  }
  /// Blocks until the request has finished (its chunks are left unread).
  void wait() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return done_; });
  }
  /// After finished: the engine's result, or, where the engine refused the request, nullopt and error().
  [[nodiscard]] std::optional<request_result> result() const {
    std::lock_guard lock(mutex_);
    return result_;
  }
  [[nodiscard]] std::string error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }
  [[nodiscard]] bool finished() const {
    std::lock_guard lock(mutex_);
    return done_;
  }

  // The engine thread's side.
  void push(stream_chunk chunk) {
    {
      std::lock_guard lock(mutex_);
      chunks_.push_back(std::move(chunk));
    }
    ready_.notify_all();
  }
  void finish(std::optional<request_result> result, std::string error) {
    {
      std::lock_guard lock(mutex_);
      result_ = std::move(result);
      error_ = std::move(error);
      done_ = true;
    }
    ready_.notify_all();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<stream_chunk> chunks_;
  std::optional<request_result> result_;
  std::string error_;
  bool done_ = false;
};

struct serving_loop_options {
  /// Requests submitted and not yet finished; one more is refused with queue_full. Bounds the
  /// memory and the handler threads that waiting clients hold.
  std::int32_t max_queued_requests = 64;
};

template <serving_engine Engine>
class serving_loop {
 public:
  /// Starts the engine thread. From now on only that thread touches `engine`, until the loop is
  /// destroyed; `engine` must outlive the loop.
  serving_loop(Engine& engine, serving_loop_options options) : engine_(engine), options_(options) {
    engine_.on_stream([this](const stream_event& ev) {
      const auto it = active_.find(ev.request);
      if (it == active_.end()) return;
      if (!ev.text.empty() || !ev.tokens.empty() || ev.finished != finish_reason::none)
        it->second.stream->push({.sample = ev.sample, .text = ev.text, .finished = ev.finished, .tokens = ev.tokens,
                                 .token_logprobs = ev.token_logprobs, .top_logprobs = ev.top_logprobs});
    });
    engine_.on_token([this](request_id id, std::int32_t, token_id) {
      const auto it = active_.find(id);
      if (it == active_.end() || it->second.last_token_step == steps_) return;  // this step is counted
      const auto now = std::chrono::steady_clock::now();
      const double since = std::chrono::duration<double>(now - it->second.last_token_time).count();
      (it->second.last_token_step < 0 ? ttft_ : tpot_).observe(since);
      it->second.last_token_step = steps_;
      it->second.last_token_time = now;
    });
    publish();
    thread_ = std::thread([this] { run(); });
  }
  /// Stops the engine thread: requests still in flight end as aborted.
  ~serving_loop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    thread_.join();
  }
  serving_loop(const serving_loop&) = delete;
  serving_loop& operator=(const serving_loop&) = delete;

  /// Queues a request for the engine thread. Throws queue_full when max_queued_requests are in
  /// flight. The engine's own refusal (a bad parameter) comes back as the stream's error().
  std::shared_ptr<request_stream> submit(std::vector<token_id> prompt, sampling_params params) {
    auto stream = std::make_shared<request_stream>();
    {
      std::lock_guard lock(mutex_);
      if (draining_ || stopping_) throw server_stopping("the server is stopping");
      if (in_flight_ >= options_.max_queued_requests)
        throw queue_full("the server holds " + std::to_string(in_flight_) + " requests, its limit (--max-queued-requests " +
                         std::to_string(options_.max_queued_requests) + "): try again later");
      ++in_flight_;
      ++metrics_.num_waiting;  // until the engine thread publishes again
      commands_.push_back(add_command{stream, std::move(prompt), std::move(params), std::chrono::steady_clock::now()});
    }
    work_.notify_all();
    return stream;
  }
  /// Asks the engine thread to abort the request (a no-op once it finished): its blocks return to
  /// the pool before the next step, and its stream finishes with reason aborted.
  void cancel(const std::shared_ptr<request_stream>& stream) {
    {
      std::lock_guard lock(mutex_);
      commands_.push_back(abort_command{stream});
    }
    work_.notify_all();
  }
  /// Refuses new requests from now on (submit throws server_stopping), waits up to `timeout` for
  /// those in flight to finish, then aborts the rest and waits until their streams have finished.
  /// Returns how many were still in flight at the timeout: those it aborted.
  std::int32_t drain(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    draining_ = true;
    if (idle_.wait_for(lock, timeout, [&] { return in_flight_ == 0; })) return 0;
    const std::int32_t left = in_flight_;
    commands_.push_back(abort_all_command{});
    work_.notify_all();
    idle_.wait(lock, [&] { return in_flight_ == 0; });
    return left;
  }
  /// drain() has begun (or the loop is being destroyed): submit() refuses from now on.
  [[nodiscard]] bool stopping() const {
    std::lock_guard lock(mutex_);
    return draining_ || stopping_;
  }
  [[nodiscard]] serving_metrics metrics() const {
    std::lock_guard lock(mutex_);
    return metrics_;
  }

 private:
  struct add_command {
    std::shared_ptr<request_stream> stream;
    std::vector<token_id> prompt;
    sampling_params params;
    std::chrono::steady_clock::time_point submitted;
  };
  struct abort_command {
    std::shared_ptr<request_stream> stream;
  };
  struct abort_all_command {};
  using command = std::variant<add_command, abort_command, abort_all_command>;
  /// A request the engine runs, as the engine thread sees it.
  struct active_request {
    std::shared_ptr<request_stream> stream;
    std::chrono::steady_clock::time_point last_token_time;  ///< submit() until the first token
    std::int64_t last_token_step = -1;                      ///< -1: no token yet
  };

  void run() {
    bool busy = false;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || busy || !commands_.empty(); });
      if (stopping_) break;
      std::vector<command> commands(std::make_move_iterator(commands_.begin()), std::make_move_iterator(commands_.end()));
      commands_.clear();
      lock.unlock();
      for (command& c : commands) std::visit([&](auto& cmd) { apply(cmd); }, c);
      if (engine_.has_unfinished()) {
        engine_.step();
        ++steps_;
      }
      deliver_finished();
      busy = engine_.has_unfinished();
      publish();
      lock.lock();
    }
    // Stopping: what was queued and what runs ends as aborted.
    std::vector<command> commands(std::make_move_iterator(commands_.begin()), std::make_move_iterator(commands_.end()));
    commands_.clear();
    lock.unlock();
    for (command& c : commands) std::visit([&](auto& cmd) { apply(cmd); }, c);
    abort_all();
    publish();
  }

  void abort_all() {
    std::vector<request_id> running;
    for (const auto& entry : active_) running.push_back(entry.first);
    for (const request_id id : running)
      if (engine_.abort(id)) ++aborted_;
    deliver_finished();
  }

  void apply(add_command& cmd) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        ++aborted_;
        release(*cmd.stream, std::nullopt, "the server is stopping");
        return;
      }
    }
    try {
      const request_id id = engine_.add_request(std::move(cmd.prompt), cmd.params);
      active_.emplace(id, active_request{.stream = cmd.stream, .last_token_time = cmd.submitted});
      ids_.emplace(cmd.stream.get(), id);
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      release(*cmd.stream, std::nullopt, e.what());
    }
  }
  void apply(abort_command& cmd) {
    const auto it = ids_.find(cmd.stream.get());
    if (it == ids_.end()) return;  // finished, or refused, before the abort came
    if (engine_.abort(it->second)) ++aborted_;
    deliver_finished();
  }
  void apply(abort_all_command&) { abort_all(); }

  /// Finishes the streams of requests the engine has finished, moving each result out of the engine.
  void deliver_finished() {
    for (auto it = active_.begin(); it != active_.end();) {
      if (!engine_.result(it->first).finished) {
        ++it;
        continue;
      }
      request_result result = engine_.result(it->first);
      engine_.forget(it->first);
      ids_.erase(it->second.stream.get());
      std::shared_ptr<request_stream> stream = std::move(it->second.stream);
      it = active_.erase(it);
      std::lock_guard lock(mutex_);
      release(*stream, std::move(result), {});
    }
  }
  /// Ends a stream and frees its place in the queue; mutex_ held.
  void release(request_stream& stream, std::optional<request_result> result, std::string error) {
    stream.finish(std::move(result), std::move(error));
    --in_flight_;
    ++finished_;
    if (in_flight_ == 0) idle_.notify_all();
  }
  void publish() {
    serving_metrics m{.num_running = std::int64_t(engine_.num_running()),
                      .num_waiting = std::int64_t(engine_.num_waiting()),
                      .num_preemptions = std::int64_t(engine_.num_preemptions()),
                      .num_finished = 0,
                      .num_aborted = aborted_,
                      .kv = engine_.kv_usage(),
                      .ttft = ttft_,
                      .tpot = tpot_};
    std::lock_guard lock(mutex_);
    m.num_finished = finished_;
    for (const command& c : commands_) m.num_waiting += std::holds_alternative<add_command>(c) ? 1 : 0;
    metrics_ = m;
  }

  Engine& engine_;
  serving_loop_options options_;
  // The engine thread's own: which stream each engine request feeds, and back.
  std::unordered_map<request_id, active_request> active_;
  std::unordered_map<const request_stream*, request_id> ids_;
  std::int64_t aborted_ = 0;
  std::int64_t steps_ = 0;
  ttft_histogram ttft_{.upper_bounds_s = ttft_bounds_s};
  tpot_histogram tpot_{.upper_bounds_s = tpot_bounds_s};
  // Shared, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable idle_;  // in_flight_ fell to 0
  std::deque<command> commands_;
  std::int32_t in_flight_ = 0;
  std::int64_t finished_ = 0;
  serving_metrics metrics_{};
  bool stopping_ = false;
  bool draining_ = false;
  std::thread thread_;  // last: started once everything above is built
};

}  // namespace pagedkv::llama
