// Request traces for the simulator: synthetic ShareGPT-like and Alpaca-like length distributions,
// Poisson arrivals, and the sharing variants (shared system prompt, parallel sampling, beam
// search). docs/simulation.md explains the fitted distributions and why they were chosen.
//
// Everything is drawn from one seeded std::mt19937_64 (and per-request streams seeded from it)
// through the portable transforms of random.hpp (not std::normal_distribution and friends, whose
// algorithms differ between standard libraries), so a (config, seed) pair names the same trace on
// every platform.
#pragma once

#include "sim/random.hpp"

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

namespace pagedkv::sim {

/// One request of a trace. A request with num_samples > 1 or beam_width > 1 is one sequence group
/// whose sequences all start from `prompt`.
struct request {
  std::uint64_t id = 0;              ///< unique in its trace; requests are ordered by id
  std::int64_t arrival_step = 0;     ///< the first step at which the request may be admitted
  std::vector<token_id> prompt;      ///< at least one token
  std::int32_t output_len = 1;       ///< tokens each sequence generates (the null model's EOS)
  std::int32_t max_output_len = 1;   ///< the most it could generate: what max-length reserves
  std::int32_t num_samples = 1;      ///< parallel samples n (1 = plain sampling)
  std::int32_t beam_width = 1;       ///< beam width k (1 = no beam search)
  std::uint64_t seed = 0;            ///< seeds this request's beam_model
  std::int32_t cache_priority = 0;   ///< its cached blocks' priority under priority_eviction
  /// A session turn (trace_file.hpp): the tokens the null model generates, output_len of them,
  /// which the session's next turn finds at the end of its prompt. Empty: the simulator's own.
  std::vector<token_id> output_tokens{};
  /// A later session turn: the id of the turn it continues, which must finish before this one is
  /// admitted (a user answers what they have read).
  std::optional<std::uint64_t> after{};

  [[nodiscard]] std::int32_t prompt_len() const noexcept {
    return static_cast<std::int32_t>(prompt.size());
  }
  /// Sequences the group runs at once: k beams or n samples.
  [[nodiscard]] std::int32_t num_sequences() const noexcept {
    return beam_width > 1 ? beam_width : num_samples;
  }
};

using trace = std::vector<request>;

/// A length distribution: a log-normal with this mean (after clamping) and this log-space standard
/// deviation. The mean is the paper's; sigma sets the shape (see docs/simulation.md).
struct length_target {
  double mean_tokens;
  double sigma;
};

struct dataset_profile {
  std::string_view name;
  length_target input;
  length_target output;
};

// Means from Kwon et al., SOSP 2023, Fig. 11: ShareGPT 161.31 in / 337.99 out, Alpaca 19.31 in /
// 58.45 out. Sigmas were read off the figure's shapes: ShareGPT's long, flat tails (inputs reach
// the 1024 cap, outputs the 2048 context) and Alpaca's short, narrow instructions with a longer
// tail of outputs.
inline constexpr dataset_profile sharegpt_profile{"sharegpt", {161.31, 1.0}, {337.99, 0.9}};
inline constexpr dataset_profile alpaca_profile{"alpaca", {19.31, 0.55}, {58.45, 0.9}};

/// The log-normal parameters generate() draws from: ln(length) ~ N(mu, sigma^2), then rounded and
/// clamped (inputs to [1, max_prompt_len - shared_prefix_len], outputs to [1, max_context_len -
/// prompt_len]).
struct fitted_lengths {
  double mu_input, sigma_input;
  double mu_output, sigma_output;
};

namespace detail {

inline double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

/// E[min(X, cap)] for ln X ~ N(mu, sigma^2).
inline double clamped_lognormal_mean(double mu, double sigma, double cap) {
  double log_cap = std::log(cap);
  return std::exp(mu + sigma * sigma / 2) * normal_cdf((log_cap - mu - sigma * sigma) / sigma) +
         cap * (1 - normal_cdf((log_cap - mu) / sigma));
}

/// The mu in [-20, 20] at which mean_of(mu), increasing in mu, equals target (bisection).
template <class MeanOf>
double solve_mu(double target, MeanOf mean_of) {
  double low = -20, high = 20;
  for (int i = 0; i < 200; ++i) {
    double mid = (low + high) / 2;
    (mean_of(mid) < target ? low : high) = mid;
  }
  return (low + high) / 2;
}

}  // namespace detail

/// Chooses mu for input and output so that the clamped means equal the profile's. The input cap is
/// max_prompt_len; the output cap is max_context_len minus the prompt, integrated over the input
/// distribution (1-D quadrature over the input's normal quantile). Rounding to whole tokens is left
/// out: its bias is well under one token.
inline fitted_lengths fit_lengths(const dataset_profile& profile, std::int32_t max_prompt_len,
                                  std::int32_t max_context_len) {
  if (max_prompt_len < 1 || max_context_len <= max_prompt_len) {
    pagedkv::detail::fail(errc::invalid_argument, "fit_lengths: need 1 <= max_prompt_len (",
                 max_prompt_len, ") < max_context_len (", max_context_len, ")");
  }
  const double s_in = profile.input.sigma, s_out = profile.output.sigma;
  const double mu_in = detail::solve_mu(profile.input.mean_tokens, [&](double mu) {
    return detail::clamped_lognormal_mean(mu, s_in, max_prompt_len);
  });
  const double mu_out = detail::solve_mu(profile.output.mean_tokens, [&](double mu) {
    // Trapezoid over z in [-8, 8]: the prompt at quantile z sets this output's cap.
    constexpr int points = 801;
    constexpr double z_min = -8, z_max = 8, dz = (z_max - z_min) / (points - 1);
    double sum = 0;
    for (int i = 0; i < points; ++i) {
      double z = z_min + i * dz;
      double prompt = std::clamp(std::exp(mu_in + s_in * z), 1.0, double(max_prompt_len));
      double weight = std::exp(-z * z / 2) / std::sqrt(2 * 3.14159265358979323846);
      if (i == 0 || i == points - 1) weight /= 2;
      sum += weight * dz * detail::clamped_lognormal_mean(mu, s_out, max_context_len - prompt);
    }
    return sum;
  });
  return {mu_in, s_in, mu_out, s_out};
}

struct workload_config {
  dataset_profile profile = sharegpt_profile;
  std::size_t num_requests = 1000;
  /// Mean arrivals per simulated step (Poisson). 0 puts every request at step 0: saturation.
  double arrival_rate_per_step = 0;
  /// Prompts are clamped here (1024 as in the paper's chatbot run and vLLM's ShareGPT benchmark)
  /// and prompt + output to max_context_len (OPT's 2048).
  std::int32_t max_prompt_len = 1024;
  std::int32_t max_context_len = 2048;
  /// The most a request may generate (a max_tokens setting): outputs are clamped to it and
  /// max-length reservation reserves it. 0 means "up to the context limit" (max_context_len -
  /// prompt_len), FasterTransformer's reservation. A cap below the fitted tail lowers the mean.
  std::int32_t max_output_cap = 0;
  /// Every prompt starts with the same this many tokens (a system prompt); 0 for none.
  std::int32_t shared_prefix_len = 0;
  std::int32_t num_samples = 1;
  std::int32_t beam_width = 1;
  std::int32_t vocab_size = 32000;
  std::uint64_t seed = 1;
};

/// Draws a trace. Requests are in id order, which is also arrival order.
/// Errors: invalid_argument for an inconsistent config.
inline trace generate(const workload_config& config) {
  if (config.shared_prefix_len < 0 || config.shared_prefix_len >= config.max_prompt_len ||
      config.num_samples < 1 || config.beam_width < 1 ||
      (config.num_samples > 1 && config.beam_width > 1) || config.vocab_size < 2 ||
      config.arrival_rate_per_step < 0 || config.max_output_cap < 0) {
    pagedkv::detail::fail(errc::invalid_argument, "generate: inconsistent workload config for ",
                 config.profile.name, " (prefix ", config.shared_prefix_len, ", max prompt ",
                 config.max_prompt_len, ", n ", config.num_samples, ", beam ", config.beam_width,
                 ", vocab ", config.vocab_size, ", rate ", config.arrival_rate_per_step, ")");
  }
  const fitted_lengths fit =
      fit_lengths(config.profile, config.max_prompt_len, config.max_context_len);
  // Every request takes the same five draws from the main stream (arrival gap, two lengths, a
  // token seed, a beam seed) and its prompt tokens from a stream of its own, so variants of one
  // workload (another rate, a shared prefix, n or k) draw the same lengths and tokens per request.
  std::mt19937_64 rng(config.seed);
  auto draw_tokens = [&](std::mt19937_64& stream, std::int32_t count, std::vector<token_id>& out) {
    for (std::int32_t t = 0; t < count; ++t) {
      out.push_back(static_cast<token_id>(
          uniform_below(stream, static_cast<std::uint64_t>(config.vocab_size))));
    }
  };
  auto to_length = [](double mu, double sigma, double z, std::int32_t cap) {
    return static_cast<std::int32_t>(std::clamp<double>(std::round(std::exp(mu + sigma * z)), 1, cap));
  };

  std::vector<token_id> shared_prefix;
  std::mt19937_64 prefix_rng(config.seed ^ 0x9e3779b97f4a7c15ULL);
  draw_tokens(prefix_rng, config.shared_prefix_len, shared_prefix);

  trace requests;
  requests.reserve(config.num_requests);
  double clock = 0;
  const bool poisson = config.arrival_rate_per_step > 0;
  for (std::size_t i = 0; i < config.num_requests; ++i) {
    const double gap = exponential(rng, poisson ? config.arrival_rate_per_step : 1.0);
    const double z_input = standard_normal(rng);
    const double z_output = standard_normal(rng);
    std::mt19937_64 token_rng(rng());
    request r;
    r.id = i;
    r.seed = rng();
    if (poisson) clock += gap;
    r.arrival_step = static_cast<std::int64_t>(clock);
    std::int32_t user_len = to_length(fit.mu_input, fit.sigma_input, z_input,
                                      config.max_prompt_len - config.shared_prefix_len);
    r.prompt.reserve(shared_prefix.size() + static_cast<std::size_t>(user_len));
    r.prompt = shared_prefix;
    draw_tokens(token_rng, user_len, r.prompt);
    std::int32_t room = config.max_context_len - r.prompt_len();
    if (config.max_output_cap > 0) room = std::min(room, config.max_output_cap);
    r.output_len = to_length(fit.mu_output, fit.sigma_output, z_output, room);
    r.max_output_len = room;
    r.num_samples = config.num_samples;
    r.beam_width = config.beam_width;
    requests.push_back(std::move(r));
  }
  return requests;
}

/// The same work with no sharing to exploit: every sequence of every group becomes a request of
/// its own (same prompt, lengths and arrival), ids renumbered in order. The reference run for
/// "memory saved by sharing". Note that identical prompts can still meet in a prefix cache.
inline trace split_groups(const trace& requests) {
  trace out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> renamed;  // (old id, new id), old ids ascending
  for (const auto& r : requests) {
    renamed.emplace_back(r.id, out.size());
    for (std::int32_t s = 0; s < r.num_sequences(); ++s) {
      request single = r;
      single.id = out.size();
      if (r.after) {  // a session turn (one sequence) continues the new id of its previous turn
        single.after = std::lower_bound(renamed.begin(), renamed.end(), std::pair{*r.after, std::uint64_t{0}})->second;
      }
      single.num_samples = 1;
      single.beam_width = 1;
      out.push_back(std::move(single));
    }
  }
  return out;
}

}  // namespace pagedkv::sim
