// The SmolLM2 tokenizer built from the GGUF's metadata against Hugging Face tokenizers' ids on the
// golden corpus (tests/runner/golden/tokenizer_cases.json) and its chat template.
#include <gtest/gtest.h>

#include <filesystem>

#include "chat_template.hpp"
#include "gguf.hpp"
#include "tokenizer.hpp"
#include "tokenizer_golden.hpp"

namespace pagedkv::llama {
namespace {

class smollm2 : public ::testing::Test {
 protected:
  static const tokenizer& tok() {
    static const tokenizer t = tokenizer::from_gguf(gguf_file::open(PAGEDKV_SMOLLM2_PATH));
    return t;
  }
  void SetUp() override {
    if (!std::filesystem::exists(PAGEDKV_SMOLLM2_PATH))
      GTEST_SKIP() << PAGEDKV_SMOLLM2_PATH << " is missing: run scripts/fetch-model.sh (ctest does)";
  }
};

TEST_F(smollm2, tokenizer_metadata) {
  EXPECT_EQ(tok().model(), tokenizer_model::byte_level_bpe);
  EXPECT_EQ(tok().spec().pre, pre_tokenizer::gpt2_digits);
  EXPECT_EQ(tok().vocab_size(), 49152u);
  EXPECT_EQ(tok().bos_id(), 1);
  EXPECT_EQ(tok().eos_id(), 2);
  EXPECT_FALSE(tok().add_bos());
  EXPECT_EQ(tok().token_text(2), "<|im_end|>");
}

TEST_F(smollm2, ids_match_hf_tokenizers) {
  const auto cases = testing::tokenizer_golden().at("smollm2");
  EXPECT_EQ(testing::expect_golden_ids(tok(), "smollm2"), static_cast<int>(cases.size()));
  int round_trips = 0;
  for (const auto& c : cases) {
    // Round trip wherever HF's tokenizer round-trips: SmolLM2's vocabulary lacks a few bytes
    // (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, lead bytes 0xF1 and up), which both drop.
    const auto text = c.at("text").get<std::string>();
    if (c.at("decoded").get<std::string>() == text) {
      EXPECT_EQ(tok().decode(tok().encode(text)), text) << "round trip of " << nlohmann::json(text).dump();
      ++round_trips;
    }
  }
  EXPECT_GT(round_trips, 150);
}

TEST_F(smollm2, chat_template_matches_hf) {
  for (const auto& chat : testing::tokenizer_golden().at("smollm2_chat")) {
    std::vector<chat_message> messages;
    for (const auto& m : chat.at("messages")) messages.push_back({m.at("role"), m.at("content")});
    const auto text = format_chatml(messages, chat.at("add_generation_prompt").get<bool>());
    EXPECT_EQ(text, chat.at("text").get<std::string>());
    EXPECT_EQ(tok().encode(text), chat.at("ids").get<std::vector<token_id>>());
  }
}

// --chat reads the file's tokenizer.chat_template: ChatML with SmolLM2's default system prompt,
// rendering as format_chatml does.
TEST_F(smollm2, the_files_chat_template_is_chatml_with_its_system_prompt) {
  const chat_template t = chat_template::from_gguf(gguf_file::open(PAGEDKV_SMOLLM2_PATH), tok());
  EXPECT_EQ(t.format, chat_format::chatml);
  EXPECT_EQ(t.default_system_prompt, smollm2_default_system_prompt);
  const std::vector<chat_message> chat = {{"user", "Hi"}};
  EXPECT_EQ(t.render(chat), format_chatml(chat));
}

}  // namespace
}  // namespace pagedkv::llama
