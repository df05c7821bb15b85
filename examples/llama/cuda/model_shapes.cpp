// The random-weight model shapes of timing runs (cuda_backend.hpp: named_model_shape). Published
// configurations of each model; the weights are random, so these runs time the engine, never text.
#include <string_view>

#include "cuda/cuda_backend.hpp"
#include "sharding.hpp"

namespace pagedkv::llama {

std::optional<llama_config> named_model_shape(std::string_view name) {
  // NAME@tpN: rank 0's shard of NAME at tensor-parallel size N, a model of its own on one GPU: the
  // TP step's compute without its communication.
  if (const std::size_t at = name.rfind("@tp"); at != std::string_view::npos) {
    const std::optional<llama_config> whole = named_model_shape(name.substr(0, at));
    const std::string_view ranks = name.substr(at + 3);
    if (!whole || ranks.size() != 1 || ranks[0] < '1' || ranks[0] > '9') return std::nullopt;
    return make_tensor_parallel_plan(*whole, ranks[0] - '0').shards.front().config;
  }
  llama_config c;
  c.architecture = "llama";
  c.rms_norm_eps = 1e-5f;
  c.vocab_size = 32000;
  c.context_length = 4096;
  c.head_dim = 128;
  c.rope_dim = 128;
  if (name == "llama2-7b") {
    c.embedding_dim = 4096, c.ffn_dim = 11008, c.num_layers = 32, c.num_heads = 32, c.num_kv_heads = 32;
  } else if (name == "llama3-8b") {
    c.embedding_dim = 4096, c.ffn_dim = 14336, c.num_layers = 32, c.num_heads = 32, c.num_kv_heads = 8;
    c.vocab_size = 128256, c.context_length = 8192, c.rope_theta = 500000.0;
  } else if (name == "llama2-13b") {
    c.embedding_dim = 5120, c.ffn_dim = 13824, c.num_layers = 40, c.num_heads = 40, c.num_kv_heads = 40;
  } else {
    return std::nullopt;
  }
  return c;
}

double bf16_weight_bytes_per_step(const llama_config& c) {
  const double dim = double(c.embedding_dim), q = double(c.num_heads * c.head_dim), kv = double(c.kv_dim());
  const double per_layer = (q * dim + 2 * kv * dim + dim * q + 3 * double(c.ffn_dim) * dim) * 2 + 2 * dim * 4;
  return per_layer * double(c.num_layers) + double(c.vocab_size) * dim * 2 + dim * 4;
}

}  // namespace pagedkv::llama
