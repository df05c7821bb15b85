// The tensor-parallel plan and weight slicing (sharding.hpp).
#include "sharding.hpp"

#include <algorithm>
#include <string>

#include <pagedkv/error.hpp>

namespace pagedkv::llama {

namespace {

using pagedkv::detail::fail;

/// Rank r's part of n items split as evenly as whole items allow (the first ranks get no fewer).
index_range even_split(std::int64_t n, std::int32_t ranks, std::int32_t r) {
  return {n * r / ranks, n * (r + 1) / ranks};
}

/// The rows [rows.begin, rows.end) of a row-major matrix of `columns` columns, followed by
/// pad_rows zero rows.
std::vector<float> slice_rows(const std::vector<float>& m, std::int64_t columns, index_range rows,
                              std::int64_t pad_rows = 0) {
  std::vector<float> out(std::size_t((rows.size() + pad_rows) * columns), 0.0f);
  std::copy(m.begin() + rows.begin * columns, m.begin() + rows.end * columns, out.begin());
  return out;
}

/// The columns [cols.begin, cols.end) of every row of a row-major [rows, columns] matrix.
std::vector<float> slice_columns(const std::vector<float>& m, std::int64_t rows, std::int64_t columns, index_range cols) {
  std::vector<float> out(std::size_t(rows * cols.size()));
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(m.begin() + r * columns + cols.begin, m.begin() + r * columns + cols.end, out.begin() + r * cols.size());
  return out;
}

void check_size(const std::vector<float>& v, std::int64_t expected, const char* name, std::int64_t layer = -1) {
  if (std::int64_t(v.size()) != expected)
    fail(errc::invalid_argument, "shard_weights: ", name, layer >= 0 ? " of layer " + std::to_string(layer) : "",
         " has ", v.size(), " elements, the config needs ", expected);
}

}  // namespace

tensor_parallel_plan make_tensor_parallel_plan(const llama_config& config, std::int32_t ranks) {
  if (std::ranges::find(supported_tensor_parallel_sizes, ranks) == std::end(supported_tensor_parallel_sizes))
    fail(errc::invalid_argument, "tensor-parallel size ", ranks, " is not supported: use 1, 2 or 4");
  const std::int64_t heads = config.num_heads, kv_heads = config.num_kv_heads;
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    fail(errc::invalid_argument, "tensor parallelism needs query heads (", heads, ") a positive multiple of KV heads (",
         kv_heads, ")");
  if (heads % ranks != 0)
    fail(errc::invalid_argument, "tensor-parallel size ", ranks, " does not divide the ", heads, " query heads");
  if (kv_heads % ranks != 0 && ranks % kv_heads != 0)
    fail(errc::invalid_argument, "tensor-parallel size ", ranks, " and the ", kv_heads,
         " KV heads: one must divide the other (KV heads split across ranks, or each replicated on ranks / KV heads)");
  if (!config.layer_windows.empty())  // the ranks' backends would need the KV cache groups too
    fail(errc::invalid_argument, "tensor parallelism has no model with sliding windows yet: run this one on one GPU");
  if (config.ffn_dim < ranks || config.vocab_size < ranks)
    fail(errc::invalid_argument, "tensor-parallel size ", ranks, " is more than the FFN width (", config.ffn_dim,
         ") or the vocabulary (", config.vocab_size, ") can split over");

  tensor_parallel_plan plan;
  plan.ranks = ranks;
  plan.vocab_size = config.vocab_size;
  plan.vocab_shard = (config.vocab_size + ranks - 1) / ranks;
  plan.kv_head_replicas = kv_heads >= ranks ? 1 : std::int32_t(ranks / kv_heads);
  for (std::int32_t r = 0; r < ranks; ++r) {
    tensor_parallel_shard s;
    s.rank = r;
    s.q_heads = even_split(heads, ranks, r);
    // With replication, rank r's query heads all belong to KV head r / replicas: heads / ranks
    // query heads a rank, heads / kv_heads a KV head, and the first divides the second.
    s.kv_heads = kv_heads >= ranks ? even_split(kv_heads, ranks, r)
                                   : index_range{r / plan.kv_head_replicas, r / plan.kv_head_replicas + 1};
    s.ffn = even_split(config.ffn_dim, ranks, r);
    s.vocab = {std::min(config.vocab_size, r * plan.vocab_shard), std::min(config.vocab_size, (r + 1) * plan.vocab_shard)};
    s.config = config;
    s.config.num_heads = s.q_heads.size();
    s.config.num_kv_heads = s.kv_heads.size();
    s.config.ffn_dim = s.ffn.size();
    s.config.vocab_size = plan.vocab_shard;
    plan.shards.push_back(std::move(s));
  }
  return plan;
}

llama_weights shard_weights(const llama_config& config, const llama_weights& weights, const tensor_parallel_shard& shard) {
  const std::int64_t dim = config.embedding_dim, hd = config.head_dim, ffn = config.ffn_dim;
  const std::int64_t q_dim = config.num_heads * hd, kv_dim = config.kv_dim(), vocab = config.vocab_size;
  check_size(weights.token_embedding, vocab * dim, "token_embedding");
  check_size(weights.output_norm, dim, "output_norm");
  if (!weights.output.empty()) check_size(weights.output, vocab * dim, "output");
  if (std::int64_t(weights.layers.size()) != config.num_layers)
    fail(errc::invalid_argument, "shard_weights: ", weights.layers.size(), " layers, the config has ", config.num_layers);

  const index_range q_rows{shard.q_heads.begin * hd, shard.q_heads.end * hd};
  const index_range kv_rows{shard.kv_heads.begin * hd, shard.kv_heads.end * hd};
  const std::int64_t pad = shard.config.vocab_size - shard.vocab.size();
  llama_weights out;
  out.token_embedding = slice_rows(weights.token_embedding, dim, shard.vocab, pad);
  if (!weights.output.empty()) out.output = slice_rows(weights.output, dim, shard.vocab, pad);
  out.output_norm = weights.output_norm;
  for (std::int64_t l = 0; l < config.num_layers; ++l) {
    const llama_layer_weights& w = weights.layers[std::size_t(l)];
    check_size(w.attn_norm, dim, "attn_norm", l);
    check_size(w.wq, q_dim * dim, "wq", l);
    check_size(w.wk, kv_dim * dim, "wk", l);
    check_size(w.wv, kv_dim * dim, "wv", l);
    check_size(w.wo, dim * q_dim, "wo", l);
    check_size(w.ffn_norm, dim, "ffn_norm", l);
    check_size(w.w_gate, ffn * dim, "w_gate", l);
    check_size(w.w_up, ffn * dim, "w_up", l);
    check_size(w.w_down, dim * ffn, "w_down", l);
    llama_layer_weights s;
    s.attn_norm = w.attn_norm;
    s.wq = slice_rows(w.wq, dim, q_rows);
    s.wk = slice_rows(w.wk, dim, kv_rows);
    s.wv = slice_rows(w.wv, dim, kv_rows);
    s.wo = slice_columns(w.wo, dim, q_dim, q_rows);
    s.ffn_norm = w.ffn_norm;
    s.w_gate = slice_rows(w.w_gate, dim, shard.ffn);
    s.w_up = slice_rows(w.w_up, dim, shard.ffn);
    s.w_down = slice_columns(w.w_down, dim, ffn, shard.ffn);
    out.layers.push_back(std::move(s));
  }
  return out;
}

}  // namespace pagedkv::llama
