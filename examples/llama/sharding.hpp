// Tensor parallelism's sharding plan (Megatron-style) for a LLaMA-family model over N ranks, and
// the weight slicing it implies. Host code, no GPU: the CUDA runner applies it at load.
//
// Per layer, with x the replicated residual stream [tokens, embedding_dim]:
//   Q, K, V   column-parallel by heads: rank r computes its query heads and the KV heads they read;
//   O         row-parallel: rank r multiplies its heads' attention output by its columns of wo and
//             the ranks' partial products are summed (an all-reduce) before the residual add;
//   gate, up  column-parallel by FFN columns; down row-parallel by the same columns, then all-reduce.
// The token embedding and the LM head are sharded by vocabulary: rank r holds rows
// [r * vocab_shard, (r + 1) * vocab_shard) (the last padded with zero rows to vocab_shard), embeds
// the tokens it holds (zero for the others; an all-reduce sums the ranks' rows) and computes its
// slice of every logits row; the sampler gathers the slices (for greedy: each rank's maximum).
// The KV cache follows the heads: every rank's pool has the same blocks, of its KV heads only.
//
// KV heads fewer than ranks (GQA with few KV heads, MQA): each KV head is replicated on
// ranks / num_kv_heads ranks, as vLLM does, so that every rank's query heads find their KV head
// locally; the K/V projection and pool cost grows by that factor on each rank, nothing else changes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "llama_config.hpp"
#include "llama_weights.hpp"

namespace pagedkv::llama {

/// The tensor-parallel sizes the runner supports.
inline constexpr std::int32_t supported_tensor_parallel_sizes[] = {1, 2, 4};

/// Indices [begin, end).
struct index_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  [[nodiscard]] std::int64_t size() const noexcept { return end - begin; }
  [[nodiscard]] bool contains(std::int64_t i) const noexcept { return begin <= i && i < end; }
  friend bool operator==(const index_range&, const index_range&) = default;
};

/// What one rank holds.
struct tensor_parallel_shard {
  std::int32_t rank = 0;
  index_range q_heads;   ///< query heads: rows of wq, columns of wo (times head_dim)
  index_range kv_heads;  ///< KV heads: rows of wk and wv (times head_dim), the heads of its pool slice
  index_range ffn;       ///< FFN columns: rows of w_gate and w_up, columns of w_down
  index_range vocab;     ///< token ids of its embedding rows and logit columns (the rest of its
                         ///< vocab_shard rows are zero padding)
  /// The rank's model as the forward sees it: num_heads, num_kv_heads, ffn_dim its own, and
  /// vocab_size the plan's vocab_shard (its padded embedding and LM head rows).
  llama_config config;
};

struct tensor_parallel_plan {
  std::int32_t ranks = 1;
  std::int64_t vocab_size = 0;   ///< the whole model's
  std::int64_t vocab_shard = 0;  ///< rows of every rank's embedding and LM head: ceil(vocab_size / ranks)
  /// Ranks that hold each KV head: 1, or ranks / num_kv_heads when the KV heads are fewer.
  std::int32_t kv_head_replicas = 1;
  std::vector<tensor_parallel_shard> shards;  ///< [ranks]

  /// Elements of every rank's all-reduce after O and after down for num_tokens tokens.
  [[nodiscard]] std::int64_t all_reduce_elements(std::int64_t num_tokens) const noexcept {
    return shards.empty() ? 0 : num_tokens * shards.front().config.embedding_dim;
  }
};

/// The plan for `ranks` ranks. Errors: pagedkv::error (invalid_argument) naming the problem: ranks
/// not in supported_tensor_parallel_sizes; query heads not divisible by ranks; KV heads neither a
/// multiple of ranks nor a divisor of them; a config whose query heads are not a multiple of its
/// KV heads; a vocabulary or FFN narrower than the ranks; a model with sliding windows.
tensor_parallel_plan make_tensor_parallel_plan(const llama_config& config, std::int32_t ranks);

/// The weights of one shard of the plan, sliced (copied) from the whole model's: what the rank
/// loads. Tied embeddings stay tied (the vocabulary slice serves both). Errors: pagedkv::error
/// (invalid_argument) when `weights` do not have `config`'s shapes.
llama_weights shard_weights(const llama_config& config, const llama_weights& weights, const tensor_parallel_shard& shard);

}  // namespace pagedkv::llama
