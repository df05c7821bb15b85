// Host reference of paged attention: plain C++, fp32 accumulation, general over a ragged batch
// of query tokens (decode and prefill chunks alike). It is what CI checks the semantics with,
// what the GPU tests compare the CUDA kernels to, and what the CPU runner uses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../attention_params.hpp"
#include "../kv_dtype.hpp"

namespace pagedkv::kernels::reference {

namespace detail {

template <class TQ, class TKV>
void attention_typed(const attention_params& p, std::int32_t head_begin, std::int32_t head_end) {
  const std::int32_t d = p.head_dim;
  const std::int32_t group = p.group_size();
  const std::int32_t bs = p.table.block_size;
  const auto* q = static_cast<const TQ*>(p.q);
  auto* o = static_cast<TQ*>(p.o);
  const auto* k = static_cast<const TKV*>(p.k);
  const auto* v = static_cast<const TKV*>(p.v);
  std::vector<float> qf(static_cast<std::size_t>(d)), acc(static_cast<std::size_t>(d)), scores;
  for (std::int32_t seq = 0; seq < p.num_seqs; ++seq) {
    const std::int32_t kv_len = p.kv_len(seq);
    const std::int32_t q_len = p.q_len(seq);
    for (std::int32_t j = 0; j < q_len; ++j) {
      const std::int64_t token = p.q_begin(seq) + j;
      const std::int32_t pos = kv_len - q_len + j;  // this query's position in its sequence
      const std::int32_t lo = p.window_left >= 0 ? std::max(0, pos - p.window_left) : 0;
      for (std::int32_t h = head_begin; h < head_end; ++h) {
        const std::int32_t kv_head = h / group;
        const std::int64_t q_off = (token * p.num_qo_heads + h) * d;
        const float k_scale = p.k_scale_of(kv_head) * p.sm_scale;
        for (std::int32_t i = 0; i < d; ++i) qf[std::size_t(i)] = host::to_float(q[q_off + i]) * k_scale;
        scores.assign(std::size_t(std::max(0, pos + 1 - lo)), 0.0f);
        float max_score = -std::numeric_limits<float>::infinity();
        for (std::int32_t t = lo; t <= pos; ++t) {
          const std::int64_t off = p.kv_offset(p.table.block(seq, t / bs), t % bs, kv_head);
          float s = 0.0f;
          for (std::int32_t i = 0; i < d; ++i) s += qf[std::size_t(i)] * host::to_float(k[off + i]);
          if (p.logit_soft_cap > 0.0f) s = p.logit_soft_cap * std::tanh(s / p.logit_soft_cap);
          if (p.alibi_slopes) s += p.alibi_slopes[h] * float(t - pos);
          scores[std::size_t(t - lo)] = s;
          max_score = std::max(max_score, s);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        float sum = 0.0f;
        for (std::int32_t t = lo; t <= pos; ++t) {
          const float w = std::exp(scores[std::size_t(t - lo)] - max_score);
          sum += w;
          const std::int64_t off = p.kv_offset(p.table.block(seq, t / bs), t % bs, kv_head);
          for (std::int32_t i = 0; i < d; ++i) acc[std::size_t(i)] += w * host::to_float(v[off + i]);
        }
        const float out_scale = sum > 0.0f ? p.v_scale_of(kv_head) / sum : 0.0f;
        for (std::int32_t i = 0; i < d; ++i) o[q_off + i] = host::from_float<TQ>(acc[std::size_t(i)] * out_scale);
        if (p.lse)
          p.lse[token * p.num_qo_heads + h] =
              sum > 0.0f ? max_score + std::log(sum) : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

}  // namespace detail

/// attention(p) for the query heads [head_begin, head_end) only: what it writes to o and lse
/// for those heads, nothing for the others. Disjoint head ranges may run on different threads
/// (the CPU runner splits the heads of one call this way).
inline void attention_heads(const attention_params& p, std::int32_t head_begin, std::int32_t head_end) {
  check(p);
  if (head_begin < 0 || head_begin > head_end || head_end > p.num_qo_heads)
    pagedkv::detail::fail(errc::invalid_argument, "head range [", head_begin, ", ", head_end, ") outside [0, ",
                          p.num_qo_heads, ")");
  host::visit_dtype(p.q_dtype, [&]<class TQ>() {
    if (p.kv_dtype == dtype::fp8_e4m3) detail::attention_typed<TQ, host::fp8_e4m3>(p, head_begin, head_end);
    else detail::attention_typed<TQ, TQ>(p, head_begin, head_end);
  });
}

/// o (and lse, when set) = softmax(sm_scale * q k^T) v over each query's causal window of its
/// sequence, read through the block table. Throws errc::invalid_argument on bad params.
/// Precondition: q_len(i) <= kv_len(i); every block the table names lies inside the pool.
inline void attention(const attention_params& p) { attention_heads(p, 0, p.num_qo_heads); }

}  // namespace pagedkv::kernels::reference
