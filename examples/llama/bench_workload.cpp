#include "bench_workload.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include <pagedkv/error.hpp>

namespace pagedkv::llama {

namespace {

/// N(0, 1) by Box-Muller; std::normal_distribution's algorithm differs between standard libraries.
double standard_normal(std::mt19937_64& rng) {
  const double u1 = 1.0 - double(rng() >> 11) * 0x1.0p-53;  // (0, 1]: safe to take the log of
  const double u2 = double(rng() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
}

std::int32_t draw_length(std::mt19937_64& rng, log_normal_length length, double scale, std::int32_t max_tokens) {
  const double tokens = std::round(scale * std::exp(length.mu + length.sigma * standard_normal(rng)));
  return std::int32_t(std::clamp(tokens, 1.0, double(max_tokens)));
}

/// Appends `count` tokens uniform in [0, vocab_size). The modulo's bias is below 2^-40 for any
/// vocabulary under 2^24 tokens.
void draw_tokens(std::mt19937_64& rng, std::int32_t count, std::int32_t vocab_size, std::vector<token_id>& out) {
  for (std::int32_t i = 0; i < count; ++i) out.push_back(token_id(rng() % std::uint64_t(vocab_size)));
}

}  // namespace

std::vector<bench_request> make_bench_workload(const bench_workload_options& o) {
  const std::int32_t max_prompt = std::min(o.max_prompt_tokens, o.context_tokens - 1);
  if (o.num_requests < 0 || o.max_output_tokens < 1 || o.vocab_size < 1 || max_prompt < 1 || !(o.length_scale > 0))
    detail::fail(errc::invalid_argument, "bench workload: requests ", o.num_requests, ", max prompt tokens ",
                 o.max_prompt_tokens, ", max output tokens ", o.max_output_tokens, ", context ", o.context_tokens,
                 ", vocabulary ", o.vocab_size, ", length scale ", o.length_scale);
  if (o.shared_prefix_tokens < 0 || o.shared_prefix_tokens >= max_prompt)
    detail::fail(errc::invalid_argument, "bench workload: a shared prefix of ", o.shared_prefix_tokens,
                 " tokens leaves no room in prompts of at most ", max_prompt, " tokens");

  // Each request takes two lengths and a token seed from the main stream and its tokens from a
  // stream of its own, so a shared prefix or other limits do not change the draws of the others.
  std::mt19937_64 rng(o.seed);
  std::vector<token_id> prefix;
  std::mt19937_64 prefix_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
  draw_tokens(prefix_rng, o.shared_prefix_tokens, o.vocab_size, prefix);

  std::vector<bench_request> requests(std::size_t(o.num_requests));
  for (bench_request& r : requests) {
    const std::int32_t own_tokens = draw_length(rng, sharegpt_prompt_length, o.length_scale, max_prompt - o.shared_prefix_tokens);
    r.prompt = prefix;
    std::mt19937_64 token_rng(rng());
    draw_tokens(token_rng, own_tokens, o.vocab_size, r.prompt);
    const std::int32_t room = std::min(o.max_output_tokens, o.context_tokens - std::int32_t(r.prompt.size()));
    r.output_tokens = draw_length(rng, sharegpt_output_length, o.length_scale, room);
  }
  return requests;
}

}  // namespace pagedkv::llama
