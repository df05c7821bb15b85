// Sampling on the GPU: sampling.hpp's definition, one CTA a logits row, so that only chosen tokens
// and log-probabilities leave the device. No row is sorted whole: top-k and top-p are thresholds in
// the (logit descending, id ascending) ranking, found by radix select over the logits' ordered bits
// (four 8-bit passes; counts for top-k and candidates, weights for top-p), and the draw walks the
// kept tokens in id order, as the definition does, through a CTA scan of per-thread segment sums.
// Weights are fixed point (exp((l - max) / T) * 2^44, summed in 64 bits): sums are exact, so a
// row's choice does not depend on the order of atomics, and the scan is deterministic.
// Candidates (beams' 2k) are gathered by the same threshold and ordered by a CUB block radix sort.
#pragma once

#include <cstdint>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

namespace pagedkv::llama::cuda {

inline constexpr int sample_threads = 1024;
/// Candidates one row may ask for: one per thread of the CTA's radix sort (sampling.hpp's
/// max_sampling_candidates).
inline constexpr int sample_max_candidates = sample_threads;
/// Fixed-point scale of the weights: vocab * 2^44 must fit 64 bits, so rows up to 2^20 tokens.
inline constexpr double weight_scale = 17592186044416.0;  // 2^44
inline constexpr std::int64_t sample_max_vocab = std::int64_t(1) << 20;

/// One thread's or one CTA's view of a logits row: the largest logit, where it is first, and the
/// sum of exp(logit - max) over what it has seen (0 for nothing seen).
struct row_max_sum {
  float max;
  int index;
  float sum;
};

struct merge_row_max_sum {
  __device__ row_max_sum operator()(const row_max_sum& a, const row_max_sum& b) const {
    if (a.sum == 0.0f) return b;
    if (b.sum == 0.0f) return a;
    const float m = fmaxf(a.max, b.max);
    const int index = a.max > b.max ? a.index : b.max > a.max ? b.index : min(a.index, b.index);
    return {m, index, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
  }
};

/// The CTA's view of row[0, count) (indices counted from `first`: a rank's column slice under
/// tensor parallelism starts at its first token id), in thread 0. One CTA of sample_threads.
__device__ inline row_max_sum block_row_max_sum(typename cub::BlockReduce<row_max_sum, sample_threads>::TempStorage& storage,
                                                const float* row, std::int64_t count, int first) {
  row_max_sum mine{-INFINITY, 0, 0.0f};
  for (std::int64_t i = threadIdx.x; i < count; i += sample_threads) {  // ascending: the first maximum stays
    const float x = row[i];
    if (mine.sum == 0.0f || x > mine.max) {
      mine.sum = mine.sum * __expf(mine.max - x) + 1.0f;
      mine.max = x;
      mine.index = first + int(i);
    } else {
      mine.sum += __expf(x - mine.max);
    }
  }
  return cub::BlockReduce<row_max_sum, sample_threads>(storage).Reduce(mine, merge_row_max_sum{});
}

/// One row's sampling (sampling.hpp's row_sampling) with where its outputs go.
struct row_sample_spec {
  float temperature;
  std::int32_t top_k;
  float top_p;
  std::int32_t num_draws, num_candidates;
  std::int32_t draw_offset, candidate_offset;
};

struct device_sampled_token {
  std::int32_t token;
  float logprob;
};

struct sample_params {
  const float* logits;                 // [rows, vocab]
  std::int64_t vocab;
  const row_sample_spec* specs;        // [rows]
  const double* uniforms;              // [total draws]
  device_sampled_token* draws;         // [total draws]
  device_sampled_token* candidates;    // [total candidates]
};

/// The logit's bits as an unsigned key in the float order (-0 as +0): larger key, larger logit.
__device__ inline std::uint32_t order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  const std::uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ inline float key_value(std::uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/// A threshold in the ranking: every token whose key is above `key`, and of those equal to it
/// the `ties` lowest ids.
struct rank_cut {
  std::uint32_t key;
  unsigned long long ties;
};

struct sample_storage {
  using reduce_max = cub::BlockReduce<row_max_sum, sample_threads>;
  using reduce_u64 = cub::BlockReduce<unsigned long long, sample_threads>;
  using scan_u64 = cub::BlockScan<unsigned long long, sample_threads>;
  using sort = cub::BlockRadixSort<unsigned long long, sample_threads, 1>;
  union {
    typename reduce_max::TempStorage max;
    typename reduce_u64::TempStorage sum;
    typename scan_u64::TempStorage scan;
    typename sort::TempStorage sort;
  } cub;
  unsigned long long histogram[256];
  unsigned long long gathered[sample_max_candidates];
  std::uint32_t prefix;
  unsigned long long remaining;
  std::int64_t found;
  float max, lse;
  std::int32_t argmax;
};

/// This thread's contiguous segment of the row [begin, end): id order is thread order.
struct segment {
  std::int64_t begin, end;
  __device__ explicit segment(std::int64_t vocab) {
    const std::int64_t per = (vocab + sample_threads - 1) / sample_threads;
    begin = min(vocab, std::int64_t(threadIdx.x) * per);
    end = min(vocab, begin + per);
  }
};

/// The threshold of the `want` highest-ranked tokens, by count (want >= 1), among all tokens
/// (`weights` false) or by weight among keys >= `floor` (weights true: the smallest prefix whose
/// weight reaches `want`). For weights, `ties` is the remaining weight the equal keys must supply.
template <bool Weights>
__device__ rank_cut radix_select(sample_storage& s, const float* row, std::int64_t vocab, unsigned long long want,
                                 std::uint32_t floor, float top, float inv_temperature) {
  std::uint32_t prefix = 0, mask = 0;
  unsigned long long remaining = want;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += sample_threads) s.histogram[b] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < vocab; i += sample_threads) {
      const float x = row[i];
      const std::uint32_t key = order_key(x);
      if ((key & mask) != prefix || key < floor) continue;
      const unsigned long long add = Weights ? __double2ull_rn(double(expf((x - top) * inv_temperature)) * weight_scale) : 1ull;
      atomicAdd(&s.histogram[(key >> shift) & 255u], add);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long above = 0;
      int b = 255;
      for (; b > 0 && above + s.histogram[b] < remaining; --b) above += s.histogram[b];
      s.prefix = prefix | (std::uint32_t(b) << shift);
      s.remaining = remaining - above;
    }
    __syncthreads();
    prefix = s.prefix;
    remaining = s.remaining;
    mask |= 255u << shift;
    __syncthreads();  // s.prefix and the histogram are written again next pass
  }
  return {prefix, remaining};
}

/// The id of the `ties`-th token (in id order) whose key equals `key` (ties >= 1).
__device__ inline std::int64_t nth_tie(sample_storage& s, const float* row, const segment& seg, std::uint32_t key,
                                unsigned long long ties) {
  unsigned long long count = 0;
  for (std::int64_t i = seg.begin; i < seg.end; ++i) count += order_key(row[i]) == key;
  unsigned long long before = 0;
  sample_storage::scan_u64(s.cub.scan).ExclusiveSum(count, before);
  if (before < ties && ties <= before + count) {
    unsigned long long seen = before;
    for (std::int64_t i = seg.begin; i < seg.end; ++i)
      if (order_key(row[i]) == key && ++seen == ties) s.found = i;
  }
  __syncthreads();
  return s.found;
}

/// sampling.hpp's definition for row blockIdx.x of p.logits. One CTA of sample_threads a row. A
/// template, as every kernel of a header here is, so that several units may include the header.
template <class = void>
__global__ void __launch_bounds__(sample_threads) sample_kernel(sample_params p) {
  __shared__ sample_storage s;
  const row_sample_spec spec = p.specs[blockIdx.x];
  if (spec.num_draws == 0 && spec.num_candidates == 0) return;
  const std::int64_t vocab = p.vocab;
  const float* row = p.logits + std::int64_t(blockIdx.x) * vocab;
  const segment seg(vocab);

  // The row's largest logit (its first index) and log-sum-exp: every log-probability's base.
  const row_max_sum all = block_row_max_sum(s.cub.max, row, vocab, 0);
  if (threadIdx.x == 0) {
    s.max = all.max;
    s.lse = all.max + logf(all.sum);
    s.argmax = all.index;
  }
  __syncthreads();
  const float top = s.max, lse = s.lse;

  // Candidates: the num_candidates first of the ranking, gathered in id order, then sorted.
  if (spec.num_candidates > 0) {
    const rank_cut cut = radix_select<false>(s, row, vocab, unsigned(spec.num_candidates), 0u, top, 1.0f);
    const std::int64_t last_tie = nth_tie(s, row, seg, cut.key, cut.ties);
    unsigned long long count = 0;
    for (std::int64_t i = seg.begin; i < seg.end; ++i) {
      const std::uint32_t key = order_key(row[i]);
      count += key > cut.key || (key == cut.key && i <= last_tie);
    }
    unsigned long long at = 0;
    sample_storage::scan_u64(s.cub.scan).ExclusiveSum(count, at);
    for (std::int64_t i = seg.begin; i < seg.end; ++i) {
      const std::uint32_t key = order_key(row[i]);
      if (key > cut.key || (key == cut.key && i <= last_tie))  // key high, the lower id first on equal keys
        s.gathered[at++] = (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - std::uint32_t(i));
    }
    __syncthreads();
    unsigned long long item[1] = {threadIdx.x < unsigned(spec.num_candidates) ? s.gathered[threadIdx.x] : 0ull};
    sample_storage::sort(s.cub.sort).SortDescending(item);
    if (threadIdx.x < unsigned(spec.num_candidates)) {
      const auto id = std::int32_t(0xffffffffu - std::uint32_t(item[0] & 0xffffffffu));
      p.candidates[spec.candidate_offset + int(threadIdx.x)] = {id, row[id] - lse};
    }
    __syncthreads();
  }
  if (spec.num_draws == 0) return;

  if (spec.temperature <= 0.0f || spec.top_k == 1) {  // greedy
    for (int d = threadIdx.x; d < spec.num_draws; d += sample_threads)
      p.draws[spec.draw_offset + d] = {s.argmax, row[s.argmax] - lse};
    return;
  }
  const float inv_t = 1.0f / spec.temperature;
  const auto weight = [&](float x) { return __double2ull_rn(double(expf((x - top) * inv_t)) * weight_scale); };

  // The kept tokens: key > cut.key, and the `ties` lowest ids of key == cut.key; everything when
  // there is no cut.
  bool has_cut = false;
  rank_cut cut{0u, 0ull};
  std::uint32_t floor = 0u;
  if (spec.top_k > 0 && spec.top_k < vocab) {
    cut = radix_select<false>(s, row, vocab, unsigned(spec.top_k), 0u, top, inv_t);
    has_cut = true;
    floor = cut.key;
  }
  if (spec.top_p < 1.0f) {
    // The kept weight so far, then the shortest prefix reaching top_p of it (ties at the top-k
    // threshold are counted whole by the select, which cannot move a cut above that threshold).
    unsigned long long mine_w = 0;
    for (std::int64_t i = threadIdx.x; i < vocab; i += sample_threads) {
      const float x = row[i];
      if (!has_cut || order_key(x) > cut.key) mine_w += weight(x);
    }
    unsigned long long kept_weight = sample_storage::reduce_u64(s.cub.sum).Sum(mine_w);
    if (threadIdx.x == 0) s.remaining = kept_weight + (has_cut ? cut.ties * weight(key_value(cut.key)) : 0ull);
    __syncthreads();
    kept_weight = s.remaining;
    __syncthreads();
    const unsigned long long target = min(
        kept_weight, max(1ull, static_cast<unsigned long long>(ceil(double(spec.top_p) * double(kept_weight)))));
    const rank_cut by_weight = radix_select<true>(s, row, vocab, target, floor, top, inv_t);
    const unsigned long long w = weight(key_value(by_weight.key));
    unsigned long long ties = w > 0 ? (by_weight.ties + w - 1) / w : 1ull;
    if (has_cut && by_weight.key == cut.key) ties = min(ties, cut.ties);
    cut = {by_weight.key, max(ties, 1ull)};
    has_cut = true;
  }
  const std::int64_t last_tie = has_cut ? nth_tie(s, row, seg, cut.key, cut.ties) : vocab;
  const auto kept = [&](std::int64_t i, std::uint32_t key) {
    return !has_cut || key > cut.key || (key == cut.key && i <= last_tie);
  };

  // The draws: inverse CDF over the kept weights in id order.
  unsigned long long mass = 0;
  for (std::int64_t i = seg.begin; i < seg.end; ++i) {
    const float x = row[i];
    if (kept(i, order_key(x))) mass += weight(x);
  }
  unsigned long long before = 0, total = 0;
  sample_storage::scan_u64(s.cub.scan).ExclusiveSum(mass, before, total);
  for (int d = 0; d < spec.num_draws; ++d) {
    const unsigned long long target =
        min(total - 1, static_cast<unsigned long long>(p.uniforms[spec.draw_offset + d] * double(total)));
    if (before <= target && target < before + mass) {
      unsigned long long running = before;
      for (std::int64_t i = seg.begin; i < seg.end; ++i) {
        const float x = row[i];
        if (!kept(i, order_key(x))) continue;
        running += weight(x);
        if (running > target) {
          p.draws[spec.draw_offset + d] = {std::int32_t(i), x - lse};
          break;
        }
      }
    }
  }
}

}  // namespace pagedkv::llama::cuda
