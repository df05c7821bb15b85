// llama_config from GGUF metadata and from a Hugging Face config.json, and the errors that name a
// missing or inconsistent key.
#include <gtest/gtest.h>

#include <string>

#include "gguf.hpp"
#include "gguf_writer.hpp"
#include "llama_config.hpp"
#include "load_error.hpp"

namespace pagedkv::llama {
namespace {

using testing::gguf_writer;

gguf_writer llama_header(std::uint64_t extra_kvs) {
  gguf_writer w;
  w.header(0, 9 + extra_kvs)
      .kv_string("general.architecture", "llama")
      .kv_u32("llama.embedding_length", 96)
      .kv_u32("llama.feed_forward_length", 256)
      .kv_u32("llama.block_count", 3)
      .kv_u32("llama.attention.head_count", 6)
      .kv_u32("llama.attention.head_count_kv", 2)
      .kv_u32("llama.context_length", 512)
      .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f)
      .kv_u32("llama.vocab_size", 300);
  return w;
}

TEST(llama_config, from_gguf_metadata) {
  auto w = llama_header(3);
  w.kv_f32("llama.rope.freq_base", 500000.0f).kv_string("llama.rope.scaling.type", "linear").kv_f32("llama.rope.scaling.factor", 4.0f);
  const auto config = config_from_gguf(gguf_file::parse(w.bytes, "cfg.gguf"));
  EXPECT_EQ(config.architecture, "llama");
  EXPECT_EQ(config.embedding_dim, 96);
  EXPECT_EQ(config.ffn_dim, 256);
  EXPECT_EQ(config.num_layers, 3);
  EXPECT_EQ(config.num_heads, 6);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.rope_dim, 16);
  EXPECT_EQ(config.kv_dim(), 32);
  EXPECT_EQ(config.queries_per_kv_head(), 3);
  EXPECT_EQ(config.vocab_size, 300);
  EXPECT_EQ(config.context_length, 512);
  EXPECT_EQ(config.rope_theta, 500000.0f);
  EXPECT_EQ(config.rope_scaling.type, rope_scaling_type::linear);
  EXPECT_EQ(config.rope_scaling.factor, 4.0f);
  EXPECT_EQ(config.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(config.tied_embeddings);  // no output.weight tensor
}

TEST(llama_config, gguf_errors_name_the_key) {
  auto bad_heads = llama_header(1);
  bad_heads.kv_u32("llama.attention.head_count_kv", 4);  // duplicate key is caught by the parser
  EXPECT_THROW((void)config_from_gguf(gguf_file::parse(bad_heads.bytes, "cfg.gguf")), load_error);

  gguf_writer missing;
  missing.header(0, 1).kv_string("general.architecture", "llama");
  try {
    (void)config_from_gguf(gguf_file::parse(missing.bytes, "cfg.gguf"));
    FAIL() << "expected load_error";
  } catch (const load_error& e) {
    EXPECT_STREQ(e.what(), "cfg.gguf: metadata 'llama.embedding_length': the key is missing");
  }

  gguf_writer other;
  other.header(0, 1).kv_string("general.architecture", "gpt2");
  EXPECT_THROW((void)config_from_gguf(gguf_file::parse(other.bytes, "cfg.gguf")), load_error);
}

// SmolLM2-135M-Instruct's config.json as published on the Hugging Face hub (abridged).
constexpr const char* smollm2_config_json = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 576, "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "vocab_size": 49152
})";

TEST(llama_config, from_hf_config_json) {
  const auto config = config_from_hf_json(smollm2_config_json, "config.json");
  EXPECT_EQ(config.embedding_dim, 576);
  EXPECT_EQ(config.ffn_dim, 1536);
  EXPECT_EQ(config.num_layers, 30);
  EXPECT_EQ(config.num_heads, 9);
  EXPECT_EQ(config.num_kv_heads, 3);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.vocab_size, 49152);
  EXPECT_EQ(config.context_length, 8192);
  EXPECT_EQ(config.rope_theta, 100000.0f);
  EXPECT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(config.tied_embeddings);
  EXPECT_EQ(config.rope_scaling.type, rope_scaling_type::none);
}

TEST(llama_config, hf_rope_scaling_llama3) {
  const auto config = config_from_hf_json(R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 10, "max_position_embeddings": 128,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}})",
                                          "config.json");
  EXPECT_EQ(config.head_dim, 32);  // explicit, not hidden_size / heads
  EXPECT_EQ(config.rope_scaling.type, rope_scaling_type::llama3);
  EXPECT_EQ(config.rope_scaling.factor, 8.0f);
  EXPECT_EQ(config.rope_scaling.original_context_length, 8192);
  EXPECT_FALSE(config.tied_embeddings);
}

std::string hf_error(const char* json) {
  try {
    (void)config_from_hf_json(json, "config.json");
  } catch (const load_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(llama_config, hf_errors_name_the_key) {
  EXPECT_EQ(hf_error(R"({"hidden_size": 64)"), "config.json: JSON at byte 19: [json.exception.parse_error.101] parse error at line 1, column 19: syntax error while parsing object - unexpected end of input; expected '}'");
  EXPECT_EQ(hf_error(R"({"hidden_size": 1e536})"),
            "config.json: JSON: [json.exception.out_of_range.406] number overflow parsing '1e536'");
  EXPECT_EQ(hf_error(R"([1])"), "config.json: JSON: the top level is not an object");
  EXPECT_EQ(hf_error(R"({"hidden_size": "64"})"), "config.json: hidden_size: expected an integer, found string");
  EXPECT_EQ(hf_error(R"({"hidden_size": 64})"), "config.json: intermediate_size: the key is missing");
  EXPECT_EQ(hf_error(R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 3, "vocab_size": 10, "max_position_embeddings": 128})"),
            "config.json: num_kv_heads: 3 key/value heads do not divide 4 query heads");
  EXPECT_EQ(hf_error(R"({"hidden_size": -64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "vocab_size": 10, "max_position_embeddings": 128})"),
            "config.json: embedding_dim: value -64 is outside [1, 1048576]");
}

}  // namespace
}  // namespace pagedkv::llama
