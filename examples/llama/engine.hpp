// The serving engine, an executor: pagedkv::scheduler plans each step (continuous batching,
// chunked prefill, prefix caching, preemption, forks for n > 1 and beams), a model backend
// (model_backend.hpp) runs the plan over its paged KV cache and samples the logits as each request
// asks (sampling.hpp), and the engine turns the chosen tokens into each sequence's continuation. Nothing here knows which backend runs.
//
//   engine e(make_model_backend(config, weights, {.device = "cpu"}), &tok, {});
//   const request_id id = e.add_request(prompt_ids, {.max_tokens = 64});
//   e.on_stream([](const stream_event& ev) { std::cout << ev.text << std::flush; });
//   while (e.has_unfinished()) e.step();
//   e.result(id).completions[0].text;
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/scheduler_policy.hpp>

#include "engine_types.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model_backend.hpp"
#include "sampling_params.hpp"
#include "tokenizer.hpp"

namespace pagedkv::llama {

struct engine_options {
  std::int32_t block_size = 16;           ///< tokens per KV block: the scheduler's, which the backend's pools take
  std::int32_t num_blocks = 256;          ///< device KV pool, in blocks
  std::int32_t num_host_blocks = 0;       ///< host pool for swap preemption; 0: as many as num_blocks
  bool enable_prefix_caching = true;
  bool enable_partial_reuse = true;       ///< prefix hits below a block, by copying (kv_cache_options)
  preemption_mode preemption = preemption_mode::recompute;
  std::int32_t max_tokens_per_step = 512; ///< token budget of one step; smaller chunks long prompts
  std::int32_t max_num_seqs = 64;
  token_id eos_id = -1;                   ///< -1: the tokenizer's EOS, or none without a tokenizer
  /// Plans step t+1 while the backend runs step t, where step t allows it (docs/design.md,
  /// "Asynchronous scheduling"): its sequences continue from t's tokens where they were drawn;
  /// a token drawn for a sequence that t's tokens end is discarded. Off: every step is planned
  /// after the previous one's tokens are applied.
  bool async_scheduling = true;
  /// A model with sliding windows runs on hybrid_kv_cache_manager, a KV cache group per window:
  /// on, a group releases the blocks that fell wholly out of its window; off, it keeps every
  /// block (the same tokens, to measure what freeing saves).
  bool free_outside_window = true;
};

/// What the engine's steps ran, summed since it was made: what the plans asked of the backend.
struct engine_stats {
  std::int64_t num_steps = 0;               ///< steps that ran a forward
  std::int64_t num_prefill_chunks = 0;      ///< request_result::num_prefill_chunks, over all requests
  std::int32_t max_seqs_per_step = 0;       ///< the most sequences one forward ran
  std::int64_t num_copied_blocks = 0;       ///< copy-on-write copies
  std::int64_t num_swapped_out_blocks = 0;  ///< device -> host
  std::int64_t num_swapped_in_blocks = 0;   ///< host -> device
  // The last step's forward, for per-step figures (a benchmark's decode step time and roofline):
  std::int32_t last_step_seqs = 0;          ///< sequences it ran
  std::int32_t last_step_tokens = 0;        ///< tokens it computed
  std::int64_t last_step_kv_tokens = 0;     ///< tokens whose K/V its attention read, over its sequences
  bool last_step_decode_only = false;       ///< every sequence computed one token
  std::int64_t num_async_steps = 0;         ///< steps planned and launched before the previous step's tokens were known
  std::int64_t num_discarded_tokens = 0;    ///< tokens drawn, by such a step, for sequences that had ended
};

class engine {
  // For a model with sliding windows (model_backend::kv_cache_groups): the same scheduler over KV
  // cache groups, whose plans differ only in num_groups. sched(f) calls f on the one in use.
  using hybrid_scheduler_type = scheduler<fcfs_admission, preempt_by_swap, hybrid_kv_cache_manager<>>;
  using scheduler_variant = std::variant<scheduler<fcfs_admission, preempt_by_swap>, hybrid_scheduler_type>;
  template <class F>
  decltype(auto) sched(F&& f) {
    return std::visit(std::forward<F>(f), scheduler_);
  }
  template <class F>
  decltype(auto) sched(F&& f) const {
    return std::visit(std::forward<F>(f), scheduler_);
  }

 public:
  /// Runs `backend`, whose KV pools it allocates for the options. `tok` may be null (no text, no
  /// stop strings) and must outlive the engine. Throws pagedkv::error (invalid_argument) on bad
  /// options or a null backend.
  engine(std::unique_ptr<model_backend> backend, const tokenizer* tok, const engine_options& options);
  /// The same over make_model_backend(config, weights): the default backend_options' device.
  /// config and weights must outlive the engine.
  engine(const llama_config& config, const llama_weights& weights, const tokenizer* tok, const engine_options& options);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Queues a request; returns its id. Throws pagedkv::error (invalid_argument) naming the bad
  /// parameter: an empty prompt, a token outside the vocabulary, stop strings without a tokenizer.
  request_id add_request(std::vector<token_id> prompt, const sampling_params& params);
  /// Runs one step: plans it, runs the forward, samples, applies the tokens. With
  /// async_scheduling, the step whose tokens it applies was launched by the call before, and it
  /// launches the next before applying them. Returns false when nothing was left to run.
  bool step();
  /// Steps until every request has finished.
  void run();
  /// Ends a request now; its completions so far are kept. False for an unknown or finished id.
  bool abort(request_id id);
  void on_stream(std::function<void(const stream_event&)> callback) { stream_ = std::move(callback); }
  /// Called with each token a sample generates, as it is sampled (beam search's tokens are chosen
  /// at its end, so none): what time-to-first-token and time-per-output-token hang on.
  void on_token(std::function<void(request_id, std::int32_t sample, token_id)> callback) { token_ = std::move(callback); }

  [[nodiscard]] bool has_unfinished() const;
  /// Throws pagedkv::error (unknown_sequence) for an id never added.
  [[nodiscard]] const request_result& result(request_id id) const;
  /// Drops a finished request's result, which the engine keeps until then (a server that runs for
  /// days forgets each result once delivered). False, and nothing changes, for an id that is
  /// unknown, already forgotten or not finished.
  bool forget(request_id id);
  [[nodiscard]] std::int64_t num_preemptions() const;
  /// Requests the scheduler runs (swapped-out ones included) and those waiting for admission.
  [[nodiscard]] std::int64_t num_running() const noexcept {
    return sched([](const auto& s) { return std::int64_t(s.num_running() + s.num_swapped()); });
  }
  [[nodiscard]] std::int64_t num_waiting() const noexcept {
    return sched([](const auto& s) { return std::int64_t(s.num_waiting()); });
  }
  /// The device KV pool now (kv_cache_manager::usage): blocks in use, slot fill, and the prefix
  /// cache's hit rate over every prompt allocated so far. Costs a pass over the pool's blocks.
  [[nodiscard]] kv_cache_usage kv_usage() const;
  /// The prefix cache's lookups of every prompt allocated so far: tokens served, and the others
  /// by miss reason (kv_cache_manager::miss_totals).
  [[nodiscard]] const prefix_lookup& prefix_misses() const noexcept {
    return sched([](const auto& s) -> const prefix_lookup& { return s.miss_totals(); });
  }
  /// The eviction policy that miss_reason::evicted blames.
  [[nodiscard]] static constexpr std::string_view eviction_name() noexcept {
    return scheduler_type::manager_type::eviction_name();
  }
  [[nodiscard]] const engine_options& options() const noexcept { return options_; }
  [[nodiscard]] const engine_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const model_backend& backend() const noexcept { return *backend_; }

 private:
  struct track;
  struct request;
  // One scheduler for both modes: under recompute it gets no host pool, and preempt_by_swap falls
  // back to recompute for a group the host pool cannot take (test_scheduler:
  // SwapWithoutAHostPoolPreemptsByRecompute).
  using scheduler_type = scheduler<fcfs_admission, preempt_by_swap>;

  struct launched_step;
  /// A sequence whose token of the step in flight is a stand-in until that step is collected.
  struct pending_token {
    request_id request = 0;
    seq_id seq = 0;
    std::int32_t position = 0;  ///< in the sequence's history
    std::int32_t draw = 0;      ///< index among the step's draws
  };

  static_assert(scheduler_type::manager_type::eviction_name() == hybrid_scheduler_type::manager_type::eviction_name());
  static scheduler_variant make_scheduler(const model_backend* backend, const engine_options& options);
  void record(const step_plan& plan);
  void finish_rejected(const std::vector<request_id>& rejected);
  std::unique_ptr<launched_step> launch(step_plan plan);
  [[nodiscard]] bool can_plan_ahead(const launched_step& s) const;
  std::unique_ptr<launched_step> plan_ahead(launched_step& s, std::vector<request_id>& rejected);
  void collect(launched_step& s, const launched_step* next);
  [[nodiscard]] sampling_batch sampling_of(const step_plan& plan,
                                           const std::unordered_map<seq_id, const pending_token*>& pending) const;
  std::vector<continuation> sample(const sampling_request& req);
  std::vector<continuation> sample_beams(request& r, const sampling_request& req);
  void extend(request& r, track& t, token_id token, double logprob);
  void finish(request& r, track t, finish_reason reason);
  void emit(request& r, track& t, bool final_flush);
  static void release(const request& r, track& t, stream_event& ev);
  void finalize(request_id id);

  std::unique_ptr<model_backend> backend_;
  const tokenizer* tok_;
  engine_options options_;
  scheduler_variant scheduler_;
  std::unordered_map<request_id, std::unique_ptr<request>> requests_;
  std::unordered_map<request_id, request_result> results_;
  std::function<void(const stream_event&)> stream_;
  std::function<void(request_id, std::int32_t, token_id)> token_;
  request_id next_id_ = 1;
  engine_stats stats_;
  std::unique_ptr<launched_step> in_flight_;  // launched, not collected
  std::vector<pending_token> pending_;        // of the step in flight, while the next is planned
};

}  // namespace pagedkv::llama
