// What an engine request gives back, apart from the engine: how a sample ended, its completions,
// the result, and the stream events. Plain structs, so that code passing them between threads
// (serving_loop.hpp) and its tests need no model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <pagedkv/scheduler.hpp>
#include <pagedkv/types.hpp>

namespace pagedkv::llama {

enum class finish_reason { none, eos, length, stop_string, aborted, rejected };
std::string_view to_string(finish_reason reason) noexcept;

/// A token and its log-probability at temperature 1.
struct token_logprob {
  token_id token = 0;
  double logprob = 0.0;
};

struct completion {
  std::vector<token_id> tokens{};  ///< generated ids, the EOS included when it ended the sample
  std::string text{};              ///< their text (empty without a tokenizer), without EOS or stop string
  double logprob = 0.0;            ///< sum of the chosen tokens' log-probabilities (temperature 1)
  finish_reason reason = finish_reason::none;
  std::vector<double> token_logprobs{};  ///< each of `tokens`' log-probability (temperature 1): they sum to logprob
  /// With sampling_params::top_logprobs = k > 0: for each of `tokens`, the k most likely tokens of
  /// its step, most likely first (the lowest id among equals); else empty.
  std::vector<std::vector<token_logprob>> top_logprobs{};
};

struct request_result {
  bool finished = false;
  /// The request can never fit in the KV pool: its prompt at admission, or, running alone, its
  /// samples outgrew the pool; completions then keep what was generated, with reason `rejected`.
  bool rejected = false;
  std::vector<completion> completions{};  ///< n samples in index order, or beams best first
  std::int32_t num_preemptions = 0;
  std::int32_t num_cached_prompt_tokens = 0;
  /// Scheduled chunks that computed prompt tokens, over the request's sequences: 1 for a prompt
  /// that one step computes once for all its samples; more when the budget chunks it or a
  /// recompute preemption computes it again.
  std::int32_t num_prefill_chunks = 0;
};

/// What the stream callback gets: new text of one sample, or its end.
struct stream_event {
  request_id request = 0;
  std::int32_t sample = 0;   ///< sample index 0..n-1 (beam search streams only its final beams)
  token_id token = -1;       ///< the token that produced this event, -1 for a final flush
  std::string text{};        ///< newly complete text (whole UTF-8 characters), possibly empty
  finish_reason finished = finish_reason::none;
  /// The sample's tokens this event releases, each exactly once over its events, so that they
  /// concatenate to completion::tokens: those whose text this event completes, or at the end
  /// (finished != none) what is left (an EOS, tokens past a stop string). Without a tokenizer
  /// every token is released by an event of its own, with empty text.
  std::vector<token_id> tokens{};
  std::vector<double> token_logprobs{};  ///< theirs, as completion::token_logprobs
  std::vector<std::vector<token_logprob>> top_logprobs{};  ///< theirs with sampling_params::top_logprobs > 0
};

}  // namespace pagedkv::llama
