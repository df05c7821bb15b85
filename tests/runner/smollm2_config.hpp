// SmolLM2-135M-Instruct's configuration, as both of its sources must give it: the Hugging Face
// config.json (test_llama_config) and the Q4_1 GGUF (test_smollm2_load).
#pragma once

#include <gtest/gtest.h>

#include "llama_config.hpp"

namespace pagedkv::llama::test {

inline void expect_smollm2_config(const llama_config& config) {
  EXPECT_EQ(config.architecture, "llama");
  EXPECT_EQ(config.embedding_dim, 576);
  EXPECT_EQ(config.ffn_dim, 1536);
  EXPECT_EQ(config.num_layers, 30);
  EXPECT_EQ(config.num_heads, 9);
  EXPECT_EQ(config.num_kv_heads, 3);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.rope_dim, 64);
  EXPECT_EQ(config.vocab_size, 49152);
  EXPECT_EQ(config.context_length, 8192);
  EXPECT_EQ(config.rope_theta, 100000.0f);
  EXPECT_EQ(config.rope_scaling.type, rope_scaling_type::none);
  EXPECT_TRUE(config.rope_scaling.frequency_divisors.empty());
  EXPECT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(config.tied_embeddings);
}

}  // namespace pagedkv::llama::test
