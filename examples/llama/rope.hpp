// Rotary position embeddings as Hugging Face transformers 5.17 computes them for LLaMA
// (modeling_rope_utils.py for the inverse frequencies, LlamaRotaryEmbedding.forward for the rest):
// a rope_table of per-dimension inverse frequencies and an attention factor, built once from the
// config; then per step float32 angles and their cos and sin, shared by q, k and every layer.
#pragma once

#include <cstdint>
#include <vector>

#include "llama_config.hpp"

namespace pagedkv::llama {

/// What a config's RoPE scaling (none, linear, llama3, yarn) comes down to.
struct rope_table {
  std::vector<float> inv_freq;    ///< [rope_dim / 2] float32, as Hugging Face's inv_freq buffer
  float attention_factor = 1.0f;  ///< multiplies cos and sin (yarn's attention scaling; 1 otherwise)
};

/// The table of `config`, with Hugging Face's float32 arithmetic step by step, so that the angles
/// agree with transformers on the CPU to the last bit but for libm's powf.
rope_table make_rope_table(const llama_config& config);

/// cos and sin of each token's angles, already multiplied by the attention factor.
struct rope_angles {
  std::int64_t half_dim = 0;  ///< rope_dim / 2
  std::vector<float> cos;  ///< [num_tokens, rope_dim / 2]
  std::vector<float> sin;  ///< [num_tokens, rope_dim / 2]
};

/// angle = inv_freq[i] * float(position), rounded to float32 as torch's matmul of the two does.
void compute_rope_angles(const rope_table& table, const std::int32_t* positions, std::int64_t num_tokens,
                         rope_angles& out);

/// Rotates the leading rope_dim dimensions of each head of x [num_tokens, num_heads * head_dim] in
/// place, Hugging Face's rotate_half pairing: dimension i turns with i + rope_dim / 2.
void apply_rope(float* x, std::int64_t num_tokens, std::int64_t num_heads, std::int64_t head_dim,
                const rope_angles& angles);

}  // namespace pagedkv::llama
