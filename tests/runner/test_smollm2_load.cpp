// Loads the real SmolLM2-135M-Instruct Q4_1 GGUF (fetched by the smollm2_model ctest fixture):
// its tensor types, its configuration, and dequantized tensors against gguf-py's dequantizer
// (tests/runner/golden/smollm2_tensors.json, written by tools/make_golden.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "smollm2_config.hpp"

namespace pagedkv::llama {
namespace {

const gguf_file& model() {
  static const gguf_file file = gguf_file::open(PAGEDKV_SMOLLM2_PATH);
  return file;
}

class smollm2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(PAGEDKV_SMOLLM2_PATH))
      GTEST_SKIP() << PAGEDKV_SMOLLM2_PATH << " is missing: run scripts/fetch-model.sh (ctest does)";
  }
};

TEST_F(smollm2, tensor_types_and_count) {
  EXPECT_EQ(model().version(), 3u);
  std::map<std::string, int> types;
  for (const auto& tensor : model().tensors()) ++types[std::string(layout_of(tensor.type)->name)];
  EXPECT_EQ(model().tensors().size(), 272u);
  EXPECT_EQ(types, (std::map<std::string, int>{{"F32", 61}, {"Q4_1", 210}, {"Q8_0", 1}}));
}

TEST_F(smollm2, config) { test::expect_smollm2_config(config_from_gguf(model())); }

// Our dequantizers against gguf-py's on Q8_0, Q4_1 and F32 tensors: the first and last values
// exactly (both compute d * q (+ m) in float32), the sums to float32 accumulation error.
TEST_F(smollm2, dequantized_tensors_match_gguf_py) {
  std::ifstream in(std::string(PAGEDKV_GOLDEN_DIR) + "/smollm2_tensors.json");
  ASSERT_TRUE(in) << "missing golden file";
  const auto golden = nlohmann::json::parse(in);
  ASSERT_GE(golden["tensors"].size(), 5u);
  for (const auto& expected : golden["tensors"]) {
    const auto name = expected["name"].get<std::string>();
    SCOPED_TRACE(name);
    const auto* tensor = model().find_tensor(name);
    ASSERT_NE(tensor, nullptr);
    EXPECT_EQ(layout_of(tensor->type)->name, expected["type"].get<std::string>());
    EXPECT_EQ(tensor->shape(), expected["shape"].get<std::vector<std::int64_t>>());
    const auto values = model().dequantize(*tensor);
    const auto first = expected["first"].get<std::vector<double>>();
    for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(values[i], static_cast<float>(first[i])) << i;
    const auto last = expected["last"].get<std::vector<double>>();
    for (std::size_t i = 0; i < last.size(); ++i) EXPECT_EQ(values[values.size() - last.size() + i], static_cast<float>(last[i])) << i;
    double sum = 0, abs_sum = 0;
    for (float v : values) {
      sum += v;
      abs_sum += std::abs(v);
    }
    const double abs_sum_expected = expected["abs_sum"].get<double>();
    EXPECT_NEAR(abs_sum, abs_sum_expected, 1e-9 * abs_sum_expected + 1e-9);
    EXPECT_NEAR(sum, expected["sum"].get<double>(), 1e-9 * abs_sum_expected + 1e-9);
  }
}

}  // namespace
}  // namespace pagedkv::llama

namespace pagedkv::llama {
namespace {

// Every weight of the model dequantized and in place: shapes from the config, tied embeddings,
// and values equal to the tensor read directly (Q and K up to llama.cpp's row permutation).
TEST_F(smollm2, all_weights_load) {
  const auto config = config_from_gguf(model());
  const auto weights = load_llama_weights(model(), config);
  EXPECT_EQ(weights.token_embedding.size(), 49152u * 576u);
  EXPECT_TRUE(weights.output.empty());
  EXPECT_EQ(&weights.output_matrix(), &weights.token_embedding);
  ASSERT_EQ(weights.layers.size(), 30u);
  const auto& last = weights.layers.back();
  EXPECT_EQ(last.wq.size(), 576u * 576u);
  EXPECT_EQ(last.wk.size(), 192u * 576u);
  EXPECT_EQ(last.w_down.size(), 576u * 1536u);
  EXPECT_EQ(last.w_down, model().dequantize("blk.29.ffn_down.weight"));
  // GGUF row 1 of head 0 (pair 0, second half) is Hugging Face row head_dim / 2 = 32.
  const auto gguf_q = model().dequantize("blk.29.attn_q.weight");
  EXPECT_TRUE(std::equal(gguf_q.begin() + 576, gguf_q.begin() + 2 * 576, last.wq.begin() + 32 * 576));
}

}  // namespace
}  // namespace pagedkv::llama
