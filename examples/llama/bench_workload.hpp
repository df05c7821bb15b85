// The synthetic workload of `pagedkv-llama --bench`: ShareGPT-like prompt and output lengths,
// seeded random prompt tokens, optionally a shared system prompt in front of every prompt.
//
// Lengths are log-normal with the memory simulator's fitted ShareGPT-like parameters
// (docs/simulation.md, "Length distributions": ln(length) ~ N(mu, sigma^2), mu fitted so that the
// means clamped to 1024 prompt / 2048 context tokens are the paper's 161.31 and 337.99), then
// scaled, rounded and clamped to the limits given here. Examples may not depend on bench/, so the few lines
// of drawing are written again here rather than taken from bench/sim/workload.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include <pagedkv/types.hpp>

namespace pagedkv::llama {

/// ln(length) ~ N(mu, sigma^2), before rounding and clamping.
struct log_normal_length {
  double mu;
  double sigma;
};

// docs/simulation.md's table: ShareGPT-like input mu 4.6147 sigma 1.0 (median 101), output mu
// 5.4417 sigma 0.9 (median 230).
inline constexpr log_normal_length sharegpt_prompt_length{4.6147, 1.0};
inline constexpr log_normal_length sharegpt_output_length{5.4417, 0.9};

struct bench_workload_options {
  std::int32_t num_requests = 16;
  std::int32_t max_prompt_tokens = 1024;   ///< whole prompts (shared prefix included) are clamped here
  std::int32_t max_output_tokens = 2048;   ///< outputs are clamped here (a max_tokens setting)
  std::int32_t context_tokens = 2048;      ///< prompt + output are clamped here (the model's context)
  std::int32_t shared_prefix_tokens = 0;   ///< every prompt starts with the same this many tokens
  std::int32_t vocab_size = 32000;         ///< prompt tokens are uniform in [0, vocab_size)
  /// Multiplies every drawn length before clamping: the shape stays (median, mean and tail scale
  /// alike; with the limits scaled too, the clamped means scale exactly), for a CPU that cannot
  /// serve the full lengths in reasonable time.
  double length_scale = 1.0;
  std::uint64_t seed = 0;
};

struct bench_request {
  std::vector<token_id> prompt;    ///< shared prefix, then at least one token of its own
  std::int32_t output_tokens = 1;  ///< what the request generates (EOS ignored)
};

/// Draws the workload: the same options and seed give the same requests (std::mt19937_64 with
/// written-out transforms, so on every standard library). Prompts hold 1 to max_prompt_tokens
/// tokens and leave room for at least one output token in the context; outputs hold 1 to
/// min(max_output_tokens, context_tokens - prompt length) tokens.
/// Throws pagedkv::error (invalid_argument) naming the option when the limits leave no room: a
/// shared prefix that fills max_prompt_tokens or the context, a non-positive limit, scale or
/// vocabulary.
std::vector<bench_request> make_bench_workload(const bench_workload_options& options);

}  // namespace pagedkv::llama
