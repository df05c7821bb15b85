// The weights of a LLaMA-family model as float32, loaded from a GGUF file (dequantized) or from
// Hugging Face safetensors (one file or a sharded checkpoint). Every matrix is row-major
// [out_features, in_features], as PyTorch's nn.Linear stores it, so y = W x reads row by row.
//
// RoPE convention: the loaded Q and K projections follow Hugging Face's layout, in which RoPE
// rotates dimension i of a head together with dimension i + head_dim / 2 ("rotate_half").
// llama.cpp's converter permutes the rows of Q and K so that the pairs are adjacent instead; the
// GGUF loader undoes that permutation, so the model code has one convention for both sources.
#pragma once

#include <filesystem>
#include <vector>

#include "llama_config.hpp"

namespace pagedkv::llama {

class gguf_file;
class safetensors_file;

struct llama_layer_weights {
  std::vector<float> attn_norm;  ///< [embedding_dim] RMS-norm gain before attention
  std::vector<float> wq;         ///< [num_heads * head_dim, embedding_dim]
  std::vector<float> wk;         ///< [num_kv_heads * head_dim, embedding_dim]
  std::vector<float> wv;         ///< [num_kv_heads * head_dim, embedding_dim]
  std::vector<float> wo;         ///< [embedding_dim, num_heads * head_dim]
  std::vector<float> ffn_norm;   ///< [embedding_dim] RMS-norm gain before the feed-forward
  std::vector<float> w_gate;     ///< [ffn_dim, embedding_dim]
  std::vector<float> w_up;       ///< [ffn_dim, embedding_dim]
  std::vector<float> w_down;     ///< [embedding_dim, ffn_dim]
};

struct llama_weights {
  std::vector<float> token_embedding;  ///< [vocab_size, embedding_dim]
  std::vector<llama_layer_weights> layers;
  std::vector<float> output_norm;      ///< [embedding_dim]
  std::vector<float> output;           ///< [vocab_size, embedding_dim]; empty with tied embeddings

  /// The matrix that maps the final hidden state to logits: `output`, or the token embedding when tied.
  [[nodiscard]] const std::vector<float>& output_matrix() const noexcept { return output.empty() ? token_embedding : output; }
};

/// Loads and dequantizes every weight named by llama.cpp's convention (token_embd.weight,
/// blk.N.attn_q.weight, ...), checking each shape against `config`. Throws load_error naming the
/// tensor that is missing or misshapen.
llama_weights load_llama_weights(const gguf_file& file, const llama_config& config);

/// Loads Hugging Face names (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
/// ...) from the given safetensors files (the shards of one checkpoint), checking each shape
/// against `config`. Throws load_error.
llama_weights load_llama_weights(const std::vector<const safetensors_file*>& shards, const llama_config& config);

/// A Hugging Face model directory: config.json, model.safetensors or the shards listed in
/// model.safetensors.index.json.
struct hf_checkpoint {
  llama_config config;
  llama_weights weights;
};
hf_checkpoint load_hf_checkpoint(const std::filesystem::path& directory);

/// Undoes llama.cpp's Q/K row permutation for a [num_heads * head_dim, columns] matrix in place:
/// GGUF row h * head_dim + 2 i + s holds Hugging Face row h * head_dim + s * head_dim / 2 + i.
void unpermute_rope_rows(std::vector<float>& matrix, std::int64_t num_heads, std::int64_t head_dim, std::int64_t columns);

}  // namespace pagedkv::llama
