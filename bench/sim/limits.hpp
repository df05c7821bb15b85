// The scheduling limits every simulated system runs under, so that the baselines and the paged
// simulation see the same machine.
#pragma once

#include <pagedkv/error.hpp>

#include <cstdint>

namespace pagedkv::sim {

struct scheduler_limits {
  std::int64_t capacity_slots = 16384;       ///< KV capacity in token slots (see docs/simulation.md)
  std::int32_t max_running_sequences = 256;  ///< vLLM's max_num_seqs default
  std::int32_t max_tokens_per_step = 2048;   ///< vLLM's max_num_batched_tokens default
};

/// Errors: invalid_argument when a limit is not positive, or when the sequence limit exceeds the
/// token budget (every running sequence must be able to decode its token each step).
inline void check_limits(const scheduler_limits& limits) {
  if (limits.capacity_slots < 1 || limits.max_running_sequences < 1 ||
      limits.max_tokens_per_step < limits.max_running_sequences) {
    pagedkv::detail::fail(errc::invalid_argument, "scheduler limits: capacity_slots ",
                          limits.capacity_slots, ", max_running_sequences ",
                          limits.max_running_sequences, ", max_tokens_per_step ",
                          limits.max_tokens_per_step,
                          " (need all >= 1 and max_tokens_per_step >= max_running_sequences)");
  }
}

}  // namespace pagedkv::sim
