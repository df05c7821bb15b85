// The CPU LLaMA forward pass over a ragged batch: prefill chunks and decode tokens of many
// sequences in one step, K/V kept in a paged float32 cache. Reads top to bottom in model.cpp:
// embeddings -> per layer (RMSNorm, Q/K/V, RoPE, write K/V by slot, paged attention, output
// projection, RMSNorm, SwiGLU) -> final norm -> LM head for the rows that need logits.
// Matrix products go through OpenBLAS; attention and the K/V scatter through the kernels' host
// reference (kernels/pagedkv/reference), so the CPU path runs the same semantics the GPU tests check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <pagedkv/kv_cache_spec.hpp>
#include <pagedkv/kv_layout.hpp>
#include <pagedkv/types.hpp>

#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "rope.hpp"
#include "thread_pool.hpp"

namespace pagedkv::llama {

/// Every layer's K and V blocks in one float32 allocation, layer-major, NHD inside a block.
struct paged_kv_cache {
  kernels::kv_cache_layout layout;
  std::vector<float> data;  ///< [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
};

/// The layout of such a cache: num_blocks blocks of block_size tokens of every layer's K and V,
/// NHD, float32. Errors: pagedkv::error (invalid_argument) for a size out of range.
kernels::kv_cache_layout paged_kv_cache_layout(const llama_config& config, std::int32_t num_blocks,
                                               std::int32_t block_size);

/// A zeroed cache of that layout.
paged_kv_cache make_paged_kv_cache(const llama_config& config, std::int32_t num_blocks, std::int32_t block_size);

/// The model's KV cache groups (hybrid_kv_cache_manager): layers that attend alike share a group,
/// numbered in the order of their first layer. A model without windows has one full group.
struct attention_groups {
  std::vector<kv_cache_spec> specs;          ///< [num_groups]
  std::vector<std::int32_t> group_of_layer;  ///< [num_layers]
};
attention_groups attention_groups_of(const llama_config& config);

/// One step's input: sequence i owns tokens [q_indptr[i], q_indptr[i + 1]), the last ones of its
/// first kv_lens[i] tokens; its K/V blocks are row i of `block_table`. With KV cache groups
/// (attention_groups_of the config: num_groups of them) the layers of group g write at row g of
/// slot_mapping and read table g of block_table (a windowed group's rows hold null_block before
/// its window); one block pool serves them all, each group's layers using their own slices.
struct forward_batch {
  std::vector<token_id> tokens;        ///< [num_tokens]
  std::vector<std::int32_t> positions; ///< [num_tokens] position of each token in its sequence
  std::vector<slot_id> slot_mapping;   ///< [num_groups, num_tokens] where each token's K/V goes
  std::vector<std::int32_t> q_indptr{0};  ///< [num_seqs + 1]
  std::vector<std::int32_t> kv_lens;   ///< [num_seqs] tokens of the sequence once this step ran
  std::vector<block_id> block_table;   ///< [num_groups, num_seqs, max_blocks_per_seq], null_block padded
  std::int32_t max_blocks_per_seq = 0;
  std::int32_t num_groups = 1;
  std::vector<std::int32_t> logit_rows;  ///< token indices whose logits are wanted, in output order

  [[nodiscard]] std::int32_t num_seqs() const { return std::int32_t(q_indptr.size()) - 1; }
  [[nodiscard]] std::int32_t num_tokens() const { return std::int32_t(tokens.size()); }
};

/// Scratch buffers of one forward, reused across steps.
struct forward_state {
  std::vector<float> x;       ///< [num_tokens, embedding_dim] residual stream
  std::vector<float> xb;      ///< [num_tokens, embedding_dim] normed input of a block
  std::vector<float> q;       ///< [num_tokens, num_heads * head_dim]
  std::vector<float> k;       ///< [num_tokens, kv_dim]
  std::vector<float> v;       ///< [num_tokens, kv_dim]
  std::vector<float> att;     ///< [num_tokens, num_heads * head_dim]
  std::vector<float> gate;    ///< [num_tokens, ffn_dim]
  std::vector<float> up;      ///< [num_tokens, ffn_dim]
  std::vector<float> rows;    ///< [num_logit_rows, embedding_dim]
  std::vector<float> logits;  ///< [num_logit_rows, vocab_size]
  rope_table rope;            ///< the config's inverse frequencies and attention factor
  rope_angles angles;         ///< cos and sin [num_tokens, rope_dim / 2] of this step's positions
  /// Threads the paged attention splits its query heads over; 0: std::thread::hardware_concurrency().
  /// The matrix products are OpenBLAS's to thread (OPENBLAS_NUM_THREADS).
  std::int32_t attention_threads = 0;
  std::shared_ptr<thread_pool> pool;  ///< made by the first forward that uses more than one thread
};

/// Runs the batch: writes its tokens' K/V into `cache` and returns logits
/// [batch.logit_rows.size(), vocab_size] in state.logits. Throws pagedkv::error
/// (invalid_argument) naming the inconsistent field of a malformed batch.
const std::vector<float>& forward(const llama_config& config, const llama_weights& weights, paged_kv_cache& cache,
                                  const forward_batch& batch, forward_state& state);

}  // namespace pagedkv::llama
