// The hyperparameters of a LLaMA-family model, read from GGUF metadata or from a Hugging Face
// config.json. A plain struct: the model code reads it, nothing validates it later.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv::llama {

class gguf_file;

enum class rope_scaling_type { none, linear, yarn, llama3 };
std::string_view to_string(rope_scaling_type type) noexcept;

/// RoPE frequency scaling for contexts past the trained length, with Hugging Face's names and
/// defaults (transformers 5.17, modeling_rope_utils.py). `factor` is 1 when there is none. Doubles,
/// because Hugging Face does its scalar arithmetic on these in Python floats before any float32.
struct rope_scaling_config {
  rope_scaling_type type = rope_scaling_type::none;
  double factor = 1.0;
  std::int64_t original_context_length = 0;  ///< the context the model was trained with (yarn, llama3)
  double low_freq_factor = 1.0;              ///< llama3 only
  double high_freq_factor = 4.0;             ///< llama3 only
  double beta_fast = 32.0;                   ///< yarn: rotations past which a dimension extrapolates
  double beta_slow = 1.0;                    ///< yarn: rotations below which a dimension interpolates
  double mscale = 0.0;                       ///< yarn: 0 unless set; with mscale_all_dim, shapes attention_factor
  double mscale_all_dim = 0.0;               ///< yarn: 0 unless set
  double attention_factor = 0.0;             ///< yarn: scales cos and sin; the loaders derive it from
                                             ///< factor and mscale when the file does not set it
  bool truncate = true;                      ///< yarn: round the correction range out to whole dimensions
  /// [rope_dim / 2] or empty: each inverse frequency is divided by its entry. GGUF's form of llama3
  /// scaling (the `rope_freqs.weight` tensor), with type none.
  std::vector<float> frequency_divisors;
};

struct llama_config {
  std::string architecture;         ///< "llama" for every model this runner serves (Mistral's too)
  std::int64_t embedding_dim = 0;   ///< width of the residual stream (hidden_size)
  std::int64_t ffn_dim = 0;         ///< width of the SwiGLU feed-forward (intermediate_size)
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;       ///< query heads
  std::int64_t num_kv_heads = 0;    ///< key/value heads; num_heads / num_kv_heads queries share one (GQA)
  std::int64_t head_dim = 0;        ///< embedding_dim / num_heads unless the file says otherwise
  std::int64_t rope_dim = 0;        ///< leading dimensions of each head that RoPE rotates (head_dim normally)
  std::int64_t vocab_size = 0;
  std::int64_t context_length = 0;  ///< the longest context the model was trained for
  double rope_theta = 10000.0;
  rope_scaling_config rope_scaling;
  float rms_norm_eps = 1e-5f;
  bool tied_embeddings = false;     ///< the output projection reuses the token embedding matrix
  /// [num_layers] or empty (every layer full): layer l attends to a sliding window of
  /// layer_windows[l] tokens, 0 for full attention. Transformers' sliding_window W: a query at p
  /// reads positions p - W + 1..p (masking_utils: kv_idx > q_idx - W), the kernels' window_left
  /// W - 1 and kv_cache_spec::sliding_window(W).
  std::vector<std::int32_t> layer_windows;

  [[nodiscard]] std::int32_t window(std::int64_t layer) const noexcept {
    return layer_windows.empty() ? 0 : layer_windows[std::size_t(layer)];
  }

  [[nodiscard]] std::int64_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
  [[nodiscard]] std::int64_t queries_per_kv_head() const noexcept { return num_heads / num_kv_heads; }
};

/// Reads `<arch>.*` metadata. Tied embeddings: the file has no `output.weight` tensor.
/// Throws load_error naming the key when one is missing, mistyped or inconsistent.
llama_config config_from_gguf(const gguf_file& file);

/// Parses a Hugging Face config.json (LlamaForCausalLM and its look-alikes: model_type llama,
/// mistral with its sliding_window on every layer, ministral with sliding_window on the layers
/// layer_types names sliding_attention). `file_name` appears in error messages. Throws load_error.
llama_config config_from_hf_json(std::string_view json_text, std::string_view file_name);
llama_config config_from_hf_json_file(const std::filesystem::path& path);

}  // namespace pagedkv::llama
