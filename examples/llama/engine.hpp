// The serving engine: pagedkv::scheduler plans each step (continuous batching, chunked prefill,
// prefix caching, preemption, forks for n > 1 and beams), the CPU model runs it over the paged
// KV cache, and a sampler turns logits into each sequence's next token.
//
//   engine e(config, weights, &tok, {});
//   const request_id id = e.add_request(prompt_ids, {.max_tokens = 64});
//   e.on_stream([](const stream_event& ev) { std::cout << ev.text << std::flush; });
//   while (e.has_unfinished()) e.step();
//   e.result(id).completions[0].text;
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <pagedkv/scheduler.hpp>

#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model.hpp"
#include "tokenizer.hpp"

namespace pagedkv::llama {

struct sampling_params {
  std::int32_t max_tokens = 16;       ///< generated tokens per sample or beam
  float temperature = 0.0f;           ///< <= 0: greedy (argmax, lowest id on a tie)
  std::int32_t top_k = 0;             ///< keep the k most likely tokens; 0: all
  float top_p = 1.0f;                 ///< keep the smallest set whose probability reaches top_p
  std::uint64_t seed = 0;             ///< each request has its own generator seeded with this
  std::int32_t n = 1;                 ///< parallel samples sharing the prompt's blocks
  std::int32_t beam_width = 0;        ///< > 0: beam search of this width (n is ignored)
  std::vector<std::string> stop{};    ///< stop strings (need the engine's tokenizer); not in the text
  bool ignore_eos = false;
};

enum class preemption { recompute, swap };

struct engine_options {
  std::int32_t block_size = 16;
  std::int32_t num_blocks = 256;          ///< device KV pool, in blocks
  std::int32_t num_host_blocks = 0;       ///< host pool for swap preemption; 0: as many as num_blocks
  bool enable_prefix_caching = true;
  enum preemption preemption = preemption::recompute;
  std::int32_t max_tokens_per_step = 512; ///< token budget of one step; smaller chunks long prompts
  std::int32_t max_num_seqs = 64;
  token_id eos_id = -1;                   ///< -1: the tokenizer's EOS, or none without a tokenizer
};

enum class finish_reason { none, eos, length, stop_string, aborted, rejected };
std::string_view to_string(finish_reason reason) noexcept;

struct completion {
  std::vector<token_id> tokens{};  ///< generated ids, the EOS included when it ended the sample
  std::string text{};              ///< their text (empty without a tokenizer), without EOS or stop string
  double logprob = 0.0;            ///< sum of the chosen tokens' log-probabilities (temperature 1)
  finish_reason reason = finish_reason::none;
};

struct request_result {
  bool finished = false;
  /// The request can never fit in the KV pool: its prompt at admission, or, running alone, its
  /// samples outgrew the pool; completions then keep what was generated, with reason `rejected`.
  bool rejected = false;
  std::vector<completion> completions{};  ///< n samples in index order, or beams best first
  std::int32_t num_preemptions = 0;
  std::int32_t num_cached_prompt_tokens = 0;
};

/// What the stream callback gets: new text of one sample, or its end.
struct stream_event {
  request_id request = 0;
  std::int32_t sample = 0;   ///< sample index 0..n-1 (beam search streams only its final beams)
  token_id token = -1;       ///< the token that produced this event, -1 for a final flush
  std::string text{};        ///< newly complete text (whole UTF-8 characters), possibly empty
  finish_reason finished = finish_reason::none;
};

class engine {
 public:
  /// `tok` may be null (no text, no stop strings); config, weights and tok must outlive the engine.
  /// Throws pagedkv::error (invalid_argument) on bad options.
  engine(const llama_config& config, const llama_weights& weights, const tokenizer* tok, const engine_options& options);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Queues a request; returns its id. Throws pagedkv::error (invalid_argument) naming the bad
  /// parameter: an empty prompt, a token outside the vocabulary, stop strings without a tokenizer.
  request_id add_request(std::vector<token_id> prompt, const sampling_params& params);
  /// Runs one step: plans it, runs the forward, samples. Returns false when nothing was left to run.
  bool step();
  /// Steps until every request has finished.
  void run();
  /// Ends a request now; its completions so far are kept. False for an unknown or finished id.
  bool abort(request_id id);
  void on_stream(std::function<void(const stream_event&)> callback) { stream_ = std::move(callback); }

  [[nodiscard]] bool has_unfinished() const;
  /// Throws pagedkv::error (unknown_sequence) for an id never added.
  [[nodiscard]] const request_result& result(request_id id) const;
  [[nodiscard]] std::int64_t num_preemptions() const;
  /// The device KV pool now (kv_cache_manager::usage): blocks in use, slot fill, and the prefix
  /// cache's hit rate over every prompt allocated so far. Costs a pass over the pool's blocks.
  [[nodiscard]] kv_cache_usage kv_usage() const;
  [[nodiscard]] const engine_options& options() const noexcept { return options_; }

 private:
  struct track;
  struct request;
  using recompute_scheduler = scheduler<fcfs_admission, preempt_by_recompute>;
  using swap_scheduler = scheduler<fcfs_admission, preempt_by_swap>;

  template <class Scheduler>
  bool step_with(Scheduler& s);
  std::vector<continuation> sample(const sampling_request& req);
  std::vector<continuation> sample_beams(request& r, const sampling_request& req);
  void extend(request& r, track& t, token_id token, double logprob);
  void finish(request& r, track t, finish_reason reason);
  void emit(request& r, track& t, bool final_flush);
  template <class Scheduler>
  void finalize(Scheduler& s, request_id id);

  const llama_config& config_;
  const llama_weights& weights_;
  const tokenizer* tok_;
  engine_options options_;
  std::unique_ptr<recompute_scheduler> recompute_;
  std::unique_ptr<swap_scheduler> swap_;
  paged_kv_cache device_cache_;
  paged_kv_cache host_cache_;
  forward_state state_;
  forward_batch batch_;
  std::unordered_map<request_id, std::unique_ptr<request>> requests_;
  std::unordered_map<request_id, request_result> results_;
  std::function<void(const stream_event&)> stream_;
  request_id next_id_ = 1;
};

}  // namespace pagedkv::llama
