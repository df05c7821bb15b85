// Policies for scheduler: admission order and preemption mode.
#pragma once

#include <concepts>
#include <cstdint>

namespace pagedkv {

/// What an admission policy compares: a request's priority and its arrival order.
struct admission_key {
  std::int32_t priority = 0;   ///< higher runs first under priority_admission
  std::uint64_t arrival = 0;   ///< submission order, unique
};

/// An admission policy orders requests: before(a, b) means a is admitted before b and, among
/// running requests, preempted after b.
template <class Policy>
concept admission_policy = requires(admission_key a, admission_key b) {
  { Policy::before(a, b) } -> std::same_as<bool>;
};

/// First come, first served; the newest running request is preempted first.
struct fcfs_admission {
  static constexpr bool before(admission_key a, admission_key b) noexcept { return a.arrival < b.arrival; }
};

/// Higher priority first, then first come, first served; the lowest-priority newest request is
/// preempted first.
struct priority_admission {
  static constexpr bool before(admission_key a, admission_key b) noexcept {
    return a.priority != b.priority ? a.priority > b.priority : a.arrival < b.arrival;
  }
};

/// How a preempted request gives its blocks back.
enum class preemption_mode {
  recompute,  ///< free the blocks; re-prefill later, hitting what the prefix cache still holds
  swap,       ///< copy the blocks to the host pool; copy them back later
};

struct preempt_by_recompute {
  static constexpr preemption_mode mode = preemption_mode::recompute;
};
/// Swap; a request that does not fit in the host pool falls back to recompute.
struct preempt_by_swap {
  static constexpr preemption_mode mode = preemption_mode::swap;
};

template <class Policy>
concept preemption_policy = requires {
  { Policy::mode } -> std::convertible_to<preemption_mode>;
};

static_assert(admission_policy<fcfs_admission> && admission_policy<priority_admission>);
static_assert(preemption_policy<preempt_by_recompute> && preemption_policy<preempt_by_swap>);

}  // namespace pagedkv
