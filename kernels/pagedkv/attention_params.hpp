// The parameters of paged attention: one trivially copyable struct that the host reference and
// the CUDA kernels both take, with host or device pointers. Accessors such as kv_len(i) let one
// body serve dense and CSR block tables.
#pragma once

#include <cstdint>
#include <type_traits>

#include <pagedkv/types.hpp>

#include "kernels_config.hpp"
#include "kv_dtype.hpp"
#include "kv_layout.hpp"

namespace pagedkv::kernels {

/// A batch's block tables, in one of the two formats the host library exports.
///   dense: indices [num_seqs, max_blocks_per_seq] padded with null_block, kv_lens [num_seqs]
///   CSR:   indptr [num_seqs + 1], indices [nnz], last_block_len [num_seqs] (1..block_size)
struct block_table_view {
  const block_id* indices = nullptr;            ///< dense [num_seqs, max_blocks_per_seq] or CSR [nnz]
  const std::int32_t* indptr = nullptr;         ///< CSR [num_seqs + 1]; nullptr means dense
  const std::int32_t* kv_lens = nullptr;        ///< dense [num_seqs] tokens in each sequence
  const std::int32_t* last_block_len = nullptr; ///< CSR [num_seqs] tokens in each last block
  std::int32_t max_blocks_per_seq = 0;          ///< dense row pitch
  std::int32_t block_size = 16;

  [[nodiscard]] PAGEDKV_HOST_DEVICE bool is_csr() const { return indptr != nullptr; }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t kv_len(std::int32_t seq) const {
    if (!is_csr()) return kv_lens[seq];
    const std::int32_t blocks = indptr[seq + 1] - indptr[seq];
    return blocks == 0 ? 0 : (blocks - 1) * block_size + last_block_len[seq];
  }
  /// The j-th block of sequence seq.
  [[nodiscard]] PAGEDKV_HOST_DEVICE block_id block(std::int32_t seq, std::int32_t j) const {
    return is_csr() ? indices[indptr[seq] + j] : indices[std::int64_t(seq) * max_blocks_per_seq + j];
  }
};

/// Attention of query tokens over their sequences' paged K/V of one layer. Sequence i has
/// q_len(i) query tokens (1 in decode, more in a prefill chunk) at the last q_len(i) positions of
/// its kv_len(i) tokens; each attends causally to the tokens up to its own position.
struct attention_params {
  const void* q = nullptr;            ///< [num_q_tokens, num_qo_heads, head_dim], q_dtype
  void* o = nullptr;                  ///< [num_q_tokens, num_qo_heads, head_dim], q_dtype
  float* lse = nullptr;               ///< [num_q_tokens, num_qo_heads] natural-log sum of exp of the
                                      ///< scaled logits, or nullptr; -inf where nothing was attended
  const std::int32_t* q_indptr = nullptr; ///< [num_seqs + 1] query tokens per sequence; nullptr: one each
  const void* k = nullptr;            ///< this layer's K at block 0 (kv_cache_layout offsets), kv_dtype
  const void* v = nullptr;            ///< this layer's V at block 0, kv_dtype
  std::int64_t block_stride = 0;      ///< elements, shared by K and V
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  block_table_view table;
  const float* k_scale_per_head = nullptr;  ///< [num_kv_heads] dequantisation scales, or nullptr
  const float* v_scale_per_head = nullptr;  ///< [num_kv_heads], or nullptr
  float k_scale = 1.0f;               ///< per-tensor scale, used when the per-head one is nullptr
  float v_scale = 1.0f;
  std::int32_t num_seqs = 0;
  std::int32_t num_qo_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t max_kv_len = 0;        ///< host-side upper bound of every kv_len(i); sizes the grid, so
                                      ///< a captured CUDA graph stays valid while lengths grow below it
  std::int32_t max_splits = 0;        ///< > 0: split a sequence into at most this many split-K chunks
                                      ///< (1: never split, no merge); 0: chosen for the GPU's SMs
  float sm_scale = 0.0f;              ///< logit = sm_scale * q.k (before the soft-cap and ALiBi)
  float logit_soft_cap = 0.0f;        ///< > 0: logit = cap * tanh(logit / cap)
  std::int32_t window_left = -1;      ///< >= 0: attend only to positions >= pos - window_left
  const float* alibi_slopes = nullptr; ///< [num_qo_heads] ALiBi slopes, or nullptr: the logit of query
                                      ///< head h at position pos for token t gains slopes[h] * (t - pos),
                                      ///< after the soft-cap (host memory for the reference, device
                                      ///< memory for the CUDA kernels)
  dtype q_dtype = dtype::bf16;        ///< also the output's
  dtype kv_dtype = dtype::bf16;

  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t group_size() const { return num_qo_heads / num_kv_heads; }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t kv_len(std::int32_t seq) const { return table.kv_len(seq); }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t q_begin(std::int32_t seq) const {
    return q_indptr ? q_indptr[seq] : seq;
  }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t q_len(std::int32_t seq) const {
    return q_indptr ? q_indptr[seq + 1] - q_indptr[seq] : 1;
  }
  [[nodiscard]] PAGEDKV_HOST_DEVICE float k_scale_of(std::int32_t kv_head) const {
    return k_scale_per_head ? k_scale_per_head[kv_head] : k_scale;
  }
  [[nodiscard]] PAGEDKV_HOST_DEVICE float v_scale_of(std::int32_t kv_head) const {
    return v_scale_per_head ? v_scale_per_head[kv_head] : v_scale;
  }
  /// Element offset of (block, token in block, kv head) from k or v.
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t kv_offset(block_id block, std::int32_t token,
                                                           std::int32_t kv_head) const {
    return block * block_stride + token * token_stride + kv_head * head_stride;
  }
  /// Points k, v and the strides at `layer` of a pool with layout l at pool_base.
  void set_kv(const kv_cache_layout& l, const void* pool_base, std::int32_t layer) {
    const auto* base = static_cast<const unsigned char*>(pool_base);
    const std::size_t es = size_of(l.kv_dtype);
    k = base + std::size_t(l.offset(layer, 0, 0, 0, 0)) * es;
    v = base + std::size_t(l.offset(layer, 1, 0, 0, 0)) * es;
    block_stride = l.block_stride;
    token_stride = l.token_stride;
    head_stride = l.head_stride;
    num_kv_heads = l.shape.num_kv_heads;
    head_dim = l.shape.head_dim;
    kv_dtype = l.kv_dtype;
    table.block_size = l.shape.block_size;
  }
};
static_assert(std::is_trivially_copyable_v<attention_params>);

/// Checks the sizes and pointers that every implementation relies on; throws
/// errc::invalid_argument naming the first bad value. Reads no pointed-to memory.
inline void check(const attention_params& p) {
  using pagedkv::detail::fail;
  if (p.num_seqs < 0) fail(errc::invalid_argument, "num_seqs ", p.num_seqs, " must be >= 0");
  if (p.num_kv_heads < 1) fail(errc::invalid_argument, "num_kv_heads ", p.num_kv_heads, " must be >= 1");
  if (p.num_qo_heads < 1 || p.num_qo_heads % p.num_kv_heads != 0)
    fail(errc::invalid_argument, "num_qo_heads ", p.num_qo_heads, " must be a positive multiple of num_kv_heads ",
         p.num_kv_heads);
  if (p.head_dim < 1) fail(errc::invalid_argument, "head_dim ", p.head_dim, " must be >= 1");
  if (p.table.block_size < 1 || p.table.block_size > max_kernel_block_size)
    fail(errc::invalid_argument, "block_size ", p.table.block_size, " must be in [1, ", max_kernel_block_size, "]");
  if (p.q_dtype == dtype::fp8_e4m3) fail(errc::invalid_argument, "q_dtype fp8_e4m3 is not supported");
  if (p.kv_dtype != p.q_dtype && p.kv_dtype != dtype::fp8_e4m3)
    fail(errc::invalid_argument, "kv_dtype ", to_string(p.kv_dtype), " must equal q_dtype ", to_string(p.q_dtype),
         " or be fp8_e4m3");
  if (p.num_seqs > 0 && (!p.q || !p.o || !p.k || !p.v || !p.table.indices))
    fail(errc::invalid_argument, "q, o, k, v and table.indices must be set");
  if (!p.table.is_csr() && !p.table.kv_lens) fail(errc::invalid_argument, "a dense table needs kv_lens");
  if (p.table.is_csr() && !p.table.last_block_len) fail(errc::invalid_argument, "a CSR table needs last_block_len");
  if (p.max_kv_len < 0) fail(errc::invalid_argument, "max_kv_len ", p.max_kv_len, " must be >= 0");
  if (p.max_splits < 0) fail(errc::invalid_argument, "max_splits ", p.max_splits, " must be >= 0");
}

}  // namespace pagedkv::kernels
