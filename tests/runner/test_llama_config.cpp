// llama_config from GGUF metadata and from a Hugging Face config.json, and the errors that name a
// missing or inconsistent key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "gguf_writer.hpp"
#include "hf5_rope_configs.hpp"
#include "llama_config.hpp"
#include "load_error.hpp"
#include "smollm2_config.hpp"

namespace pagedkv::llama {
namespace {

using testing::gguf_writer;

// The 9 metadata keys of a small valid LLaMA; the caller writes `extra_kvs` more and its tensors.
gguf_writer llama_header(std::uint64_t extra_kvs, std::uint64_t num_tensors = 0) {
  gguf_writer w;
  w.header(num_tensors, 9 + extra_kvs)
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
  test::expect_smollm2_config(config_from_hf_json(smollm2_config_json, "config.json"));
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

// ---- transformers 5 "rope_parameters" and the 4.x "rope_theta" + "rope_scaling" ----------------

TEST(llama_config, hf5_rope_parameters) {
  using namespace test;
  const auto none = config_from_hf_json(hf5_default_config, "config.json");
  EXPECT_EQ(none.rope_scaling.type, rope_scaling_type::none);
  EXPECT_EQ(none.rope_theta, 10000.0);
  EXPECT_EQ(none.head_dim, 16);
  EXPECT_EQ(none.context_length, 4096);

  const auto linear = config_from_hf_json(hf5_linear_config, "config.json");
  EXPECT_EQ(linear.rope_scaling.type, rope_scaling_type::linear);
  EXPECT_EQ(linear.rope_scaling.factor, 2.0);

  const auto llama3 = config_from_hf_json(hf5_llama3_config, "config.json");
  EXPECT_EQ(llama3.rope_scaling.type, rope_scaling_type::llama3);
  EXPECT_EQ(llama3.rope_theta, 500000.0);
  EXPECT_EQ(llama3.rope_scaling.factor, 8.0);
  EXPECT_EQ(llama3.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(llama3.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(llama3.rope_scaling.original_context_length, 1024);

  const auto yarn = config_from_hf_json(hf5_yarn_config, "config.json");
  EXPECT_EQ(yarn.rope_scaling.type, rope_scaling_type::yarn);
  EXPECT_EQ(yarn.rope_scaling.factor, 4.0);
  EXPECT_EQ(yarn.rope_scaling.original_context_length, 1024);
  EXPECT_EQ(yarn.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(yarn.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(yarn.rope_scaling.mscale, 1.0);
  EXPECT_EQ(yarn.rope_scaling.mscale_all_dim, 0.5);
  EXPECT_TRUE(yarn.rope_scaling.truncate);
  // get_mscale(4, 1) / get_mscale(4, 0.5)
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.attention_factor, (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0));

  const auto yarn_af = config_from_hf_json(hf5_yarn_attention_factor_config, "config.json");
  EXPECT_EQ(yarn_af.rope_scaling.attention_factor, 0.9);
  EXPECT_FALSE(yarn_af.rope_scaling.truncate);
  EXPECT_EQ(yarn_af.rope_scaling.beta_fast, 32.0);  // Hugging Face's defaults
  EXPECT_EQ(yarn_af.rope_scaling.beta_slow, 1.0);
}

// Precedence as transformers 5.17's LlamaConfig.from_dict resolves it (checked in its venv).
TEST(llama_config, hf_rope_formats_and_precedence) {
  const std::string head = R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 4096)";
  const auto parse = [&](const std::string& rest) { return config_from_hf_json(head + rest, "config.json"); };
  // 4.x: top-level rope_theta, rope_scaling with "type" for "rope_type"
  auto c = parse(R"(, "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}})");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, rope_scaling_type::linear);
  // the object's rope_theta wins over the top-level one; without one, the top-level one counts
  EXPECT_EQ(parse(R"(, "rope_theta": 123.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}})").rope_theta, 500.0);
  EXPECT_EQ(parse(R"(, "rope_theta": 123.0, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})").rope_theta, 123.0);
  // a non-empty rope_scaling replaces rope_parameters; null or {} does not
  c = parse(R"(, "rope_scaling": {"rope_type": "linear", "factor": 3.0},
               "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}})");
  EXPECT_EQ(c.rope_scaling.factor, 3.0);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(parse(R"(, "rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})").rope_scaling.factor, 2.0);
  EXPECT_EQ(parse(R"(, "rope_scaling": null, "rope_theta": 77.0})").rope_theta, 77.0);
  // original_max_position_embeddings: the top-level one wins, else the object's, else max_position_embeddings
  EXPECT_EQ(parse(R"(, "original_max_position_embeddings": 2048,
               "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024}})")
                .rope_scaling.original_context_length, 2048);
  c = parse(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})");
  EXPECT_EQ(c.rope_scaling.original_context_length, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0);  // get_mscale(factor)
  // yarn with a null factor takes max_position_embeddings / original_max_position_embeddings
  EXPECT_EQ(parse(R"(, "rope_parameters": {"rope_type": "yarn", "factor": null, "original_max_position_embeddings": 1024}})")
                .rope_scaling.factor, 4.0);
  // beta_fast or 32: zero means the default
  EXPECT_EQ(parse(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 0}})").rope_scaling.beta_fast, 32.0);
  // a factor below 1 gives no yarn attention scaling
  EXPECT_EQ(parse(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 0.5}})").rope_scaling.attention_factor, 1.0);
}

std::string hf_error(const char* json);

// Mistral's sliding_window is on every layer (its layer_types ignored, as transformers does);
// Ministral's on the layers layer_types names sliding_attention; a llama config has none.
TEST(llama_config, hf_sliding_windows) {
  const std::string head = R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
    "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 4096)";
  const auto parse = [&](const std::string& rest) { return config_from_hf_json(head + rest, "config.json"); };
  const std::string types = R"("layer_types": ["sliding_attention", "full_attention", "sliding_attention"])";
  EXPECT_EQ(parse(R"(, "model_type": "mistral", "sliding_window": 24})").layer_windows, (std::vector<std::int32_t>{24, 24, 24}));
  EXPECT_EQ(parse(R"(, "model_type": "mistral", "sliding_window": 24, )" + types + "}").layer_windows,
            (std::vector<std::int32_t>{24, 24, 24}));
  EXPECT_TRUE(parse(R"(, "model_type": "mistral", "sliding_window": null})").layer_windows.empty());
  const llama_config ministral = parse(R"(, "model_type": "ministral", "sliding_window": 7, )" + types + "}");
  EXPECT_EQ(ministral.layer_windows, (std::vector<std::int32_t>{7, 0, 7}));
  EXPECT_EQ(ministral.window(1), 0);
  EXPECT_TRUE(parse(R"(, "model_type": "llama", "sliding_window": 24})").layer_windows.empty());
  EXPECT_EQ(hf_error((head + R"(, "model_type": "ministral", "sliding_window": 7,
    "layer_types": ["sliding_attention", "chunked_attention", "full_attention"]})").c_str()),
            "config.json: layer_types[1]: layer type chunked_attention is not supported (full_attention, sliding_attention)");
  EXPECT_EQ(hf_error((head + R"(, "model_type": "ministral", "sliding_window": null, )" + types + "}").c_str()),
            "config.json: layer_types[0]: sliding_attention without a sliding_window");
  EXPECT_EQ(hf_error((head + R"(, "model_type": "ministral", "sliding_window": 7, "layer_types": ["full_attention"]})").c_str()),
            "config.json: layer_types: expected an array of num_hidden_layers = 3 strings");
  EXPECT_EQ(hf_error((head + R"(, "model_type": "mistral", "sliding_window": 0})").c_str()),
            "config.json: sliding_window: value 0 is outside [1, 16777216]");
  EXPECT_EQ(hf_error((head + R"(, "model_type": "qwen2"})").c_str()),
            "config.json: model_type: model type 'qwen2' is not LLaMA-family (llama, mistral, ministral)");
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

TEST(llama_config, hf_rope_errors_name_the_field) {
  const std::string head = R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 4096)";
  const auto error = [&](const std::string& rest) { return hf_error((head + rest).c_str()); };
  EXPECT_EQ(error(R"(, "rope_parameters": [1]})"), "config.json: rope_parameters: expected an object, found array");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": 3}})"),
            "config.json: rope_parameters.rope_type: expected a string, found number");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})"),
            "config.json: rope_parameters.rope_type: RoPE scaling 'dynamic' is not supported");
  EXPECT_EQ(error(R"(, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})"),
            "config.json: rope_scaling.rope_type: RoPE scaling 'longrope' is not supported");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": "big"}})"),
            "config.json: rope_parameters.rope_theta: expected a number, found string");
  EXPECT_EQ(error(R"(, "rope_theta": -1})"), "config.json: rope_theta: must be positive, got -1");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})"),
            "config.json: rope_parameters.partial_rotary_factor: partial rotary embeddings (0.5) are not supported");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "linear"}})"),
            "config.json: rope_parameters.factor: the key is missing");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "linear", "factor": 0}})"),
            "config.json: rope_parameters.factor: must be positive, got 0");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}})"),
            "config.json: rope_parameters.low_freq_factor: the key is missing");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}})"),
            "config.json: rope_parameters.high_freq_factor: 4 must exceed low_freq_factor 4");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 10.5}})"),
            "config.json: rope_parameters.original_max_position_embeddings: expected an integer, found number");
  EXPECT_EQ(error(R"(, "original_max_position_embeddings": -3, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})"),
            "config.json: original_max_position_embeddings: value -3 is outside [1, 16777216]");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn"}})"), "config.json: rope_parameters.factor: the key is missing");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": -1}})"),
            "config.json: rope_parameters.beta_fast: must be positive, got -1");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_slow": "x"}})"),
            "config.json: rope_parameters.beta_slow: expected a number, found string");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 0}})"),
            "config.json: rope_parameters.attention_factor: must be positive, got 0");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "truncate": 1}})"),
            "config.json: rope_parameters.truncate: expected a boolean, found number");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mscale": -20, "mscale_all_dim": 1}})"),
            "config.json: rope_scaling.mscale: mscale -20 and mscale_all_dim 1 give the attention factor -0.361254");
  EXPECT_EQ(error(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1}})"),
            "config.json: rope_theta: yarn divides by log(rope_theta), which is 0");
}

// ---- GGUF: llama.cpp's llama3 scaling as the rope_freqs.weight tensor ---------------------------

TEST(llama_config, gguf_rope_freqs_tensor) {
  const auto file = [](const std::vector<float>& divisors, std::uint64_t length, bool linear) {
    auto w = llama_header(linear ? 2 : 0, 1);
    if (linear) w.kv_string("llama.rope.scaling.type", "linear").kv_f32("llama.rope.scaling.factor", 2.0f);
    w.tensor_info("rope_freqs.weight", {length}, 0, 0).align().data(divisors);  // type 0: F32
    return w;
  };
  const std::vector<float> divisors = {1.0f, 1.0f, 1.5f, 3.0f, 8.0f, 8.0f, 8.0f, 8.0f};  // head_dim 16: 8 frequencies
  const auto config = config_from_gguf(gguf_file::parse(file(divisors, 8, false).bytes, "cfg.gguf"));
  EXPECT_EQ(config.rope_scaling.type, rope_scaling_type::none);
  EXPECT_EQ(config.rope_scaling.frequency_divisors, divisors);

  const auto error = [&](const gguf_writer& w) {
    try {
      (void)config_from_gguf(gguf_file::parse(w.bytes, "cfg.gguf"));
    } catch (const load_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(file({1.0f, 2.0f, 3.0f, 4.0f}, 4, false)).find("tensor 'rope_freqs.weight' at byte"), std::string::npos);
  EXPECT_NE(error(file({1.0f, 2.0f, 0.0f, 4.0f, 1.0f, 1.0f, 1.0f, 1.0f}, 8, false)).find("divisor 0 is not positive"),
            std::string::npos);
  EXPECT_EQ(error(file(divisors, 8, true)),
            "cfg.gguf: tensor 'rope_freqs.weight': per-frequency factors together with linear scaling are not supported");
}

}  // namespace
}  // namespace pagedkv::llama
