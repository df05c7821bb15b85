#include "sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <pagedkv/error.hpp>

#include "logits.hpp"

namespace pagedkv::llama {

using pagedkv::detail::fail;

void check_sampling_batch(const sampling_batch& batch, std::size_t rows, std::int64_t vocab) {
  if (batch.rows.size() != rows)
    fail(errc::invalid_argument, "sampling: ", batch.rows.size(), " row specs for ", rows, " logits rows");
  const std::int64_t most = std::min<std::int64_t>(vocab, max_sampling_candidates);
  std::size_t draws = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const row_sampling& s = batch.rows[r];
    if (s.num_draws < 0 || s.num_candidates < 0 || s.num_candidates > most || s.top_k < 0 || !(s.top_p > 0.0f) ||
        s.top_p > 1.0f || std::isnan(s.temperature))
      fail(errc::invalid_argument, "sampling row ", r, ": num_draws ", s.num_draws, ", num_candidates ", s.num_candidates,
           " (at most ", most, "), top_k ", s.top_k, ", top_p ", s.top_p, ", temperature ", s.temperature);
    draws += std::size_t(s.num_draws);
  }
  if (batch.uniforms.size() != draws)
    fail(errc::invalid_argument, "sampling: ", batch.uniforms.size(), " uniforms for ", draws, " draws");
  for (std::size_t i = 0; i < draws; ++i)
    if (!(batch.uniforms[i] >= 0.0 && batch.uniforms[i] < 1.0))
      fail(errc::invalid_argument, "sampling: uniform ", i, " is ", batch.uniforms[i], ", not in [0, 1)");
}

bool is_greedy(const sampling_batch& batch) noexcept {
  return std::all_of(batch.rows.begin(), batch.rows.end(), [](const row_sampling& s) {
    return s.num_candidates == 0 && (s.temperature <= 0.0f || s.top_k == 1);
  });
}

void sample_row(std::span<const float> logits, const row_sampling& spec, std::span<const double> uniforms,
                std::span<sampled_token> draws, std::span<sampled_token> candidates) {
  const float* l = logits.data();
  const auto vocab = std::int64_t(logits.size());
  const double lse = log_sum_exp(l, vocab);
  const auto ranked = [&](token_id a, token_id b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<token_id> ids;
  const auto rank_first = [&](std::size_t count) {  // ids[0, count) by rank, the rest in any order
    ids.resize(std::size_t(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(count), ids.end(), ranked);
  };
  if (!candidates.empty()) {
    const std::vector<token_id> best = top_k_tokens(l, vocab, std::int64_t(candidates.size()));
    for (std::size_t i = 0; i < candidates.size(); ++i) candidates[i] = {best[i], double(l[best[i]]) - lse};
  }
  if (draws.empty()) return;
  if (spec.temperature <= 0.0f || spec.top_k == 1) {
    const token_id best = argmax(l, vocab);
    std::fill(draws.begin(), draws.end(), sampled_token{best, double(l[best]) - lse});
    return;
  }
  // The kept tokens and their weights, then in id order for the inverse CDF.
  const auto keep = std::size_t(spec.top_k > 0 ? std::min<std::int64_t>(spec.top_k, vocab) : vocab);
  const double top = *std::max_element(l, l + vocab);
  const auto weight = [&](token_id t) { return std::exp((double(l[t]) - top) / double(spec.temperature)); };
  std::vector<token_id> kept;
  if (keep == std::size_t(vocab) && spec.top_p >= 1.0f) {
    kept.resize(std::size_t(vocab));  // every token: no ranking needed
    std::iota(kept.begin(), kept.end(), 0);
  } else {
    rank_first(keep);
    std::size_t cut = keep;
    if (spec.top_p < 1.0f) {
      double sum = 0.0;
      for (std::size_t i = 0; i < keep; ++i) sum += weight(ids[i]);
      double mass = 0.0;
      for (cut = 0; cut < keep && mass < double(spec.top_p) * sum;) mass += weight(ids[cut++]);
      cut = std::max<std::size_t>(cut, 1);
    }
    kept.assign(ids.begin(), ids.begin() + std::ptrdiff_t(cut));
    std::sort(kept.begin(), kept.end());
  }
  std::vector<double> running(kept.size());
  double total = 0.0;
  for (std::size_t i = 0; i < kept.size(); ++i) running[i] = total += weight(kept[i]);
  for (std::size_t d = 0; d < draws.size(); ++d) {
    const double target = uniforms[d] * total;
    const auto at = std::size_t(std::upper_bound(running.begin(), running.end(), target) - running.begin());
    const token_id t = kept[std::min(at, kept.size() - 1)];
    draws[d] = {t, double(l[t]) - lse};
  }
}

step_samples sample_rows(std::span<const float> logits, std::int64_t vocab, const sampling_batch& batch,
                         std::vector<sampled_token>& draws, std::vector<sampled_token>& candidates) {
  if (vocab < 1 || logits.size() % std::size_t(vocab) != 0)
    fail(errc::invalid_argument, "sampling: ", logits.size(), " logits are not rows of ", vocab);
  const std::size_t rows = logits.size() / std::size_t(vocab);
  check_sampling_batch(batch, rows, vocab);
  std::size_t num_candidates = 0;
  for (const row_sampling& s : batch.rows) num_candidates += std::size_t(s.num_candidates);
  draws.resize(batch.uniforms.size());
  candidates.resize(num_candidates);
  std::size_t d = 0, c = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const row_sampling& s = batch.rows[r];
    const auto nd = std::size_t(s.num_draws), nc = std::size_t(s.num_candidates);
    sample_row(logits.subspan(r * std::size_t(vocab), std::size_t(vocab)), s,
               std::span(batch.uniforms).subspan(d, nd), std::span(draws).subspan(d, nd),
               std::span(candidates).subspan(c, nc));
    d += nd;
    c += nc;
  }
  return {draws, candidates};
}

namespace {
constexpr std::uint64_t mix(std::uint64_t z) noexcept {  // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

double request_uniform(std::uint64_t seed, std::int32_t sample, std::int32_t token_index) noexcept {
  constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ULL;
  std::uint64_t z = mix(seed + golden);
  z = mix(z + golden * (std::uint64_t(std::uint32_t(sample)) + 1));
  z = mix(z + golden * (std::uint64_t(std::uint32_t(token_index)) + 1));
  return double(z >> 11) * 0x1.0p-53;  // 53 bits: [0, 1)
}

}  // namespace pagedkv::llama
