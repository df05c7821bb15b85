// Loading a whole LLaMA model's weights: tensor names and shapes from GGUF and from Hugging Face
// safetensors checkpoints (single file and sharded), the undoing of llama.cpp's Q/K row
// permutation, tied embeddings, and errors naming a missing or misshapen tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "gguf_writer.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "load_error.hpp"
#include "safetensors.hpp"

namespace pagedkv::llama {
namespace {

// A tiny GQA model: 2 query heads share 1 KV head of width 4.
constexpr int dim = 8, heads = 2, kv_heads = 1, head_dim = 4, ffn = 12, vocab = 10;

// Every tensor's values are its element index plus a per-tensor offset, so a test can tell any
// element of any tensor apart.
struct tensor_def {
  std::string hf_name;
  std::string gguf_name;
  std::vector<std::int64_t> shape;
};
std::vector<tensor_def> model_tensors(bool with_output) {
  std::vector<tensor_def> defs = {{"model.embed_tokens.weight", "token_embd.weight", {vocab, dim}},
                                  {"model.norm.weight", "output_norm.weight", {dim}},
                                  {"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", {dim}},
                                  {"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", {heads * head_dim, dim}},
                                  {"model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", {kv_heads * head_dim, dim}},
                                  {"model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", {kv_heads * head_dim, dim}},
                                  {"model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", {dim, heads * head_dim}},
                                  {"model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", {dim}},
                                  {"model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", {ffn, dim}},
                                  {"model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", {ffn, dim}},
                                  {"model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", {dim, ffn}}};
  if (with_output) defs.push_back({"lm_head.weight", "output.weight", {vocab, dim}});
  return defs;
}

std::vector<float> values_of(std::size_t tensor_index, const std::vector<std::int64_t>& shape) {
  const auto count = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  std::vector<float> values(static_cast<std::size_t>(count));
  std::iota(values.begin(), values.end(), 1000.0f * static_cast<float>(tensor_index));
  return values;
}

// llama.cpp's convert_hf_to_gguf.py permute(): rows of each head reordered so RoPE pairs are adjacent.
std::vector<float> permute_like_llama_cpp(const std::vector<float>& hf, int n_heads, int columns) {
  std::vector<float> out(hf.size());
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < half; ++i)
        std::memcpy(&out[static_cast<std::size_t>((h * head_dim + 2 * i + s) * columns)],
                    &hf[static_cast<std::size_t>((h * head_dim + s * half + i) * columns)], sizeof(float) * columns);
  return out;
}

llama_config tiny_config(bool tied) {
  llama_config c;
  c.architecture = "llama";
  c.embedding_dim = dim;
  c.ffn_dim = ffn;
  c.num_layers = 1;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.rope_dim = head_dim;
  c.vocab_size = vocab;
  c.context_length = 64;
  c.tied_embeddings = tied;
  return c;
}

std::vector<std::uint8_t> tiny_gguf(bool with_output) {
  const auto defs = model_tensors(with_output);
  testing::gguf_writer w;
  w.header(defs.size(), 0);
  std::uint64_t offset = 0;
  for (const auto& def : defs) {
    std::vector<std::uint64_t> dims(def.shape.rbegin(), def.shape.rend());
    w.tensor_info(def.gguf_name, dims, 0, offset);
    offset += (values_of(0, def.shape).size() * 4 + 31) / 32 * 32;
  }
  w.align();
  for (std::size_t t = 0; t < defs.size(); ++t) {
    auto values = values_of(t, defs[t].shape);
    if (defs[t].gguf_name == "blk.0.attn_q.weight") values = permute_like_llama_cpp(values, heads, dim);
    if (defs[t].gguf_name == "blk.0.attn_k.weight") values = permute_like_llama_cpp(values, kv_heads, dim);
    w.data(values).align();
  }
  return w.bytes;
}

void expect_hf_values(const llama_weights& w, bool with_output) {
  // Tensor i of model_tensors() holds values_of(i): the loaded weights must hold exactly those,
  // with Q and K back in Hugging Face's row order.
  EXPECT_EQ(w.token_embedding, values_of(0, {vocab, dim}));
  EXPECT_EQ(w.output_norm, values_of(1, {dim}));
  ASSERT_EQ(w.layers.size(), 1u);
  const auto& l = w.layers[0];
  EXPECT_EQ(l.attn_norm, values_of(2, {dim}));
  EXPECT_EQ(l.wq, values_of(3, {heads * head_dim, dim}));
  EXPECT_EQ(l.wk, values_of(4, {kv_heads * head_dim, dim}));
  EXPECT_EQ(l.wv, values_of(5, {kv_heads * head_dim, dim}));
  EXPECT_EQ(l.wo, values_of(6, {dim, heads * head_dim}));
  EXPECT_EQ(l.ffn_norm, values_of(7, {dim}));
  EXPECT_EQ(l.w_gate, values_of(8, {ffn, dim}));
  EXPECT_EQ(l.w_up, values_of(9, {ffn, dim}));
  EXPECT_EQ(l.w_down, values_of(10, {dim, ffn}));
  if (with_output) {
    EXPECT_EQ(w.output, values_of(11, {vocab, dim}));
    EXPECT_EQ(&w.output_matrix(), &w.output);
  } else {
    EXPECT_TRUE(w.output.empty());
    EXPECT_EQ(&w.output_matrix(), &w.token_embedding);
  }
}

TEST(llama_weights, from_gguf_unpermutes_q_and_k) {
  for (const bool with_output : {false, true}) {
    SCOPED_TRACE(with_output ? "separate output" : "tied embeddings");
    const auto file = gguf_file::parse(tiny_gguf(with_output), "tiny.gguf");
    expect_hf_values(load_llama_weights(file, tiny_config(!with_output)), with_output);
  }
}

TEST(llama_weights, gguf_errors_name_the_tensor) {
  const auto file = gguf_file::parse(tiny_gguf(false), "tiny.gguf");
  auto config = tiny_config(true);
  config.ffn_dim = 16;
  try {
    (void)load_llama_weights(file, config);
    FAIL() << "expected load_error";
  } catch (const load_error& e) {
    EXPECT_STREQ(e.what(), "tiny.gguf: tensor 'blk.0.ffn_gate.weight' dims at byte 479: shape [12, 8] does not match the config's [16, 8]");
  }
  config = tiny_config(false);  // untied: output.weight is required
  EXPECT_THROW((void)load_llama_weights(file, config), load_error);
}

std::vector<std::uint8_t> safetensors_of(const std::vector<std::pair<std::string, std::vector<float>>>& tensors,
                                         const std::vector<std::vector<std::int64_t>>& shapes) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<std::uint8_t> data;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto begin = data.size();
    data.resize(begin + tensors[i].second.size() * 4);
    std::memcpy(data.data() + begin, tensors[i].second.data(), tensors[i].second.size() * 4);
    header[tensors[i].first] = {{"dtype", "F32"}, {"shape", shapes[i]}, {"data_offsets", {begin, data.size()}}};
  }
  const auto text = header.dump();
  const std::uint64_t length = text.size();
  std::vector<std::uint8_t> bytes(8 + text.size() + data.size());
  std::memcpy(bytes.data(), &length, 8);
  std::memcpy(bytes.data() + 8, text.data(), text.size());
  std::memcpy(bytes.data() + 8 + text.size(), data.data(), data.size());
  return bytes;
}

void write(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

class hf_directory : public ::testing::Test {
 protected:
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("pagedkv_hf_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write(dir / "config.json", std::string(R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 12,
      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10,
      "max_position_embeddings": 64, "tie_word_embeddings": false})"));
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
};

TEST_F(hf_directory, single_safetensors_file) {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  std::vector<std::vector<std::int64_t>> shapes;
  const auto defs = model_tensors(true);
  for (std::size_t t = 0; t < defs.size(); ++t) {
    tensors.emplace_back(defs[t].hf_name, values_of(t, defs[t].shape));
    shapes.push_back(defs[t].shape);
  }
  write(dir / "model.safetensors", safetensors_of(tensors, shapes));
  const auto checkpoint = load_hf_checkpoint(dir);
  EXPECT_EQ(checkpoint.config.num_kv_heads, 1);
  expect_hf_values(checkpoint.weights, true);
}

TEST_F(hf_directory, sharded_checkpoint) {
  const auto defs = model_tensors(true);
  std::vector<std::pair<std::string, std::vector<float>>> first, second;
  std::vector<std::vector<std::int64_t>> first_shapes, second_shapes;
  nlohmann::json weight_map;
  for (std::size_t t = 0; t < defs.size(); ++t) {
    const bool in_first = t % 2 == 0;
    (in_first ? first : second).emplace_back(defs[t].hf_name, values_of(t, defs[t].shape));
    (in_first ? first_shapes : second_shapes).push_back(defs[t].shape);
    weight_map[defs[t].hf_name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write(dir / "model-00001-of-00002.safetensors", safetensors_of(first, first_shapes));
  write(dir / "model-00002-of-00002.safetensors", safetensors_of(second, second_shapes));
  write(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  expect_hf_values(load_hf_checkpoint(dir).weights, true);

  weight_map["lm_head.weight"] = "../outside.safetensors";
  write(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  EXPECT_THROW((void)load_hf_checkpoint(dir), load_error);
}

TEST_F(hf_directory, missing_tensor_is_named) {
  write(dir / "model.safetensors", safetensors_of({{"model.embed_tokens.weight", values_of(0, {vocab, dim})}}, {{vocab, dim}}));
  try {
    (void)load_hf_checkpoint(dir);
    FAIL() << "expected load_error";
  } catch (const load_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'model.norm.weight': missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagedkv::llama
