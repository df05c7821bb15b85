// What a step's sampling asks of a model backend, and its one definition on the host. The engine
// hands a backend, with each step's plan, one row_sampling per logits row and a uniform u in [0, 1)
// per draw; the backend returns, per draw, the chosen token and its log-probability, and per row
// its most likely tokens when asked (beam search's 2k candidates). Only these cross from a device,
// never the logits. model_backend's default runs sample_rows() below over execute()'s rows; the
// CUDA backend runs the same definition on the GPU (cuda/sampling_kernels.cuh).
//
// The definition, for a row of logits l over the vocabulary:
//   greedy (temperature <= 0, or top_k == 1): the largest logit, the lowest id among equal ones;
//   otherwise: rank the tokens by (logit descending, id ascending); keep the first top_k (all when
//   0 or more than the vocabulary); weigh each kept token by p = exp((l - max l) / temperature);
//   keep the shortest prefix of that ranking whose weight reaches top_p times the kept weight (at
//   least one token); then walk the kept tokens in id order and take the first whose running
//   weight exceeds u times their total (inverse CDF; the last kept one if rounding leaves none).
// Every chosen token's log-probability is at temperature 1 over the whole row: l - log sum exp(l).
// Candidates are the num_candidates first tokens of the (logit descending, id ascending) ranking.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <pagedkv/types.hpp>

namespace pagedkv::llama {

/// The most candidates one row may ask for: beam search's 2 * beam_width and a request's top
/// logprobs stay far below it; the GPU sorts a row's candidates within one CTA.
inline constexpr std::int32_t max_sampling_candidates = 1024;

/// How to choose from one row of logits (see the definition above).
struct row_sampling {
  float temperature = 0.0f;         ///< <= 0: greedy
  std::int32_t top_k = 0;           ///< 0: no limit
  float top_p = 1.0f;               ///< in (0, 1]
  std::int32_t num_draws = 1;       ///< tokens drawn from this row, one uniform each (n samples
                                    ///< draw n times from their prompt's row)
  std::int32_t num_candidates = 0;  ///< most likely tokens to return, best first
};

/// A step's sampling: what model_backend::execute_sampled takes beside the plan.
struct sampling_batch {
  std::vector<row_sampling> rows{};  ///< one per logits row, in the plan's order
  std::vector<double> uniforms{};    ///< [sum of rows' num_draws], row by row, each in [0, 1)
};

struct sampled_token {
  token_id token = 0;
  double logprob = 0.0;  ///< at temperature 1
};

/// What execute_sampled returns: views valid until the backend's next call.
struct step_samples {
  std::span<const sampled_token> draws{};       ///< [sum of num_draws], as sampling_batch::uniforms
  std::span<const sampled_token> candidates{};  ///< [sum of num_candidates], row by row, best first
};

/// Checks a batch against `rows` rows of `vocab` logits: a row count other than rows, a negative
/// draw count, a candidate count outside [0, min(vocab, max_sampling_candidates)], top_k < 0,
/// top_p outside (0, 1], a NaN temperature, uniforms not in [0, 1) or not one per draw.
/// Errors: pagedkv::error (invalid_argument) naming the row and the value.
void check_sampling_batch(const sampling_batch& batch, std::size_t rows, std::int64_t vocab);

/// Whether every row is greedy and wants no candidates: what a backend can answer with argmaxes.
bool is_greedy(const sampling_batch& batch) noexcept;

/// The definition above for one row: its draws (one per uniform) and its candidates.
void sample_row(std::span<const float> logits, const row_sampling& spec, std::span<const double> uniforms,
                std::span<sampled_token> draws, std::span<sampled_token> candidates);

/// sample_row over logits [rows, vocab] after check_sampling_batch; fills `draws` and
/// `candidates` (resized) and returns views of them.
step_samples sample_rows(std::span<const float> logits, std::int64_t vocab, const sampling_batch& batch,
                         std::vector<sampled_token>& draws, std::vector<sampled_token>& candidates);

/// The uniform of a request's draw: a counter-based generator (SplitMix64 over the request's seed,
/// the sample's index and the token's index in it), so that a request's tokens depend on its seed
/// alone, never on what runs beside it, on preemption or on prefill chunking.
double request_uniform(std::uint64_t seed, std::int32_t sample, std::int32_t token_index) noexcept;

}  // namespace pagedkv::llama
