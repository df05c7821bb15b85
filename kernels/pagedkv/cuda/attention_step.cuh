// One attention call for an engine step whose batch mixes decode tokens and prefill chunks:
// plan_attention_step on the host (from the host copy of q_indptr), then attention_step, which
// only enqueues. The leading sequences of one query token each run on the decode kernel (fast on
// one token, split-K over long contexts), the rest on the prefill kernel; each writes its own
// rows of o and lse, so that the call is one attention over the whole batch. An engine that puts
// its decode sequences first (as vLLM's scheduler does) gets both kernels; any other order is
// still exact, its q_len-1 sequences after the first prefill chunk running on the prefill kernel.
#pragma once

#include <cstdint>
#include <span>

#include <pagedkv/error.hpp>

#include "../attention_params.hpp"
#include "../decode_plan.hpp"
#include "../prefill_plan.hpp"
#include "dispatch.cuh"
#include "prefill.cuh"

namespace pagedkv::kernels::cuda {

/// What attention_step runs: the decode kernel over sequences [0, num_decode_seqs), the prefill
/// kernel over the rest, each in its part of one workspace.
struct attention_step_plan {
  std::int32_t num_seqs = 0;
  std::int32_t num_decode_seqs = 0;     ///< leading sequences of one query token
  decode_plan decode;                   ///< of the decode part (when num_decode_seqs > 0)
  prefill_plan prefill;                 ///< of the prefill part (when num_decode_seqs < num_seqs)
  std::size_t prefill_workspace_offset = 0;  ///< bytes; the decode's part starts at 0
  std::size_t workspace_bytes = 0;

  [[nodiscard]] bool has_prefill() const { return num_decode_seqs < num_seqs; }
};

namespace detail {

/// p's first n sequences, one query token each (query row s is sequence s's).
inline attention_params decode_part(const attention_params& p, std::int32_t n) {
  attention_params d = p;
  d.num_seqs = n;
  d.q_indptr = nullptr;
  return d;
}

/// p's sequences from n on: the table and q_indptr start at sequence n (q_indptr's entries are
/// rows of q and o, so q and o stay as they are).
inline attention_params prefill_part(const attention_params& p, std::int32_t n) {
  attention_params r = p;
  r.num_seqs = p.num_seqs - n;
  r.q_indptr = p.q_indptr + n;
  if (p.table.is_csr()) {
    r.table.indptr = p.table.indptr + n;
    r.table.last_block_len = p.table.last_block_len + n;
  } else {
    r.table.indices = p.table.indices + std::int64_t(n) * p.table.max_blocks_per_seq;
    r.table.kv_lens = p.table.kv_lens + n;
  }
  return r;
}

}  // namespace detail

/// Plans a step of p on the current device. host_q_indptr: the host copy of p.q_indptr
/// (num_seqs + 1 entries), or empty where p.q_indptr is nullptr (every sequence one token).
/// The decode part takes the longest run of leading sequences of one query token each, when
/// host_q_indptr[0] is 0. Throws errc::invalid_argument naming a bad or unsupported value (the
/// decode's or the prefill's, for the part that meets it).
inline attention_step_plan plan_attention_step(const attention_params& p, std::span<const std::int32_t> host_q_indptr) {
  using pagedkv::detail::fail;
  check(p);
  attention_step_plan plan;
  plan.num_seqs = p.num_seqs;
  if (!p.q_indptr) {
    if (!host_q_indptr.empty())
      fail(errc::invalid_argument, "attention_step: host_q_indptr has ", host_q_indptr.size(),
           " entries but q_indptr is nullptr");
    plan.num_decode_seqs = p.num_seqs;
  } else {
    if (std::int64_t(host_q_indptr.size()) != std::int64_t(p.num_seqs) + 1)
      fail(errc::invalid_argument, "attention_step: host_q_indptr has ", host_q_indptr.size(), " entries, num_seqs + 1 = ",
           std::int64_t(p.num_seqs) + 1, " expected");
    if (host_q_indptr[0] == 0)
      while (plan.num_decode_seqs < p.num_seqs &&
             host_q_indptr[std::size_t(plan.num_decode_seqs) + 1] == plan.num_decode_seqs + 1)
        ++plan.num_decode_seqs;
  }
  if (plan.num_decode_seqs > 0) plan.decode = plan_decode(detail::decode_part(p, plan.num_decode_seqs));
  if (plan.has_prefill()) {
    plan.prefill_workspace_offset = (plan.decode.workspace_bytes + 255) / 256 * 256;
    plan.prefill = plan_prefill(detail::prefill_part(p, plan.num_decode_seqs),
                                host_q_indptr.subspan(std::size_t(plan.num_decode_seqs)));
    plan.workspace_bytes = plan.prefill_workspace_offset + plan.prefill.workspace_bytes;
  } else {
    plan.workspace_bytes = plan.decode.workspace_bytes;
  }
  return plan;
}

/// Attention of every query token of p over its sequence's paged K/V, as the host reference
/// computes it, on the kernels the plan chose. workspace: device memory of plan.workspace_bytes
/// bytes, 256-byte aligned. Enqueues on stream and returns: never allocates, synchronises or
/// reads device memory on the host (a CUDA graph can capture it). Throws errc::invalid_argument
/// for a plan of other params, errc::buffer_too_small for a short workspace, cuda_error on a
/// failed launch.
inline void attention_step(const attention_params& p, const attention_step_plan& plan, void* workspace,
                           std::size_t workspace_bytes, cudaStream_t stream = nullptr) {
  using pagedkv::detail::fail;
  if (plan.num_seqs != p.num_seqs || (plan.has_prefill() && !p.q_indptr))
    fail(errc::invalid_argument, "attention_step: the plan was made for ", plan.num_seqs,
         " sequences (q_indptr set where some have several tokens); these params have ", p.num_seqs);
  if (workspace_bytes < plan.workspace_bytes)
    fail(errc::buffer_too_small, "attention_step: workspace of ", workspace_bytes, " bytes, the plan needs ",
         plan.workspace_bytes);
  auto* bytes = static_cast<unsigned char*>(workspace);
  if (plan.num_decode_seqs > 0)
    decode(detail::decode_part(p, plan.num_decode_seqs), workspace, plan.decode.workspace_bytes, stream);
  if (plan.has_prefill())
    prefill(detail::prefill_part(p, plan.num_decode_seqs), plan.prefill,
            plan.prefill.workspace_bytes ? bytes + plan.prefill_workspace_offset : nullptr,
            plan.prefill.workspace_bytes, stream);
}

}  // namespace pagedkv::kernels::cuda
