#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <unordered_map>

#include <pagedkv/error.hpp>

namespace pagedkv::llama {

namespace {

using clock_type = std::chrono::steady_clock;

/// Finished requests out of the total: a bar redrawn at most ten times a second on a terminal,
/// otherwise a line each time another tenth of the requests has finished, so logs stay short.
class progress_report {
 public:
  progress_report(std::FILE* out, std::int32_t total)
      : out_(out), total_(std::max(total, 1)), terminal_(out && isatty(fileno(out)) != 0),
        every_(std::max(1, (total + 9) / 10)), start_(clock_type::now()) {}

  void update(std::int32_t finished, std::int64_t steps) {
    if (!out_) return;
    const auto now = clock_type::now();
    const double seconds = std::chrono::duration<double>(now - start_).count();
    if (terminal_) {
      if (finished < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      constexpr int width = 30;
      const int filled = finished * width / total_;
      std::fprintf(out_, "\r[%s%s] %d/%d requests, step %lld, %.1f s%s", std::string(std::size_t(filled), '#').c_str(),
                   std::string(std::size_t(width - filled), '.').c_str(), finished, total_,
                   static_cast<long long>(steps), seconds, finished == total_ ? "\n" : "");
    } else {
      const bool new_tenth = finished / every_ > last_printed_ / every_ || (finished == total_ && last_printed_ < total_);
      if (!new_tenth) return;
      last_printed_ = finished;
      std::fprintf(out_, "bench: %d/%d requests finished, step %lld, %.1f s\n", finished, total_,
                   static_cast<long long>(steps), seconds);
    }
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
  std::int32_t total_;
  bool terminal_;
  std::int32_t every_;
  clock_type::time_point start_;
  clock_type::time_point last_draw_{};
  std::int32_t last_printed_ = 0;
};

/// The q-quantile of `values` (nearest rank), 0 for none.
/// The missed prompt tokens by reason, the nonzero ones, as "never_stored 40 (12.5%), ...", each
/// a share of the prompt tokens looked up; "evicted" names the policy.
std::string miss_breakdown(const bench_result& r) {
  const prefix_lookup& m = r.prefix_misses;
  std::string out;
  char item[96];
  for (std::size_t i = 0; i < num_miss_reasons; ++i) {
    if (m.missed_tokens[i] == 0) continue;
    const auto reason = static_cast<miss_reason>(i);
    const std::string name = reason == miss_reason::evicted ? "evicted (" + std::string(r.eviction_name) + ")"
                                                             : std::string(to_string(reason));
    std::snprintf(item, sizeof item, "%s%s %lld (%.1f%%)", out.empty() ? "" : ", ", name.c_str(),
                  static_cast<long long>(m.missed_tokens[i]),
                  m.num_prompt_tokens > 0 ? 100.0 * double(m.missed_tokens[i]) / double(m.num_prompt_tokens) : 0.0);
    out += item;
  }
  return out.empty() ? "none" : out;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const auto rank = std::size_t(std::ceil(q * double(values.size())));
  return values[std::min(values.size() - 1, rank > 0 ? rank - 1 : 0)];
}

}  // namespace

bench_result run_bench(engine& e, const std::vector<bench_request>& workload, sampling_params params,
                       std::FILE* progress) {
  if (e.has_unfinished()) detail::fail(errc::invalid_argument, "run_bench: the engine already has requests");
  params.ignore_eos = true;
  std::vector<request_id> ids;
  for (const bench_request& r : workload) {
    params.max_tokens = r.output_tokens;
    ids.push_back(e.add_request(r.prompt, params));
  }

  bench_result out;
  out.num_requests = std::int32_t(workload.size());
  out.num_kv_blocks = e.options().num_blocks;
  progress_report report(progress, out.num_requests);
  std::int64_t steps_with_used_blocks = 0;
  // Sample 0's first and last token time and count, by request.
  struct token_times {
    clock_type::time_point first{}, last{};
    std::int64_t count = 0;
  };
  std::unordered_map<request_id, token_times> times;
  e.on_token([&](request_id id, std::int32_t sample, token_id) {
    if (sample != 0) return;
    token_times& t = times[id];
    t.last = clock_type::now();
    if (t.count++ == 0) t.first = t.last;
  });
  constexpr std::size_t num_buckets = std::size(decode_bucket_floors);
  out.decode_buckets.assign(num_buckets, {});
  const engine_stats before = e.stats();
  const auto start = clock_type::now();
  // A step's time is the time between consecutive step() returns: with asynchronous scheduling
  // step() launches the next step and returns once this one's tokens are back, so that is still
  // one step of the device's time.
  for (auto step_start = start;; step_start = clock_type::now()) {
    if (!e.step()) break;
    const engine_stats& stats = e.stats();
    const double step_s = std::chrono::duration<double>(clock_type::now() - step_start).count();
    if (stats.last_step_decode_only && stats.last_step_seqs >= decode_batch_floor) {
      ++out.num_decode_steps;
      out.mean_decode_step_s += step_s;
      out.mean_decode_batch += stats.last_step_seqs;
      out.mean_decode_kv_tokens += double(stats.last_step_kv_tokens);
    }
    if (stats.last_step_decode_only && stats.last_step_seqs > 0) {
      std::size_t b = num_buckets - 1;
      while (stats.last_step_seqs < decode_bucket_floors[b]) --b;
      bench_result::decode_bucket& bucket = out.decode_buckets[b];
      ++bucket.num_steps;
      bucket.mean_step_s += step_s;
      bucket.mean_batch += stats.last_step_seqs;
      bucket.mean_kv_tokens += double(stats.last_step_kv_tokens);
    } else if (stats.last_step_seqs > 0) {
      bench_result::step_share& p = out.prefill_steps;
      ++p.num_steps;
      p.seconds += step_s;
      p.mean_tokens += stats.last_step_tokens;
      p.mean_seqs += stats.last_step_seqs;
    }
    ++out.num_steps;
    const kv_cache_usage usage = e.kv_usage();
    const double used = double(usage.num_used_blocks) / double(usage.num_blocks);
    out.mean_kv_usage += used;
    out.peak_kv_usage = std::max(out.peak_kv_usage, used);
    if (usage.num_used_blocks > 0) {
      out.mean_slot_fill += usage.utilization;
      ++steps_with_used_blocks;
    }
    const auto finished = std::count_if(ids.begin(), ids.end(), [&](request_id id) { return e.result(id).finished; });
    report.update(std::int32_t(finished), out.num_steps);
  }
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  e.on_token(nullptr);
  if (out.num_decode_steps > 0) {
    out.mean_decode_step_s /= double(out.num_decode_steps);
    out.mean_decode_batch /= double(out.num_decode_steps);
    out.mean_decode_kv_tokens /= double(out.num_decode_steps);
  }
  for (bench_result::decode_bucket& bucket : out.decode_buckets) {
    if (bucket.num_steps == 0) continue;
    bucket.mean_step_s /= double(bucket.num_steps);
    bucket.mean_batch /= double(bucket.num_steps);
    bucket.mean_kv_tokens /= double(bucket.num_steps);
  }
  if (out.prefill_steps.num_steps > 0) {
    out.prefill_steps.mean_tokens /= double(out.prefill_steps.num_steps);
    out.prefill_steps.mean_seqs /= double(out.prefill_steps.num_steps);
  }
  out.num_async_steps = e.stats().num_async_steps - before.num_async_steps;
  out.num_discarded_tokens = e.stats().num_discarded_tokens - before.num_discarded_tokens;
  std::vector<double> ttft, tpot;
  for (const auto& [id, t] : times) {
    ttft.push_back(std::chrono::duration<double>(t.first - start).count());
    if (t.count > 1) tpot.push_back(std::chrono::duration<double>(t.last - t.first).count() / double(t.count - 1));
  }
  out.ttft_p50_s = percentile(ttft, 0.50);
  out.ttft_p99_s = percentile(ttft, 0.99);
  out.tpot_p50_s = percentile(tpot, 0.50);
  out.tpot_p99_s = percentile(tpot, 0.99);
  if (out.num_steps > 0) out.mean_kv_usage /= double(out.num_steps);
  if (steps_with_used_blocks > 0) out.mean_slot_fill /= double(steps_with_used_blocks);
  const kv_cache_usage usage = e.kv_usage();
  out.prefix_hit_rate = usage.prefix_hit_rate + usage.partial_hit_rate + usage.shared_hit_rate;
  out.partial_hit_rate = usage.partial_hit_rate;
  out.shared_hit_rate = usage.shared_hit_rate;
  out.prefix_misses = e.prefix_misses();
  out.eviction_name = engine::eviction_name();
  out.num_preemptions = e.num_preemptions();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const request_result& r = e.result(ids[i]);
    if (r.rejected) {
      ++out.num_rejected;
      continue;
    }
    out.prompt_tokens += std::int64_t(workload[i].prompt.size());
    for (const completion& c : r.completions) out.output_tokens += std::int64_t(c.tokens.size());
  }
  return out;
}

void print_bench_result(std::ostream& out, const bench_result& r, const bench_roofline* roofline) {
  char line[200];
  const auto print = [&](const char* format, auto... values) {
    std::snprintf(line, sizeof line, format, values...);
    out << line << '\n';
  };
  print("requests           %d (%d rejected), %lld prompt + %lld output tokens, %lld steps, %.2f s", r.num_requests,
        r.num_rejected, static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.output_tokens),
        static_cast<long long>(r.num_steps), r.seconds);
  print("requests/s         %.3f", r.requests_per_s());
  print("output tokens/s    %.2f", r.output_tokens_per_s());
  print("total tokens/s     %.2f", r.total_tokens_per_s());
  print("KV cache usage     mean %.1f%%, peak %.1f%% of %d blocks (blocks in use after each step)",
        100 * r.mean_kv_usage, 100 * r.peak_kv_usage, r.num_kv_blocks);
  print("KV slot fill       %.1f%% (filled slots of the blocks in use, mean over steps)", 100 * r.mean_slot_fill);
  print("prefix hit rate    %.1f%% (prompt tokens not computed: %.1f%% partial blocks, %.1f%% shared in flight)",
        100 * r.prefix_hit_rate, 100 * r.partial_hit_rate, 100 * r.shared_hit_rate);
  print("prefix misses      %s", miss_breakdown(r).c_str());
  print("preemptions        %lld", static_cast<long long>(r.num_preemptions));
  print("TTFT               p50 %.3f s, p99 %.3f s (every request arrives at the start)", r.ttft_p50_s, r.ttft_p99_s);
  print("TPOT               p50 %.2f ms, p99 %.2f ms", 1e3 * r.tpot_p50_s, 1e3 * r.tpot_p99_s);
  if (r.num_decode_steps > 0)
    print("decode step        mean %.2f ms over %lld steps of >= %d sequences (mean batch %.1f, %.0f KV tokens read)",
          1e3 * r.mean_decode_step_s, static_cast<long long>(r.num_decode_steps), decode_batch_floor,
          r.mean_decode_batch, r.mean_decode_kv_tokens);
  if (roofline && r.num_decode_steps > 0) {
    const double floor_s = roofline->step_s(r.mean_decode_kv_tokens);
    print("decode roofline    %.2f ms: %.2f GB weights + %.2f GB KV at %.0f GB/s read (measured); step / roofline %.2fx",
          1e3 * floor_s, roofline->weight_bytes / 1e9, r.mean_decode_kv_tokens * roofline->kv_bytes_per_token / 1e9,
          roofline->read_bytes_per_s / 1e9, r.mean_decode_step_s / floor_s);
  }
  // The run's wall time split by step kind: decode-only steps by batch (against the roofline on
  // a GPU) and the steps that computed prompt tokens.
  const double run_s = std::max(r.seconds, 1e-9);
  for (std::size_t b = 0; b < r.decode_buckets.size() && b < std::size(decode_bucket_floors); ++b) {
    const bench_result::decode_bucket& bucket = r.decode_buckets[b];
    if (bucket.num_steps == 0) continue;
    char range[32];
    if (b + 1 < std::size(decode_bucket_floors)) std::snprintf(range, sizeof range, "%d-%d", decode_bucket_floors[b], decode_bucket_floors[b + 1] - 1);
    else std::snprintf(range, sizeof range, "%d+", decode_bucket_floors[b]);
    const double total_s = bucket.mean_step_s * double(bucket.num_steps);
    if (roofline) {
      const double floor_s = roofline->step_s(bucket.mean_kv_tokens);
      print("decode batch %-7s %.2f ms over %lld steps (mean batch %.1f), roofline %.2f ms: %.2fx; %.2f s, %.1f%% of the run",
            range, 1e3 * bucket.mean_step_s, static_cast<long long>(bucket.num_steps), bucket.mean_batch, 1e3 * floor_s,
            bucket.mean_step_s / floor_s, total_s, 100.0 * total_s / run_s);
    } else {
      print("decode batch %-7s %.2f ms over %lld steps (mean batch %.1f); %.2f s, %.1f%% of the run", range,
            1e3 * bucket.mean_step_s, static_cast<long long>(bucket.num_steps), bucket.mean_batch, total_s,
            100.0 * total_s / run_s);
    }
  }
  if (r.prefill_steps.num_steps > 0)
    print("prefill steps      %.2f ms over %lld steps (mean %.0f tokens of %.1f sequences); %.2f s, %.1f%% of the run",
          1e3 * r.prefill_steps.seconds / double(r.prefill_steps.num_steps),
          static_cast<long long>(r.prefill_steps.num_steps), r.prefill_steps.mean_tokens, r.prefill_steps.mean_seqs,
          r.prefill_steps.seconds, 100.0 * r.prefill_steps.seconds / run_s);
  print("async scheduling   %lld of %lld steps launched before the previous step's tokens were known; %lld tokens discarded",
        static_cast<long long>(r.num_async_steps), static_cast<long long>(r.num_steps),
        static_cast<long long>(r.num_discarded_tokens));
  if (roofline && r.seconds > 0)
    print("GPU idle           %.1f%% of the wall time (busy %.2f of %.2f s)",
          100.0 * std::max(0.0, 1.0 - roofline->gpu_busy_s / r.seconds), roofline->gpu_busy_s, r.seconds);
}

}  // namespace pagedkv::llama
