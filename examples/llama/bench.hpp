// pagedkv-llama --bench: serves a synthetic workload (bench_workload.hpp) through the engine and
// reports throughput and how the KV cache was used.
//
//   const auto workload = make_bench_workload({.num_requests = 16, .vocab_size = 49152, .seed = 1});
//   const bench_result r = run_bench(e, workload, {}, stderr);
//   print_bench_result(std::cout, r);
#pragma once

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string_view>
#include <vector>

#include "bench_workload.hpp"
#include "engine.hpp"

namespace pagedkv::llama {

struct bench_result {
  std::int32_t num_requests = 0;
  std::int32_t num_rejected = 0;      ///< prompts that can never fit in the KV pool
  std::int64_t prompt_tokens = 0;     ///< of the requests served (rejected ones left out)
  std::int64_t output_tokens = 0;     ///< generated, every sample of every request
  std::int64_t num_steps = 0;
  double seconds = 0.0;               ///< wall time from the first step to the last
  double mean_kv_usage = 0.0;         ///< used blocks / capacity after each step, mean over steps
  double peak_kv_usage = 0.0;         ///< the same, largest
  double mean_slot_fill = 0.0;        ///< kv_cache_usage::utilization, mean over steps with used blocks
  double prefix_hit_rate = 0.0;       ///< prompt tokens not computed (cache hits, partial and shared) at the end
  double partial_hit_rate = 0.0;      ///< kv_cache_usage::partial_hit_rate at the end
  double shared_hit_rate = 0.0;       ///< kv_cache_usage::shared_hit_rate at the end
  prefix_lookup prefix_misses{};      ///< engine::prefix_misses at the end: the missed tokens by reason
  std::string_view eviction_name{};   ///< the eviction policy that miss_reason::evicted blames
  std::int64_t num_preemptions = 0;
  std::int32_t num_kv_blocks = 0;
  // Latency, every request arriving at the start: time to its first token, and per output token
  // after it ((last - first) / (tokens - 1), sample 0); p50 and p99 over the requests.
  double ttft_p50_s = 0.0, ttft_p99_s = 0.0;
  double tpot_p50_s = 0.0, tpot_p99_s = 0.0;
  // Steps whose every sequence decoded one token, with at least decode_batch_floor sequences.
  std::int64_t num_decode_steps = 0;
  double mean_decode_step_s = 0.0;
  double mean_decode_batch = 0.0;
  double mean_decode_kv_tokens = 0.0;  ///< tokens whose K/V one such step's attention read
  /// Every decode-only step by batch size, small ones too: decode_bucket_floors[i] <= batch <
  /// decode_bucket_floors[i + 1]. With prefill_steps they split the run's wall time.
  struct decode_bucket {
    std::int64_t num_steps = 0;
    double mean_step_s = 0.0, mean_batch = 0.0, mean_kv_tokens = 0.0;
  };
  std::vector<decode_bucket> decode_buckets{};
  /// Steps that computed prompt tokens (a prefill chunk, alone or beside decodes).
  struct step_share {
    std::int64_t num_steps = 0;
    double seconds = 0.0;        ///< their wall time in all
    double mean_tokens = 0.0;    ///< tokens computed a step
    double mean_seqs = 0.0;      ///< sequences a step
  };
  step_share prefill_steps{};
  std::int64_t num_async_steps = 0;       ///< engine_stats::num_async_steps over the run
  std::int64_t num_discarded_tokens = 0;  ///< engine_stats::num_discarded_tokens over the run
  [[nodiscard]] double requests_per_s() const { return seconds > 0 ? num_requests / seconds : 0.0; }
  [[nodiscard]] double output_tokens_per_s() const { return seconds > 0 ? double(output_tokens) / seconds : 0.0; }
  [[nodiscard]] double total_tokens_per_s() const {
    return seconds > 0 ? double(prompt_tokens + output_tokens) / seconds : 0.0;
  }
};

/// Decode steps of at least this many sequences count in bench_result's decode figures.
inline constexpr std::int32_t decode_batch_floor = 64;
/// The batch buckets of bench_result::decode_buckets: 1-7, 8-15, 16-31, 32-63, 64-95, 96-127,
/// 128-191, 192 and more.
inline constexpr std::int32_t decode_bucket_floors[] = {1, 8, 16, 32, decode_batch_floor, 96, 128, 192};

/// What bounds a decode step from below on a GPU: every weight and every live token's K/V read
/// once, at the device's read ceiling (measured in the same run).
struct bench_roofline {
  double weight_bytes = 0.0;         ///< read by one step (every layer and the LM head)
  double kv_bytes_per_token = 0.0;   ///< K and V of one token, every layer
  double read_bytes_per_s = 0.0;     ///< measured read ceiling
  double gpu_busy_s = 0.0;           ///< the backend's GPU time over the run, to tell idle time
  [[nodiscard]] double step_s(double kv_tokens) const {
    return (weight_bytes + kv_tokens * kv_bytes_per_token) / read_bytes_per_s;
  }
};

/// Queues every request of `workload` with `params` (max_tokens set to the request's output length,
/// EOS ignored) on an engine with no requests yet, and steps it until all have finished, reading
/// kv_usage() after every step. `progress` (e.g. stderr) shows a bar redrawn in place when it is a
/// terminal, otherwise a line every tenth of the requests; null shows nothing.
/// Throws pagedkv::error (invalid_argument) when the engine already has requests.
bench_result run_bench(engine& e, const std::vector<bench_request>& workload, sampling_params params,
                       std::FILE* progress);

/// The figures of `r`, one per line, each "name value" (the CLI's smoke test matches these lines);
/// with a roofline (GPU runs), the decode step against it and the GPU's idle share of the run.
void print_bench_result(std::ostream& out, const bench_result& r, const bench_roofline* roofline = nullptr);

}  // namespace pagedkv::llama
