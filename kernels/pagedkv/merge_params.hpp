// Parameters of merge_states, shared by the host reference and the CUDA kernel: attention states
// (an output row and its log-sum-exp) computed over disjoint sets of a query's keys, merged into
// the attention over their union. What cascade (shared-prefix) attention needs: the shared
// prefix's blocks attended once for a whole batch or in one table, each sequence's own blocks in
// another, and the two merged; the same rule merges split-K's partial rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <pagedkv/error.hpp>

#include "kernels_config.hpp"
#include "kv_dtype.hpp"

namespace pagedkv::kernels {

/// Merges num_states states of each of num_rows rows (query token x query head):
///   m = max_s lse_s, w_s = exp(lse_s - m), o = sum_s w_s o_s / sum_s w_s, lse = m + log(sum_s w_s).
/// A state of lse -inf (nothing attended) weighs 0; a row whose states are all empty gets zeros
/// and -inf, as decode writes for a sequence of length 0. The LSEs are natural logs, as
/// attention_params::lse returns them.
struct merge_states_params {
  const void* o_in = nullptr;       ///< [num_states, num_rows, head_dim] of o_dtype, state s at s * state_stride
  const float* lse_in = nullptr;    ///< [num_states, num_rows], state s at s * lse_state_stride
  void* o = nullptr;                ///< [num_rows, head_dim] of o_dtype; may be state 0 of o_in (in place)
  float* lse = nullptr;             ///< [num_rows], or nullptr; may be state 0 of lse_in
  std::int64_t state_stride = 0;    ///< elements between states of o_in; 0: num_rows * head_dim
  std::int64_t lse_state_stride = 0;///< entries between states of lse_in; 0: num_rows
  std::int64_t num_rows = 0;
  std::int32_t num_states = 0;
  std::int32_t head_dim = 0;
  dtype o_dtype = dtype::bf16;      ///< of o_in and o: f32, f16 or bf16

  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t o_stride() const {
    return state_stride ? state_stride : num_rows * head_dim;
  }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t lse_stride() const {
    return lse_state_stride ? lse_state_stride : num_rows;
  }
};
static_assert(std::is_trivially_copyable_v<merge_states_params>);

/// Throws errc::invalid_argument naming the first bad value. Reads no pointed-to memory.
inline void check(const merge_states_params& p) {
  using pagedkv::detail::fail;
  if (p.num_rows < 0) fail(errc::invalid_argument, "merge_states: num_rows ", p.num_rows, " must be >= 0");
  if (p.num_states < 1) fail(errc::invalid_argument, "merge_states: num_states ", p.num_states, " must be >= 1");
  if (p.head_dim < 1) fail(errc::invalid_argument, "merge_states: head_dim ", p.head_dim, " must be >= 1");
  if (p.o_dtype == dtype::fp8_e4m3) fail(errc::invalid_argument, "merge_states: o_dtype fp8_e4m3 is not supported");
  if (p.state_stride != 0 && p.state_stride < p.num_rows * p.head_dim)
    fail(errc::invalid_argument, "merge_states: state_stride ", p.state_stride, " below a state's ",
         p.num_rows * p.head_dim, " elements");
  if (p.lse_state_stride != 0 && p.lse_state_stride < p.num_rows)
    fail(errc::invalid_argument, "merge_states: lse_state_stride ", p.lse_state_stride, " below num_rows ",
         p.num_rows);
  if (p.num_rows > 0 && (!p.o_in || !p.lse_in || !p.o))
    fail(errc::invalid_argument, "merge_states: o_in, lse_in and o must be set");
  if (p.num_rows == 0) return;
  // The outputs may be state 0 exactly (in place), and must not overlap the inputs otherwise.
  const auto overlaps = [](const void* out, std::size_t out_bytes, const void* in, std::size_t in_bytes) {
    const auto o = reinterpret_cast<std::uintptr_t>(out), i = reinterpret_cast<std::uintptr_t>(in);
    return o != i && o < i + in_bytes && i < o + out_bytes;
  };
  const std::size_t es = size_of(p.o_dtype), row_elems = std::size_t(p.num_rows) * std::size_t(p.head_dim);
  const std::size_t in_elems = std::size_t(p.num_states - 1) * std::size_t(p.o_stride()) + row_elems;
  if (overlaps(p.o, row_elems * es, p.o_in, in_elems * es))
    fail(errc::invalid_argument, "merge_states: o overlaps o_in other than as its state 0");
  const std::size_t lse_in_entries = std::size_t(p.num_states - 1) * std::size_t(p.lse_stride()) + std::size_t(p.num_rows);
  if (p.lse && overlaps(p.lse, std::size_t(p.num_rows) * sizeof(float), p.lse_in, lse_in_entries * sizeof(float)))
    fail(errc::invalid_argument, "merge_states: lse overlaps lse_in other than as its state 0");
}

}  // namespace pagedkv::kernels
