// The CPU model against Hugging Face transformers on the same weights (goldens written by
// tools/make_hf_golden.py, transformers 5.17 / torch 2.11, float32 on the CPU, eager attention):
// - tiny random-weight LLaMAs saved by transformers as safetensors + config.json (GQA, MQA with
//   tied embeddings, RoPE linear / llama3 / yarn; float32, bfloat16 and float16 weights): logits
//   at every position of four prompts run as one ragged batch over shuffled blocks, and 16 greedy
//   tokens through the engine;
// - a tiny Mistral (a 24-token sliding window on every layer) and a tiny Ministral (layer_types:
//   a 32-token window on every other layer), with prompts of 40 and 97 tokens past the window: the
//   same logits, and greedy tokens through the engine on the hybrid KV cache manager, with window
//   freeing on and off;
// - SmolLM2-135M-Instruct from the Q4_1 GGUF, dequantized by transformers/gguf-py: the prompt's
//   token ids, the top-16 logits at every position and 24 greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine.hpp"
#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model.hpp"
#include "tokenizer.hpp"

namespace {

using namespace pagedkv::llama;
using pagedkv::block_id;
using pagedkv::token_id;
using nlohmann::json;

const std::filesystem::path golden_dir = PAGEDKV_GOLDEN_DIR;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return json::parse(in);
}

std::vector<float> read_floats(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<float> values(std::filesystem::file_size(path) / sizeof(float));
  in.read(reinterpret_cast<char*>(values.data()), std::streamsize(values.size() * sizeof(float)));
  return values;
}

// Logits agree when |ours - hf| <= abs + rel * scale, scale = the largest |logit| of HF's row at
// that position: float32 rounding grows with the size of the terms summed, not with the one
// logit's value. Both sides compute in float32 from the same weights; only the order of additions
// differs (OpenBLAS here, torch's CPU kernels there).
struct tolerance {
  double abs, rel;
};
constexpr tolerance tiny_tolerance{2e-5, 2e-5};
constexpr tolerance smollm2_tolerance{2e-4, 2e-5};  // 30 layers, logits up to ~25

struct error_summary {
  double max_abs = 0.0, max_rel = 0.0;
  std::int64_t failures = 0;
  void add(double ours, double hf, double scale, tolerance tol) {
    const double err = std::abs(ours - hf);
    max_abs = std::max(max_abs, err);
    max_rel = std::max(max_rel, err / scale);
    if (!(err <= tol.abs + tol.rel * scale)) ++failures;
  }
};

std::vector<std::vector<token_id>> greedy_continuations(const llama_config& config, const llama_weights& weights,
                                                        const tokenizer* tok,
                                                        const std::vector<std::vector<token_id>>& prompts,
                                                        std::int32_t count) {
  engine_options options;
  options.num_blocks = 128;
  engine e(config, weights, tok, options);
  std::vector<pagedkv::request_id> ids;
  for (const auto& p : prompts) ids.push_back(e.add_request(p, {.max_tokens = count, .ignore_eos = true}));
  e.run();
  std::vector<std::vector<token_id>> out;
  for (const auto id : ids) out.push_back(e.result(id).completions.at(0).tokens);
  return out;
}

// ---- tiny random-weight models -------------------------------------------------------------------

class hf_tiny : public testing::TestWithParam<std::string> {};

TEST_P(hf_tiny, logits_at_every_position_match_transformers) {
  const std::filesystem::path dir = golden_dir / "hf_tiny" / GetParam();
  const hf_checkpoint model = load_hf_checkpoint(dir);
  const json golden = read_json(dir / "golden.json");
  const std::vector<float> hf_logits = read_floats(dir / "logits.f32");
  const std::int64_t vocab = model.config.vocab_size;
  ASSERT_EQ(golden.at("vocab_size").get<std::int64_t>(), vocab);

  // All prompts in one ragged batch, blocks of 7 tokens in shuffled order.
  constexpr std::int32_t block_size = 7, max_blocks = 16, num_blocks = 64;
  std::vector<block_id> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(7));
  paged_kv_cache cache = make_paged_kv_cache(model.config, num_blocks, block_size);
  forward_batch batch;
  for (const json& prompt : golden.at("prompts")) {
    const auto ids = prompt.at("ids").get<std::vector<token_id>>();
    const auto len = std::int32_t(ids.size());
    const std::int32_t seq = batch.num_seqs();
    for (std::int32_t b = 0; b < max_blocks; ++b) {
      const bool used = b * block_size < len;
      batch.block_table.push_back(used ? free_blocks.back() : pagedkv::null_block);
      if (used) free_blocks.pop_back();
    }
    for (std::int32_t p = 0; p < len; ++p) {
      const block_id block = batch.block_table[std::size_t(seq * max_blocks + p / block_size)];
      batch.logit_rows.push_back(batch.num_tokens());
      batch.tokens.push_back(ids[std::size_t(p)]);
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(block * block_size + p % block_size);
    }
    batch.q_indptr.push_back(batch.num_tokens());
    batch.kv_lens.push_back(len);
  }
  batch.max_blocks_per_seq = max_blocks;
  // Every KV cache group's layers on the same blocks: each layer has its own slice of a block.
  batch.num_groups = std::int32_t(attention_groups_of(model.config).specs.size());
  const std::vector<pagedkv::slot_id> slots = batch.slot_mapping;
  const std::vector<block_id> rows = batch.block_table;
  for (std::int32_t g = 1; g < batch.num_groups; ++g) {
    batch.slot_mapping.insert(batch.slot_mapping.end(), slots.begin(), slots.end());
    batch.block_table.insert(batch.block_table.end(), rows.begin(), rows.end());
  }
  ASSERT_EQ(hf_logits.size(), std::size_t(batch.num_tokens() * vocab));

  forward_state state;
  const std::vector<float>& ours = forward(model.config, model.weights, cache, batch, state);
  error_summary errors;
  for (std::size_t row = 0; row < hf_logits.size() / std::size_t(vocab); ++row) {
    const float* hf = hf_logits.data() + row * std::size_t(vocab);
    double scale = 0.0;
    for (std::int64_t v = 0; v < vocab; ++v) scale = std::max(scale, double(std::abs(hf[v])));
    for (std::int64_t v = 0; v < vocab; ++v)
      errors.add(ours[row * std::size_t(vocab) + std::size_t(v)], hf[v], scale, tiny_tolerance);
  }
  EXPECT_EQ(errors.failures, 0) << "max abs error " << errors.max_abs << ", max relative " << errors.max_rel;
  RecordProperty("max_abs_error", std::to_string(errors.max_abs));
  RecordProperty("max_rel_error", std::to_string(errors.max_rel));
}

TEST_P(hf_tiny, greedy_continuations_match_transformers) {
  const std::filesystem::path dir = golden_dir / "hf_tiny" / GetParam();
  const hf_checkpoint model = load_hf_checkpoint(dir);
  const json golden = read_json(dir / "golden.json");
  std::vector<std::vector<token_id>> prompts, expected;
  for (const json& prompt : golden.at("prompts")) {
    prompts.push_back(prompt.at("ids").get<std::vector<token_id>>());
    expected.push_back(prompt.at("greedy").get<std::vector<token_id>>());
  }
  EXPECT_EQ(greedy_continuations(model.config, model.weights, nullptr, prompts, std::int32_t(expected[0].size())),
            expected);
}

// Window freeing changes which blocks a windowed layer keeps, never what it reads: the engine's
// greedy tokens on the hybrid manager are transformers' with freeing on and off, at an odd block
// size with the whole batch at once and at 16 with prefills chunked 13 tokens at a time; and
// freeing lowers the peak of blocks in use.
class hf_tiny_window : public testing::TestWithParam<std::string> {};

TEST_P(hf_tiny_window, greedy_tokens_are_the_same_with_window_freeing_on_and_off) {
  const std::filesystem::path dir = golden_dir / "hf_tiny" / GetParam();
  const hf_checkpoint model = load_hf_checkpoint(dir);
  ASSERT_FALSE(model.config.layer_windows.empty()) << "config.json has no sliding window";
  const json golden = read_json(dir / "golden.json");
  std::vector<std::vector<token_id>> prompts, expected;
  for (const json& prompt : golden.at("prompts")) {
    prompts.push_back(prompt.at("ids").get<std::vector<token_id>>());
    expected.push_back(prompt.at("greedy").get<std::vector<token_id>>());
  }
  for (const auto& [block_size, step_tokens] : {std::pair{3, 512}, std::pair{16, 13}}) {
    std::int32_t peak[2] = {0, 0};
    for (const bool freeing : {true, false}) {
      engine_options options;
      options.num_blocks = 1024;
      options.block_size = block_size;
      options.max_tokens_per_step = step_tokens;
      options.free_outside_window = freeing;
      engine e(model.config, model.weights, nullptr, options);
      std::vector<pagedkv::request_id> ids;
      for (const auto& p : prompts)
        ids.push_back(e.add_request(p, {.max_tokens = std::int32_t(expected[0].size()), .ignore_eos = true}));
      while (e.step()) peak[freeing ? 0 : 1] = std::max(peak[freeing ? 0 : 1], e.kv_usage().num_used_blocks);
      std::vector<std::vector<token_id>> got;
      for (const auto id : ids) got.push_back(e.result(id).completions.at(0).tokens);
      EXPECT_EQ(got, expected) << "block size " << block_size << ", window freeing " << (freeing ? "on" : "off");
    }
    EXPECT_LT(peak[0], peak[1]) << "block size " << block_size << ": freeing kept as many blocks";
    RecordProperty("peak_blocks_b" + std::to_string(block_size), std::to_string(peak[0]) + " vs " + std::to_string(peak[1]));
  }
}

INSTANTIATE_TEST_SUITE_P(models, hf_tiny,
                         testing::Values("gqa", "mqa_tied", "linear", "llama3", "yarn", "mistral", "ministral"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(models, hf_tiny_window, testing::Values("mistral", "ministral"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- SmolLM2-135M-Instruct -----------------------------------------------------------------------

struct smollm2 {
  gguf_file file = gguf_file::open(PAGEDKV_SMOLLM2_PATH);
  llama_config config = config_from_gguf(file);
  llama_weights weights = load_llama_weights(file, config);
  tokenizer tok = tokenizer::from_gguf(file);
};

const smollm2& smollm2_model() {
  static const smollm2 m;
  return m;
}

const json& smollm2_golden() {
  static const json golden = read_json(golden_dir / "smollm2_logits.json");
  return golden;
}

TEST(hf_smollm2, token_ids_match_transformers) {
  for (const json& prompt : smollm2_golden().at("prompts"))
    EXPECT_EQ(smollm2_model().tok.encode(prompt.at("text").get<std::string>()),
              prompt.at("ids").get<std::vector<token_id>>());
}

TEST(hf_smollm2, top_logits_at_every_position_match_transformers) {
  const smollm2& m = smollm2_model();
  error_summary errors;
  for (const json& prompt : smollm2_golden().at("prompts")) {
    const auto ids = prompt.at("ids").get<std::vector<token_id>>();
    const auto len = std::int32_t(ids.size());
    constexpr std::int32_t block_size = 16;
    const std::int32_t num_blocks = (len + block_size - 1) / block_size;
    paged_kv_cache cache = make_paged_kv_cache(m.config, num_blocks, block_size);
    forward_batch batch;
    batch.tokens = ids;
    for (std::int32_t p = 0; p < len; ++p) {
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(p);
      batch.logit_rows.push_back(p);
    }
    batch.q_indptr.push_back(len);
    batch.kv_lens.push_back(len);
    batch.max_blocks_per_seq = num_blocks;
    for (block_id b = 0; b < num_blocks; ++b) batch.block_table.push_back(b);
    forward_state state;
    const std::vector<float>& ours = forward(m.config, m.weights, cache, batch, state);

    const auto top_ids = prompt.at("top_ids").get<std::vector<std::vector<token_id>>>();
    const auto top_logits = prompt.at("top_logits").get<std::vector<std::vector<double>>>();
    for (std::int32_t p = 0; p < len; ++p) {
      const float* row = ours.data() + std::int64_t(p) * m.config.vocab_size;
      for (std::size_t k = 0; k < top_ids[std::size_t(p)].size(); ++k)
        errors.add(row[top_ids[std::size_t(p)][k]], top_logits[std::size_t(p)][k],
                   std::abs(top_logits[std::size_t(p)][0]), smollm2_tolerance);
      // HF's most likely token is ours too wherever its lead is beyond the tolerance.
      const auto& hf = top_logits[std::size_t(p)];
      if (hf[0] - hf[1] > 2 * (smollm2_tolerance.abs + smollm2_tolerance.rel * std::abs(hf[0]))) {
        EXPECT_EQ(std::max_element(row, row + m.config.vocab_size) - row, top_ids[std::size_t(p)][0])
            << "position " << p;
      }
    }
  }
  EXPECT_EQ(errors.failures, 0) << "max abs error " << errors.max_abs << ", max relative " << errors.max_rel;
  RecordProperty("max_abs_error", std::to_string(errors.max_abs));
}

TEST(hf_smollm2, greedy_continuations_match_transformers) {
  std::vector<std::vector<token_id>> prompts, expected;
  for (const json& prompt : smollm2_golden().at("prompts")) {
    prompts.push_back(prompt.at("ids").get<std::vector<token_id>>());
    expected.push_back(prompt.at("greedy").get<std::vector<token_id>>());
  }
  const smollm2& m = smollm2_model();
  EXPECT_EQ(greedy_continuations(m.config, m.weights, &m.tok, prompts, std::int32_t(expected[0].size())), expected);
}

}  // namespace
