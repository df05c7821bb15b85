// The contiguous baselines of the PagedAttention paper, replayed with the same null model and the
// same KV capacity as the paged simulation: every sequence gets one unbroken range of token slots
// when it is admitted and gives it back when it finishes. The range size is the policy:
//
//   max_length    prompt + max_output_len (FasterTransformer; Orca "Max")
//   exact         prompt + output_len, as if the output length were known (Orca "Oracle")
//   power_of_two  the next power of two of prompt + output_len (the Orca "Pow2")
//   pow2_output   prompt + the next power of two of output_len (the paper's Orca "Pow2": outputs
//                 over-reserved by at most 2x)
//
// and the placement is the Allocator: first_fit_allocator (the default: nothing is rounded, so
// waste shows up as external fragmentation) or buddy_allocator (what the paper assumes for Orca:
// every range rounded up to a power of two and aligned).
//
// Scheduling is iteration-level (continuous batching) with the null model: every step, each running
// sequence produces one token, and waiting requests are admitted first come, first served while
// the sequence limit, the token budget and the allocator allow; the first refusal stops admission
// for that step. A newly admitted request's prefill takes one step and produces its first output
// token, so a request of output_len tokens runs for output_len steps. A group of n samples or k
// beams needs n (k) ranges, taken all or nothing: contiguous systems cannot share memory between
// sequences, so beam forks copy KV instead of sharing it and the beam pattern does not change
// memory. Reservations are made up front, so nothing is ever preempted.
#pragma once

#include "sim/buddy.hpp"
#include "sim/first_fit.hpp"
#include "sim/limits.hpp"
#include "sim/metrics.hpp"
#include "sim/workload.hpp"

#include <pagedkv/error.hpp>

#include <bit>
#include <concepts>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

namespace pagedkv::sim {

enum class reservation_policy { max_length, exact, power_of_two, pow2_output };

constexpr std::string_view to_string(reservation_policy policy) noexcept {
  switch (policy) {
    case reservation_policy::max_length: return "max_length";
    case reservation_policy::exact: return "exact";
    case reservation_policy::power_of_two: return "power_of_two";
    case reservation_policy::pow2_output: return "pow2_output";
  }
  return "unknown";
}

/// Slots one sequence of `r` reserves under `policy`.
constexpr std::int64_t reservation_slots(const request& r, reservation_policy policy) noexcept {
  switch (policy) {
    case reservation_policy::max_length: return std::int64_t{r.prompt_len()} + r.max_output_len;
    case reservation_policy::exact: return std::int64_t{r.prompt_len()} + r.output_len;
    case reservation_policy::power_of_two:
      return static_cast<std::int64_t>(
          std::bit_ceil(static_cast<std::uint64_t>(r.prompt_len() + r.output_len)));
    case reservation_policy::pow2_output:
      return r.prompt_len() +
             static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(r.output_len)));
  }
  return 0;
}

/// What contiguous_simulator needs of an allocator over [0, capacity) token slots.
template <class A>
concept range_allocator = std::constructible_from<A, std::int64_t> &&
    requires(A a, const A& ca, std::int64_t slots) {
      { a.try_allocate(slots) } -> std::same_as<std::optional<std::int64_t>>;
      a.free(slots);
      { ca.free_slots() } -> std::convertible_to<std::int64_t>;
      { ca.allocated_slots() } -> std::convertible_to<std::int64_t>;
      { A::size_for(slots) } -> std::convertible_to<std::int64_t>;  // slots a request really takes
    };

/// A request that has finished: how many tokens each of its sequences produced, and when.
struct finished_request {
  std::uint64_t id = 0;
  std::int64_t admitted_step = 0;
  std::int64_t finished_step = 0;
  std::vector<std::int32_t> tokens_per_sequence;
};

template <range_allocator Allocator = first_fit_allocator>
class basic_contiguous_simulator {
 public:
  using allocator_type = Allocator;

  /// A running sequence: one range of the address space.
  struct sequence {
    std::size_t request_index;  // into the trace
    std::int64_t offset;        // first slot of its range
    std::int64_t reserved;      // slots in its range
    std::int32_t generated;     // output tokens produced so far
  };

  /// Replays `requests` (kept by reference: it must outlive the simulator).
  /// Errors: invalid_argument when the limits are invalid (see check_limits), a request is
  /// malformed, or a request could never be admitted (its prompt exceeds the token budget, its group
  /// the sequence limit, or its reservations the capacity), so that a run always ends.
  basic_contiguous_simulator(const trace& requests, reservation_policy policy,
                             scheduler_limits limits)
      : requests_(requests), policy_(policy), limits_(limits), allocator_(limits.capacity_slots),
        metrics_(limits.capacity_slots) {
    check_limits(limits);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const request& r = requests[i];
      const std::int64_t group_slots =
          Allocator::size_for(reservation_slots(r, policy)) * r.num_sequences();
      if (r.prompt_len() < 1 || r.output_len < 1 || r.max_output_len < r.output_len ||
          r.num_sequences() < 1 || r.prompt_len() > limits.max_tokens_per_step ||
          r.num_sequences() > limits.max_running_sequences || group_slots > limits.capacity_slots ||
          (i > 0 && r.arrival_step < requests[i - 1].arrival_step)) {
        pagedkv::detail::fail(errc::invalid_argument, "contiguous_simulator: request ", r.id,
                              " cannot run (prompt ", r.prompt_len(), ", output ", r.output_len,
                              ", max output ", r.max_output_len, ", sequences ",
                              r.num_sequences(), ", ", to_string(policy), " group slots ",
                              group_slots, ", arrival ", r.arrival_step, ")");
      }
    }
  }

  [[nodiscard]] bool done() const noexcept {
    return finished_.size() == requests_.size();
  }

  /// Runs one step: admit, produce one token per running sequence, record metrics, release what
  /// finished. Errors: out_of_blocks if the next request does not fit even in empty memory, which
  /// the constructor's checks rule out; it stops a run that would otherwise never end.
  void step() {
    while (next_arrival_ < requests_.size() && requests_[next_arrival_].arrival_step <= step_) {
      waiting_.push_back(next_arrival_++);
    }

    // Decodes come first: every running sequence takes one token of the budget.
    std::int64_t budget = limits_.max_tokens_per_step - std::ssize(running_);
    std::int64_t unusable_free = 0;
    while (!waiting_.empty()) {
      const request& r = requests_[waiting_.front()];
      if (std::ssize(running_) + r.num_sequences() > limits_.max_running_sequences) break;
      if (r.prompt_len() > budget) break;
      const std::int64_t need = reservation_slots(r, policy_);
      if (!admit(waiting_.front(), need)) {
        // Refused for memory. If the free total would have held the group, what stopped it is
        // fragmentation: all free space is stranded for this step.
        if (allocator_.free_slots() >= Allocator::size_for(need) * r.num_sequences()) {
          unusable_free = allocator_.free_slots();
        }
        // With nothing running all memory is free: a refusal now would repeat forever.
        if (running_.empty()) {
          pagedkv::detail::fail(errc::out_of_blocks, "contiguous_simulator: request ", r.id,
                                " does not fit in empty memory (", r.num_sequences(), " x ",
                                Allocator::size_for(need), " slots)");
        }
        break;
      }
      budget -= r.prompt_len();
      waiting_.pop_front();
    }

    step_sample sample;
    for (auto& seq : running_) {
      ++seq.generated;
      const request& r = requests_[seq.request_index];
      sample.live_slots += r.prompt_len() + seq.generated;
      sample.future_slots += r.output_len - seq.generated;
      sample.reserved_slots += seq.reserved;
    }
    sample.free_slots = allocator_.free_slots();
    sample.unusable_free_slots = unusable_free;
    sample.running_sequences = std::ssize(running_);
    sample.waiting_requests = std::ssize(waiting_);

    // Release finished sequences; a group finishes with its last sequence (all of a group's
    // sequences have the same length in the null model, so they finish together).
    std::erase_if(running_, [&](const sequence& seq) {
      const request& r = requests_[seq.request_index];
      if (seq.generated < r.output_len) return false;
      allocator_.free(seq.offset);
      auto& done = in_progress_.at(seq.request_index);
      done.tokens_per_sequence.push_back(seq.generated);
      if (std::ssize(done.tokens_per_sequence) == r.num_sequences()) {
        done.finished_step = step_;
        finished_.push_back(std::move(done));
        in_progress_.erase(seq.request_index);
        ++sample.finished_requests;
      }
      return true;
    });
    metrics_.record(sample);
    ++step_;
  }

  /// Steps until every request has finished; `progress(finished, total)` is called now and then.
  summary run(const std::function<void(std::size_t, std::size_t)>& progress = {}) {
    while (!done()) {
      step();
      if (progress && step_ % 1024 == 0) progress(finished_.size(), requests_.size());
    }
    if (progress) progress(finished_.size(), requests_.size());
    return metrics_.result();
  }

  [[nodiscard]] std::int64_t current_step() const noexcept { return step_; }
  [[nodiscard]] const std::vector<sequence>& running() const noexcept { return running_; }
  [[nodiscard]] std::size_t num_waiting() const noexcept { return waiting_.size(); }
  [[nodiscard]] const std::vector<finished_request>& finished() const noexcept { return finished_; }
  [[nodiscard]] const Allocator& allocator() const noexcept { return allocator_; }
  [[nodiscard]] const metrics_accumulator& metrics() const noexcept { return metrics_; }
  [[nodiscard]] summary result() const { return metrics_.result(); }

 private:
  // Takes num_sequences ranges of `slots` for the request, or none (rolled back).
  bool admit(std::size_t index, std::int64_t slots) {
    const request& r = requests_[index];
    std::vector<std::int64_t> offsets;
    for (std::int32_t s = 0; s < r.num_sequences(); ++s) {
      auto offset = allocator_.try_allocate(slots);
      if (!offset) {
        for (auto taken : offsets) allocator_.free(taken);
        return false;
      }
      offsets.push_back(*offset);
    }
    for (auto offset : offsets) {
      running_.push_back({index, offset, Allocator::size_for(slots), 0});
    }
    in_progress_.emplace(index, finished_request{r.id, step_, -1, {}});
    return true;
  }

  const trace& requests_;
  reservation_policy policy_;
  scheduler_limits limits_;
  Allocator allocator_;
  metrics_accumulator metrics_;
  std::int64_t step_ = 0;
  std::size_t next_arrival_ = 0;
  std::deque<std::size_t> waiting_;
  std::vector<sequence> running_;
  std::map<std::size_t, finished_request> in_progress_;
  std::vector<finished_request> finished_;
};

/// The baselines: first-fit placement.
using contiguous_simulator = basic_contiguous_simulator<first_fit_allocator>;
/// The paper's assumption for Orca: buddy placement.
using buddy_contiguous_simulator = basic_contiguous_simulator<buddy_allocator>;

}  // namespace pagedkv::sim
