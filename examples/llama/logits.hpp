// What the sampling definition (sampling.hpp) reads from a row of logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <pagedkv/types.hpp>

namespace pagedkv::llama {

/// log(sum(exp(logits))), for log-probabilities at temperature 1.
inline double log_sum_exp(const float* logits, std::int64_t vocab) {
  const float m = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (std::int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - m);
  return m + std::log(sum);
}

/// The largest logit's token, the lowest id among equal maxima.
inline token_id argmax(const float* logits, std::int64_t vocab) {
  return token_id(std::max_element(logits, logits + vocab) - logits);  // first of equal maxima
}

/// The k largest logits' tokens, largest first, the lowest id among equals; k <= vocab.
inline std::vector<token_id> top_k_tokens(const float* logits, std::int64_t vocab, std::int64_t k) {
  std::vector<token_id> ids(static_cast<std::size_t>(vocab));
  for (std::int64_t i = 0; i < vocab; ++i) ids[std::size_t(i)] = token_id(i);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(),
                    [&](token_id a, token_id b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  ids.resize(std::size_t(k));
  return ids;
}

}  // namespace pagedkv::llama
