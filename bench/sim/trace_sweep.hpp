// Block-size sweeps on a trace: runs run_paged() (the library's scheduler and manager) once per
// block size x pool capacity x host tier x free list x eviction policy x scheduler limits and
// collects what each run measured, for `pagedkv-sim --trace FILE` (docs/simulation.md, "Your own
// trace"). The runs themselves are compiled in trace_sweep.cpp (target pagedkv_sim_sweep).
#pragma once

#include "sim/limits.hpp"
#include "sim/metrics.hpp"
#include "sim/paged.hpp"
#include "sim/workload.hpp"

#include <pagedkv/error.hpp>
#include <pagedkv/prefix_lookup.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <iomanip>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pagedkv::sim {

/// The eviction policies a sweep can compare (eviction.hpp, retention.hpp), each used by the device
/// cache and by the host tier when there is one, except ttl: ttl_eviction<lru_eviction> in steps in
/// the host tier over LRU on the device (a device TTL holds back blocks the scheduler counts on:
/// docs/simulation.md), so with no tier it is LRU.
enum class eviction_choice { lru, priority, tinylfu, ttl };

inline const char* to_string(eviction_choice e) {
  switch (e) {
    case eviction_choice::lru: return "lru";
    case eviction_choice::priority: return "priority";
    case eviction_choice::tinylfu: return "tinylfu";
    case eviction_choice::ttl: return "ttl";
  }
  return "?";
}

/// The free-list policies a sweep can compare (free_list.hpp), the device pool's. A free list
/// picks which free block id an allocation takes, not how many are free (idle cached blocks wait
/// in the eviction queue, not on it), so every figure but `kv_event_digest` (the events name
/// blocks) comes out the same for each: the sweep shows it on the user's trace. `extent` has the
/// manager ask for blocks near each sequence's last one, in extents of 64 blocks. lru_free_list
/// is not offered: it hands out ids in fifo_free_list's order (what it adds, taking one particular
/// free block, the manager never does), so it would only repeat fifo's rows at the cost of four
/// more instantiations of the scheduler.
enum class free_list_choice { lifo, fifo, extent };

inline const char* to_string(free_list_choice f) {
  switch (f) {
    case free_list_choice::lifo: return "lifo";
    case free_list_choice::fifo: return "fifo";
    case free_list_choice::extent: return "extent";
  }
  return "?";
}

struct sweep_config {
  std::vector<std::int32_t> block_sizes{16};
  std::vector<std::int64_t> capacities_slots{16384};  ///< each divisible by every block size
  std::vector<eviction_choice> evictions{eviction_choice::lru};
  std::vector<free_list_choice> free_lists{free_list_choice::lifo};
  std::vector<bool> partial_reuse{true};  ///< partial prefix hits on (true) and/or off
  /// Host tiers of the prefix cache, each as a multiple of the device pool's blocks (0: none).
  std::vector<double> host_tier_ratios{0};
  std::int64_t ttl_steps = 1000;  ///< for eviction_choice::ttl
  bool write_through = false;     ///< host tiers copy every block the device cache stores
  std::vector<std::int32_t> max_running_sequences{256};  ///< the scheduler's limits, swept
  std::vector<std::int32_t> max_tokens_per_step{2048};
  /// Runs at once, each on its own thread (the runs share nothing, so the rows are the same).
  std::int32_t threads = 1;
  /// A model of KV cache groups (`pagedkv-sim --trace --hybrid`): every run on
  /// hybrid_kv_cache_manager<> (LIFO, LRU, no host tier) over these; empty: kv_cache_manager.
  std::vector<kv_cache_spec> groups{};
};

/// One run of the sweep. `result` is empty when the trace cannot run at this point: a request
/// can never fit the pool (`note` names it).
struct sweep_row {
  std::int32_t block_size = 0;
  std::int64_t capacity_slots = 0;
  eviction_choice eviction = eviction_choice::lru;
  std::optional<summary> result;
  std::string note;
  free_list_choice free_list = free_list_choice::lifo;
  bool partial_reuse = true;
  double host_tier_ratio = 0;        ///< the host tier as a multiple of the device pool
  std::int32_t host_tier_blocks = 0;
  std::int32_t max_running_sequences = 0;
  std::int32_t max_tokens_per_step = 0;
};

/// One run: run_paged() over kv_cache_manager<FreeList, xxh3_hash, Eviction> and a
/// host_prefix_tier<Eviction> of the chosen policies (ttl: LRU on the device, ttl_eviction over LRU
/// in the tier). Defined in trace_sweep.cpp, the one place that instantiates the scheduler for
/// every free list x eviction policy (12 run_paged()s, which pagedkv-sim and test_trace_file
/// link rather than each compiling them).
summary run_sweep_point(free_list_choice free_list, eviction_choice eviction, const trace& requests,
                        const paged_config& point, const progress_fn& report);
/// One run over hybrid_kv_cache_manager<> with point.groups (also in trace_sweep.cpp).
summary run_hybrid_sweep_point(const trace& requests, const paged_config& point, const progress_fn& report);

/// The number of runs a sweep makes: the product of its lists' sizes.
inline std::size_t num_sweep_points(const sweep_config& c) {
  return c.block_sizes.size() * c.capacities_slots.size() * c.host_tier_ratios.size() * c.free_lists.size() *
         c.partial_reuse.size() * c.evictions.size() * c.max_running_sequences.size() * c.max_tokens_per_step.size();
}

/// Runs every point of the sweep over `requests`, in the order block size, capacity, host tier,
/// free list, partial reuse, eviction, max running sequences, max batched tokens, `threads` runs at once (the
/// rows do not depend on it). `progress(done_requests, total_requests)` is called as runs advance,
/// from one thread at a time.
/// Errors: invalid_argument, before any run, for an empty list, a block size outside [1,
/// max_block_size], a capacity that a block size does not divide, or limits check_limits refuses.
inline std::vector<sweep_row> run_trace_sweep(const trace& requests, const sweep_config& config,
                                              const std::function<void(std::size_t, std::size_t)>& progress = {}) {
  if (num_sweep_points(config) == 0) {
    pagedkv::detail::fail(errc::invalid_argument, "trace sweep: every swept list needs at least one value");
  }
  for (double ratio : config.host_tier_ratios) {
    if (!(ratio >= 0 && ratio <= 1024)) {
      pagedkv::detail::fail(errc::invalid_argument, "trace sweep: host tier ratio ", ratio, " is not in [0, 1024]");
    }
  }
  if (config.ttl_steps < 0) pagedkv::detail::fail(errc::invalid_argument, "trace sweep: TTL of ", config.ttl_steps, " steps");
  if (!config.groups.empty() &&
      (config.free_lists != std::vector{free_list_choice::lifo} || config.evictions != std::vector{eviction_choice::lru} ||
       config.host_tier_ratios != std::vector{0.0})) {
    pagedkv::detail::fail(errc::invalid_argument,
                          "trace sweep: KV cache groups run with the LIFO free list, LRU and no host tier only");
  }
  for (std::int64_t capacity : config.capacities_slots) {
    for (std::int32_t seqs : config.max_running_sequences) {
      for (std::int32_t tokens : config.max_tokens_per_step) {
        check_limits({.capacity_slots = capacity, .max_running_sequences = seqs, .max_tokens_per_step = tokens});
      }
    }
    for (std::int32_t block_size : config.block_sizes) {
      if (block_size < 1 || block_size > max_block_size || capacity % block_size != 0) {
        pagedkv::detail::fail(errc::invalid_argument, "trace sweep: block size ", block_size,
                              " does not divide the capacity of ", capacity, " slots (or is outside [1, ",
                              max_block_size, "])");
      }
      for (double ratio : config.host_tier_ratios) {
        if (std::llround(ratio * static_cast<double>(capacity / block_size)) > max_num_blocks) {
          pagedkv::detail::fail(errc::invalid_argument, "trace sweep: a host tier of ", ratio, " x ",
                                capacity / block_size, " blocks is over ", max_num_blocks);
        }
      }
    }
  }
  std::vector<sweep_row> rows;
  for (std::int32_t block_size : config.block_sizes) {
    for (std::int64_t capacity : config.capacities_slots) {
      for (double ratio : config.host_tier_ratios) {
        for (free_list_choice free_list : config.free_lists) {
          for (const bool partial : config.partial_reuse) {
            for (eviction_choice eviction : config.evictions) {
              for (std::int32_t seqs : config.max_running_sequences) {
                for (std::int32_t tokens : config.max_tokens_per_step) {
                  rows.push_back({.block_size = block_size, .capacity_slots = capacity, .eviction = eviction,
                                  .result = {}, .note = {}, .free_list = free_list, .partial_reuse = partial,
                                  .host_tier_ratio = ratio,
                                  .host_tier_blocks = static_cast<std::int32_t>(
                                      std::llround(ratio * static_cast<double>(capacity / block_size))),
                                  .max_running_sequences = seqs, .max_tokens_per_step = tokens});
                }
              }
            }
          }
        }
      }
    }
  }
  const std::size_t total = requests.size() * rows.size();
  std::mutex progress_mutex;
  std::vector<std::size_t> finished(rows.size(), 0);  // per run, under progress_mutex
  std::size_t finished_sum = 0;
  const auto report_progress = [&](std::size_t index, std::size_t now) {
    if (!progress) return;
    const std::scoped_lock lock(progress_mutex);
    finished_sum += now - finished[index];
    finished[index] = now;
    progress(finished_sum, total);
  };
  const auto run = [&](std::size_t index) {
    sweep_row& row = rows[index];
    const paged_config point{.block_size = row.block_size,
                             .limits = {.capacity_slots = row.capacity_slots,
                                        .max_running_sequences = row.max_running_sequences,
                                        .max_tokens_per_step = row.max_tokens_per_step},
                             .sharing = true,
                             .host_tier_blocks = row.host_tier_blocks,
                             .ttl_steps = config.ttl_steps,
                             .write_through = config.write_through,
                             .partial_reuse = row.partial_reuse,
                             .groups = config.groups};
    const progress_fn report = [&](std::size_t done, std::size_t) { report_progress(index, done); };
    try {
      row.result = config.groups.empty() ? run_sweep_point(row.free_list, row.eviction, requests, point, report)
                                         : run_hybrid_sweep_point(requests, point, report);
    } catch (const error& e) {
      if (e.code() != errc::out_of_blocks) throw;
      row.note = e.what();
    }
    report_progress(index, requests.size());
  };
  // Workers take the next run in order; the first exception (other than a pool too small, which
  // the row notes) stops them and is rethrown here.
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const auto work = [&] {
    for (std::size_t i = next++; i < rows.size(); i = next++) {
      try {
        run(i);
      } catch (...) {
        const std::scoped_lock lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = rows.size();
      }
    }
  };
  std::vector<std::thread> workers;
  const auto num_threads = std::clamp<std::size_t>(static_cast<std::size_t>(std::max(config.threads, 1)), 1, rows.size());
  for (std::size_t t = 1; t < num_threads; ++t) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
  if (failure) std::rethrow_exception(failure);
  return rows;
}

/// Waste: the share of reserved slots (blocks held by running sequences x block size) that held
/// no token, over every step: the unfilled tails of last blocks.
inline double waste(const summary& s) { return s.all.kv_utilization > 0 ? 1.0 - s.all.kv_utilization : 0.0; }

inline void write_sweep_csv(std::ostream& out, const std::vector<sweep_row>& rows, std::size_t num_requests) {
  out << "block_size,capacity_slots,num_blocks,free_list,partial_reuse,eviction,requests,finished_requests,total_steps,"
         "throughput_requests_per_step,preemptions,prefix_hit_rate,partial_hit_rate,shared_hit_rate,waste,kv_utilization_all_steps,"
         "saturated_steps,kv_utilization,internal_fraction,mean_running_sequences,peak_reserved_slots,"
         "sharing_saving,host_tier_blocks,prompt_tokens,cached_prompt_tokens,loaded_prompt_tokens,"
         "recomputed_prompt_tokens,max_running_sequences,max_tokens_per_step,kv_events,kv_event_digest,";
  for (std::size_t i = 0; i < num_miss_reasons; ++i) out << "missed_" << to_string(static_cast<miss_reason>(i)) << ',';
  out << "note\n";
  const auto precise = std::setprecision(17);
  for (const sweep_row& r : rows) {
    out << r.block_size << ',' << r.capacity_slots << ',' << r.capacity_slots / r.block_size << ','
        << to_string(r.free_list) << ',' << (r.partial_reuse ? "on" : "off") << ',' << to_string(r.eviction) << ','
        << num_requests << ',';
    if (r.result) {
      const summary& s = *r.result;
      out << precise << s.finished_requests << ',' << s.total_steps << ',' << s.throughput_requests_per_step << ','
          << s.preemptions << ',' << s.prefix_hit_rate << ',' << s.partial_hit_rate << ',' << s.shared_hit_rate << ','
          << waste(s) << ',' << s.all.kv_utilization << ','
          << s.saturated.steps << ',' << s.saturated.kv_utilization << ',' << s.saturated.internal_fraction << ','
          << s.mean_running_sequences << ',' << s.peak_reserved_slots << ',' << s.sharing_saving << ','
          << r.host_tier_blocks << ',' << s.prompt_tokens << ',' << s.cached_prompt_tokens << ','
          << s.loaded_prompt_tokens << ',' << s.recomputed_prompt_tokens() << ',' << r.max_running_sequences << ','
          << r.max_tokens_per_step << ',' << s.kv_events << ',' << s.kv_event_digest << ',';
      for (std::int64_t n : s.prefix_misses.missed_tokens) out << n << ',';
      out << '\n';
    } else {
      std::string note = r.note;
      for (char& c : note) c = c == '"' ? '\'' : c;
      out << ",,,,,,,,,,,,,,," << r.host_tier_blocks << ",,,,," << r.max_running_sequences << ','
          << r.max_tokens_per_step << ",,," << std::string(num_miss_reasons, ',') << '"' << note << "\"\n";
    }
  }
}

/// Prompt tokens the device cache or the host tier served / prompt tokens looked up.
inline double tier_hit_rate(const summary& s) {
  return s.prompt_tokens == 0 ? 0.0
                              : static_cast<double>(s.cached_prompt_tokens + s.loaded_prompt_tokens) /
                                    static_cast<double>(s.prompt_tokens);
}

/// The sweep as a fixed-width table for a terminal, with a free-list column when the sweep varies
/// the free list, and a partial-reuse one when it varies that.
inline void print_sweep_table(std::ostream& out, const std::vector<sweep_row>& rows) {
  const bool free_lists = std::any_of(rows.begin(), rows.end(),
                                      [&](const sweep_row& r) { return r.free_list != rows.front().free_list; });
  const bool partial = std::any_of(rows.begin(), rows.end(),
                                   [&](const sweep_row& r) { return r.partial_reuse != rows.front().partial_reuse; });
  out << std::setw(6) << "block" << std::setw(10) << "capacity";
  if (free_lists) out << std::setw(10) << "free list";
  if (partial) out << std::setw(9) << "partial";
  out << std::setw(10) << "eviction" << std::setw(10) << "finished" << std::setw(9) << "steps" << std::setw(11)
      << "req/step" << std::setw(9) << "preempt" << std::setw(9) << "hit rate" << std::setw(8) << "waste"
      << std::setw(8) << "tier" << std::setw(9) << "w/ tier" << std::setw(12) << "recomputed" << '\n';
  for (const sweep_row& r : rows) {
    out << std::setw(6) << r.block_size << std::setw(10) << r.capacity_slots;
    if (free_lists) out << std::setw(10) << to_string(r.free_list);
    if (partial) out << std::setw(9) << (r.partial_reuse ? "on" : "off");
    out << std::setw(10) << to_string(r.eviction);
    if (!r.result) {
      out << "  " << r.note << '\n';
      continue;
    }
    const summary& s = *r.result;
    out << std::setw(10) << s.finished_requests << std::setw(9) << s.total_steps << std::setw(11) << std::fixed
        << std::setprecision(4) << s.throughput_requests_per_step << std::setw(9) << s.preemptions << std::setw(8)
        << std::setprecision(1) << 100 * s.prefix_hit_rate << '%' << std::setw(7) << 100 * waste(s) << '%'
        << std::setw(7) << r.host_tier_ratio << 'x' << std::setw(8) << 100 * tier_hit_rate(s) << '%' << std::setw(12)
        << s.recomputed_prompt_tokens() << '\n'
        << std::defaultfloat;
  }
}

/// What a recommendation holds fixed: every swept value but the block size.
struct sweep_setting {
  std::int64_t capacity_slots = 0;
  double host_tier_ratio = 0;
  free_list_choice free_list = free_list_choice::lifo;
  bool partial_reuse = true;
  eviction_choice eviction = eviction_choice::lru;
  std::int32_t max_running_sequences = 0;
  std::int32_t max_tokens_per_step = 0;
  friend bool operator==(const sweep_setting&, const sweep_setting&) = default;
};

inline sweep_setting setting_of(const sweep_row& r) {
  return {r.capacity_slots,        r.host_tier_ratio,       r.free_list,          r.partial_reuse,
          r.eviction,              r.max_running_sequences, r.max_tokens_per_step};
}

/// The block size a sweep recommends for one setting of the other swept values, with its evidence.
struct recommendation {
  sweep_setting setting;
  std::int32_t block_size = 0;       ///< the largest within tolerance of the best on both counts
  std::int32_t best_block_size = 0;  ///< the highest throughput (the smallest block size among equals)
  double throughput_ratio = 0;       ///< recommended / best throughput
  double hit_rate_loss = 0;          ///< best block size's hit rate - recommended's
  double waste = 0;                  ///< the recommended block size's
};

/// Per setting of capacity, host tier, free list, eviction policy and scheduler limits (in the
/// rows' order): the largest block size whose throughput is at least (1 - tolerance) of the best
/// and whose prefix hit rate is at most `tolerance` below the best block size's. Larger blocks
/// cost less outside the simulation: fewer block-table entries, fewer prefix-cache hashes and
/// lookups, longer contiguous reads in attention (docs/simulation.md). Points that did not run are
/// skipped.
inline std::vector<recommendation> recommend_block_sizes(const std::vector<sweep_row>& rows, double tolerance = 0.01) {
  std::vector<recommendation> out;
  std::vector<sweep_setting> settings;
  for (const sweep_row& r : rows) {
    if (r.result && std::ranges::find(settings, setting_of(r)) == settings.end()) settings.push_back(setting_of(r));
  }
  for (const sweep_setting& setting : settings) {
    const auto same_point = [&](const sweep_row& r) { return r.result && setting_of(r) == setting; };
    const sweep_row* best = nullptr;
    for (const sweep_row& r : rows) {
      if (!same_point(r)) continue;
      const double t = r.result->throughput_requests_per_step;
      if (!best || t > best->result->throughput_requests_per_step ||
          (t == best->result->throughput_requests_per_step && r.block_size < best->block_size)) {
        best = &r;
      }
    }
    const summary& b = *best->result;
    const sweep_row* chosen = best;
    for (const sweep_row& r : rows) {
      if (!same_point(r) || r.block_size <= chosen->block_size) continue;
      if (r.result->throughput_requests_per_step >= (1 - tolerance) * b.throughput_requests_per_step &&
          r.result->prefix_hit_rate >= b.prefix_hit_rate - tolerance) {
        chosen = &r;
      }
    }
    const summary& c = *chosen->result;
    out.push_back({.setting = setting,
                   .block_size = chosen->block_size,
                   .best_block_size = best->block_size,
                   .throughput_ratio = c.throughput_requests_per_step / b.throughput_requests_per_step,
                   .hit_rate_loss = b.prefix_hit_rate - c.prefix_hit_rate,
                   .waste = waste(c)});
  }
  return out;
}

/// One line per recommendation: "recommended for C slots[, FREE_LIST free list][, partial reuse
/// on|off], EVICTION[, host tier Rx][, N seqs][, T tokens/step]: block size B (evidence)", naming
/// the free list, partial reuse and the limits only when the sweep varies them.
inline void print_recommendations(std::ostream& out, const std::vector<sweep_row>& rows) {
  const auto varies = [&](auto field) {
    return std::any_of(rows.begin(), rows.end(), [&](const sweep_row& r) { return field(r) != field(rows.front()); });
  };
  const bool free_lists = varies([](const sweep_row& r) { return r.free_list; });
  const bool partial = varies([](const sweep_row& r) { return r.partial_reuse; });
  const bool seqs = varies([](const sweep_row& r) { return r.max_running_sequences; });
  const bool tokens = varies([](const sweep_row& r) { return r.max_tokens_per_step; });
  for (const recommendation& r : recommend_block_sizes(rows)) {
    const sweep_setting& k = r.setting;
    out << "recommended for " << k.capacity_slots << " slots, ";
    if (free_lists) out << to_string(k.free_list) << " free list, ";
    if (partial) out << "partial reuse " << (k.partial_reuse ? "on" : "off") << ", ";
    out << to_string(k.eviction);
    if (k.host_tier_ratio > 0) out << ", host tier " << k.host_tier_ratio << "x";
    if (seqs) out << ", " << k.max_running_sequences << " seqs";
    if (tokens) out << ", " << k.max_tokens_per_step << " tokens/step";
    out << ": block size "
        << r.block_size << std::fixed << std::setprecision(1) << " (" << 100 * r.throughput_ratio
        << "% of the best throughput, at block size " << r.best_block_size << "; prefix hit rate "
        << (r.hit_rate_loss >= 0 ? "lower by " : "higher by ") << 100 * std::abs(r.hit_rate_loss) << " points; waste "
        << 100 * r.waste << "%)\n"
        << std::defaultfloat;
  }
}

}  // namespace pagedkv::sim
