// The one metrics accumulator every simulated system reports to, once per step, so that the
// contiguous baselines and the paged simulation are measured by the same code.
//
// Every step the KV capacity splits into five parts that sum to capacity_slots:
//   live      slots holding the KV of a token computed so far
//   future    reserved slots the owning sequence will still fill before it finishes
//   internal  reserved slots the owning sequence will never fill (internal fragmentation: the
//             over-reservation of max-length and pow2, the unused tail of a sequence's last block)
//   external  free slots at a step where the next waiting request was refused although the free
//             total would have held it: free but unusable because it is scattered (external
//             fragmentation; zero for a paged pool, where any free block serves)
//   idle      all other free slots
// "Saturated" steps are those with a request left waiting: there the system, not the arrival
// process, decides how full memory is, so the headline figures are averaged over those steps.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/prefix_lookup.hpp>

#include <algorithm>
#include <cstdint>

namespace pagedkv::sim {

/// What a system reports for one step, after the step's tokens were produced and before finished
/// sequences release their memory.
struct step_sample {
  std::int64_t live_slots = 0;      ///< physical slots holding KV (shared slots count once)
  std::int64_t reserved_slots = 0;  ///< slots owned by running sequences (ranges or blocks)
  std::int64_t future_slots = 0;    ///< of reserved, what its sequences will still fill
  std::int64_t free_slots = 0;      ///< capacity - reserved
  std::int64_t unusable_free_slots = 0;  ///< of free, what external fragmentation strands
  std::int64_t running_sequences = 0;
  std::int64_t finished_requests = 0;  ///< requests that completed in this step
  std::int64_t waiting_requests = 0;   ///< arrived, not admitted (or preempted) after this step
  std::int64_t preemptions = 0;        ///< sequence groups preempted in this step
  /// What the running sequences would own without sharing (each sample or beam its own copy of
  /// every block); 0 means "same as reserved_slots". For the "memory saved by sharing" figure.
  std::int64_t unshared_reserved_slots = 0;
};

/// Time averages over a set of steps; fractions are of capacity unless named otherwise.
struct memory_breakdown {
  std::int64_t steps = 0;
  double kv_utilization = 0;  ///< sum(live) / sum(reserved): how much reserved memory holds tokens
  double live_fraction = 0;
  double future_fraction = 0;
  double internal_fraction = 0;
  double external_fraction = 0;
  double idle_fraction = 0;
};

struct summary {
  std::int64_t capacity_slots = 0;
  std::int64_t total_steps = 0;
  std::int64_t finished_requests = 0;
  std::int64_t preemptions = 0;
  double throughput_requests_per_step = 0;
  double mean_running_sequences = 0;
  std::int64_t max_running_sequences = 0;
  double mean_reserved_slots = 0;
  std::int64_t peak_reserved_slots = 0;
  double mean_unshared_reserved_slots = 0;
  std::int64_t peak_unshared_reserved_slots = 0;
  /// 1 - sum(reserved) / sum(unshared reserved) over all steps: memory saved by sharing.
  double sharing_saving = 0;
  /// Prompt tokens not computed / prompt tokens looked up, re-admissions after a recompute
  /// included: served by whole cached blocks, by partial hits (copied blocks) and by blocks in
  /// flight of a request of the same burst; the manager's own counts (paged only; 0 for the
  /// contiguous systems).
  double prefix_hit_rate = 0;
  double partial_hit_rate = 0;  ///< the part of prefix_hit_rate that partial hits served
  double shared_hit_rate = 0;   ///< the part shared in flight (kv_cache_manager::allocate_shared)
  /// Prompt tokens looked up at every admission (re-admissions included), those the device cache
  /// served (whole blocks, partial hits and blocks shared in flight), and those a host tier loaded
  /// (paged only). The rest were recomputed.
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_prompt_tokens = 0;
  std::int64_t loaded_prompt_tokens = 0;
  [[nodiscard]] std::int64_t recomputed_prompt_tokens() const noexcept {
    return prompt_tokens - cached_prompt_tokens - loaded_prompt_tokens;
  }
  /// Paged only: the prefix cache's events (stored, removed, cleared) and a 64-bit digest of each
  /// event's type, block, generation, hash, parent hash and tokens, in order (paged.hpp's
  /// event_digest): two runs with equal digests published the same events.
  std::int64_t kv_events = 0;
  std::uint64_t kv_event_digest = 0;
  /// The same lookups, the missed tokens by reason (kv_cache_manager::miss_totals; paged only).
  prefix_lookup prefix_misses{};
  memory_breakdown saturated;  ///< steps with a request waiting: the headline
  memory_breakdown all;        ///< every step, including ramp-up and drain
};

class metrics_accumulator {
 public:
  /// Errors: invalid_argument when capacity_slots < 1.
  explicit metrics_accumulator(std::int64_t capacity_slots) : capacity_slots_(capacity_slots) {
    if (capacity_slots < 1) {
      pagedkv::detail::fail(errc::invalid_argument, "metrics_accumulator capacity must be >= 1, got ",
                            capacity_slots);
    }
  }

  /// Adds one step. Errors: invalid_argument when the sample is inconsistent (negative parts, live +
  /// future over reserved, reserved + free not equal to capacity, unusable over free); nothing is
  /// recorded then.
  void record(const step_sample& s) {
    const std::int64_t internal = s.reserved_slots - s.live_slots - s.future_slots;
    if (s.live_slots < 0 || s.future_slots < 0 || internal < 0 || s.free_slots < 0 ||
        s.unusable_free_slots < 0 || s.unusable_free_slots > s.free_slots ||
        s.reserved_slots + s.free_slots != capacity_slots_ || s.running_sequences < 0 ||
        s.finished_requests < 0 || s.waiting_requests < 0 || s.preemptions < 0 ||
        s.unshared_reserved_slots < 0) {
      pagedkv::detail::fail(errc::invalid_argument, "metrics_accumulator: inconsistent step ",
                            steps_, ": live ", s.live_slots, ", future ", s.future_slots,
                            ", reserved ", s.reserved_slots, ", free ", s.free_slots,
                            ", unusable ", s.unusable_free_slots, ", capacity ", capacity_slots_);
    }
    const std::int64_t unshared =
        s.unshared_reserved_slots > 0 ? s.unshared_reserved_slots : s.reserved_slots;
    ++steps_;
    finished_ += s.finished_requests;
    preemptions_ += s.preemptions;
    running_sum_ += s.running_sequences;
    max_running_ = std::max(max_running_, s.running_sequences);
    reserved_sum_ += s.reserved_slots;
    peak_reserved_ = std::max(peak_reserved_, s.reserved_slots);
    unshared_sum_ += unshared;
    peak_unshared_ = std::max(peak_unshared_, unshared);
    all_.add(s, internal);
    if (s.waiting_requests > 0) saturated_.add(s, internal);
    last_ = s;
  }

  /// The most recent sample (all zero before the first): for timelines.

  [[nodiscard]] const step_sample& last_sample() const noexcept { return last_; }

  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] std::int64_t capacity_slots() const noexcept { return capacity_slots_; }

  [[nodiscard]] summary result() const {
    summary out;
    out.capacity_slots = capacity_slots_;
    out.total_steps = steps_;
    out.finished_requests = finished_;
    out.preemptions = preemptions_;
    if (steps_ == 0) return out;
    const auto steps = static_cast<double>(steps_);
    out.throughput_requests_per_step = static_cast<double>(finished_) / steps;
    out.mean_running_sequences = static_cast<double>(running_sum_) / steps;
    out.max_running_sequences = max_running_;
    out.mean_reserved_slots = static_cast<double>(reserved_sum_) / steps;
    out.peak_reserved_slots = peak_reserved_;
    out.mean_unshared_reserved_slots = static_cast<double>(unshared_sum_) / steps;
    out.peak_unshared_reserved_slots = peak_unshared_;
    out.sharing_saving = unshared_sum_ == 0 ? 0.0
                         : 1.0 - static_cast<double>(reserved_sum_) /
                                     static_cast<double>(unshared_sum_);
    out.saturated = saturated_.breakdown(capacity_slots_);
    out.all = all_.breakdown(capacity_slots_);
    return out;
  }

 private:
  struct sums {
    std::int64_t steps = 0;
    // Sums over steps of slot counts: at most 2^31 slots times 2^31 steps fit in int64.
    std::int64_t live = 0, reserved = 0, future = 0, internal = 0, external = 0, idle = 0;

    void add(const step_sample& s, std::int64_t internal_slots) {
      ++steps;
      live += s.live_slots;
      reserved += s.reserved_slots;
      future += s.future_slots;
      internal += internal_slots;
      external += s.unusable_free_slots;
      idle += s.free_slots - s.unusable_free_slots;
    }

    [[nodiscard]] memory_breakdown breakdown(std::int64_t capacity) const {
      memory_breakdown b;
      b.steps = steps;
      if (steps == 0) return b;
      const double total = static_cast<double>(steps) * static_cast<double>(capacity);
      b.kv_utilization = reserved == 0 ? 0.0 : static_cast<double>(live) / static_cast<double>(reserved);
      b.live_fraction = static_cast<double>(live) / total;
      b.future_fraction = static_cast<double>(future) / total;
      b.internal_fraction = static_cast<double>(internal) / total;
      b.external_fraction = static_cast<double>(external) / total;
      b.idle_fraction = static_cast<double>(idle) / total;
      return b;
    }
  };

  std::int64_t capacity_slots_;
  std::int64_t steps_ = 0, finished_ = 0, preemptions_ = 0;
  std::int64_t running_sum_ = 0, max_running_ = 0;
  std::int64_t reserved_sum_ = 0, peak_reserved_ = 0;
  std::int64_t unshared_sum_ = 0, peak_unshared_ = 0;
  sums all_, saturated_;
  step_sample last_;
};

}  // namespace pagedkv::sim
