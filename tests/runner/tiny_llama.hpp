// A tiny random-weight LLaMA (GQA, untied head) for the model and engine tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "llama_config.hpp"
#include "llama_weights.hpp"

namespace pagedkv::llama::test {

inline llama_config tiny_config() {
  llama_config c;
  c.architecture = "llama";
  c.embedding_dim = 32;
  c.ffn_dim = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;  // GQA: two queries per K/V head
  c.head_dim = 8;
  c.rope_dim = 8;
  c.vocab_size = 41;
  c.context_length = 256;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  return c;
}

inline llama_weights tiny_weights(const llama_config& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const auto fill = [&](std::int64_t size, float scale, float offset = 0.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(static_cast<std::size_t>(size));
    for (float& x : v) x = offset + dist(rng);
    return v;
  };
  const std::int64_t d = c.embedding_dim, q = c.num_heads * c.head_dim, kv = c.kv_dim();
  llama_weights w;
  w.token_embedding = fill(c.vocab_size * d, 1.0f);
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    llama_layer_weights lw;
    lw.attn_norm = fill(d, 0.1f, 1.0f);
    lw.wq = fill(q * d, 0.5f);  // large enough that attention is far from uniform
    lw.wk = fill(kv * d, 0.5f);
    lw.wv = fill(kv * d, 0.2f);
    lw.wo = fill(d * q, 0.2f);
    lw.ffn_norm = fill(d, 0.1f, 1.0f);
    lw.w_gate = fill(c.ffn_dim * d, 0.2f);
    lw.w_up = fill(c.ffn_dim * d, 0.2f);
    lw.w_down = fill(d * c.ffn_dim, 0.2f);
    w.layers.push_back(std::move(lw));
  }
  w.output_norm = fill(d, 0.1f, 1.0f);
  w.output = fill(c.vocab_size * d, 0.5f);
  return w;
}

/// A random model of a given attention shape (tiny_weights' scales), wide enough for the GPU's
/// decode kernel (head_dim 64 or 128), which its decode graphs need.
inline llama_config shaped(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t layers) {
  llama_config c = tiny_config();
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = c.rope_dim = head_dim;
  c.embedding_dim = 256;
  c.ffn_dim = 384;
  c.num_layers = layers;
  c.vocab_size = 300;
  return c;
}

/// tiny_weights of config, with Q and K scaled down 4 times: its logits of q.k (std about 64 at
/// head_dim 64-128) make softmax one-hot and amplify bf16's rounding of q and k (2^-9 of 64) past
/// any useful tolerance; a sixteenth of that (std about 4) is as sharp as trained models attend.
inline llama_weights shaped_weights(const llama_config& config, std::uint32_t seed) {
  llama_weights w = tiny_weights(config, seed);
  for (llama_layer_weights& l : w.layers)
    for (std::vector<float>* m : {&l.wq, &l.wk})
      for (float& x : *m) x *= 0.25f;
  return w;
}

/// The tiny model with weights of seed 5, built once per test program (the engine tests share it).
struct tiny_model {
  llama_config config = tiny_config();
  llama_weights weights = tiny_weights(config, 5);
};

inline const tiny_model& shared_tiny_model() {
  static const tiny_model m;
  return m;
}

}  // namespace pagedkv::llama::test
