// Tokenizers built from tokenizer.json files trained by tools/make_golden.py (byte-level BPE with
// SmolLM2's pipeline; LLaMA-2-style SentencePiece BPE with byte fallback) against Hugging Face
// tokenizers' ids, plus the pieces underneath: the GPT-2 split, Unicode categories, UTF-8 decoding,
// special-token handling and the errors of a bad tokenizer file.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "gguf_writer.hpp"
#include "load_error.hpp"
#include "pretokenize.hpp"
#include "tokenizer.hpp"
#include "tokenizer_golden.hpp"
#include "unicode.hpp"

namespace pagedkv::llama {
namespace {

std::string golden_path(const char* name) { return std::string(PAGEDKV_GOLDEN_DIR) + "/" + name; }

TEST(tokenizer, tiny_byte_level_bpe_matches_hf) {
  const auto tok = tokenizer::from_tokenizer_json_file(golden_path("tiny_bpe.tokenizer.json"));
  EXPECT_EQ(tok.model(), tokenizer_model::byte_level_bpe);
  EXPECT_EQ(tok.spec().pre, pre_tokenizer::gpt2_digits);
  const auto cases = testing::tokenizer_golden().at("tiny_bpe").size();
  EXPECT_EQ(testing::expect_golden_ids(tok, "tiny_bpe"), static_cast<int>(cases));
}

TEST(tokenizer, tiny_sentencepiece_bpe_matches_hf) {
  const auto tok = tokenizer::from_tokenizer_json_file(golden_path("tiny_spm.tokenizer.json"));
  EXPECT_EQ(tok.model(), tokenizer_model::sentencepiece_bpe);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.eos_id(), 2);
  const auto cases = testing::tokenizer_golden().at("tiny_spm").size();
  EXPECT_EQ(testing::expect_golden_ids(tok, "tiny_spm"), static_cast<int>(cases));
}

TEST(tokenizer, byte_level_round_trips_any_bytes) {
  const auto tok = tokenizer::from_tokenizer_json_file(golden_path("tiny_bpe.tokenizer.json"));
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  for (const std::string& text : {all_bytes, std::string("\xFF\xFE invalid \xC3 utf-8 \xE2\x82"), std::string("\xF0\x9F\x99")})
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(tokenizer, special_tokens_can_be_treated_as_text) {
  const auto tok = tokenizer::from_tokenizer_json_file(golden_path("tiny_bpe.tokenizer.json"));
  const auto im_start = tok.find("<|im_start|>");
  ASSERT_GE(im_start, 0);
  EXPECT_TRUE(tok.is_special(im_start));
  EXPECT_EQ(tok.encode("<|im_start|>"), std::vector<token_id>{im_start});
  const auto as_text = tok.encode("<|im_start|>", special_tokens::as_text);
  EXPECT_GT(as_text.size(), 1u);
  EXPECT_EQ(tok.decode(as_text), "<|im_start|>");
  EXPECT_THROW((void)tok.decode(std::vector<token_id>{static_cast<token_id>(tok.vocab_size())}), std::out_of_range);
  EXPECT_THROW((void)tok.token_to_piece(-1), std::out_of_range);
}

std::vector<std::string> split(std::string_view text) {
  const auto pieces = split_gpt2(text);
  return {pieces.begin(), pieces.end()};
}

TEST(pretokenize, gpt2_regex_cases) {
  using v = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (v{"Hello", " world"}));
  EXPECT_EQ(split("I'm they're it's 'S"), (v{"I", "'m", " they", "'re", " it", "'s", " '", "S"}));
  EXPECT_EQ(split("a   b"), (v{"a", "  ", " b"}));        // the last space joins the word
  EXPECT_EQ(split("a \t b"), (v{"a", " \t", " b"}));
  EXPECT_EQ(split("a\n\nb"), (v{"a", "\n", "\n", "b"}));  // a lone non-space-led run: \s+ one by one
  EXPECT_EQ(split("end   "), (v{"end", "   "}));          // trailing run kept whole
  EXPECT_EQ(split("x=1+22;"), (v{"x", "=", "1", "+", "22", ";"}));
  EXPECT_EQ(split(" !? \xE4\xBD\xA0\xE5\xA5\xBD"), (v{" !?", " \xE4\xBD\xA0\xE5\xA5\xBD"}));
  EXPECT_EQ(split("\xFF\xFEz"), (v{"\xFF\xFE", "z"}));     // invalid bytes are "other"
  EXPECT_EQ(split(""), v{});
  const auto digits = split_digits("ab12 3x");
  EXPECT_EQ((v{digits.begin(), digits.end()}), (v{"ab", "1", "2", " ", "3", "x"}));
}

TEST(unicode, categories_and_utf8) {
  EXPECT_TRUE(is_letter(U'a'));
  EXPECT_TRUE(is_letter(U'\u00E9'));
  EXPECT_TRUE(is_letter(U'\u4F60'));
  EXPECT_TRUE(is_letter(U'\u05E9'));
  EXPECT_FALSE(is_letter(U'1'));
  EXPECT_FALSE(is_letter(U'\U0001F642'));
  EXPECT_TRUE(is_number(U'\u0663'));
  EXPECT_TRUE(is_number(U'\u00BD'));
  EXPECT_TRUE(is_number(U'\u216B'));
  EXPECT_FALSE(is_number(U'x'));
  EXPECT_TRUE(is_whitespace(U'\u3000'));
  EXPECT_TRUE(is_whitespace(U'\u00A0'));
  EXPECT_FALSE(is_whitespace(U'\u200B'));  // zero-width space is not White_Space
  EXPECT_EQ(decode_utf8("\xF0\x9F\x99\x82", 0).code_point, U'\U0001F642');
  EXPECT_FALSE(decode_utf8("\xC0\xAF", 0).valid);      // overlong
  EXPECT_FALSE(decode_utf8("\xED\xA0\x80", 0).valid);  // surrogate
  EXPECT_FALSE(decode_utf8("\xF0\x9F", 0).valid);      // truncated
  EXPECT_EQ(decode_utf8("\xF0\x9F", 0).length, 1u);
  for (int b = 0; b < 256; ++b) {
    const auto mapped = byte_to_unicode(static_cast<std::uint8_t>(b));
    EXPECT_EQ(unicode_to_byte(decode_utf8(mapped, 0).code_point), b);
  }
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");  // Ġ
}

TEST(chat, chatml_format) {
  const std::vector<chat_message> chat = {{"user", "Hi"}};
  EXPECT_EQ(format_chatml(chat),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<chat_message> with_system = {{"system", "S"}, {"user", "U"}};
  EXPECT_EQ(format_chatml(with_system, false), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

std::string json_error(const std::string& json) {
  try {
    (void)tokenizer::from_tokenizer_json(json, "tokenizer.json");
  } catch (const load_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(tokenizer, bad_tokenizer_json_is_named) {
  EXPECT_EQ(json_error(R"({"model": {"type": "Unigram"}})"), "tokenizer.json: model.type: only BPE models are supported");
  EXPECT_EQ(json_error(R"({"model": {"type": "BPE", "vocab": {"a": 5}}, "pre_tokenizer": {"type": "ByteLevel"}})"),
            "tokenizer.json: model.vocab: id 5 of 'a' is not an integer in [0, 1)");
  EXPECT_EQ(json_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]}, "pre_tokenizer": {"type": "ByteLevel"}})"),
            "tokenizer.json: merges[0]: merge 'a' + 'c' uses or makes a token outside the vocabulary");
  EXPECT_EQ(json_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}, "pre_tokenizer": {"type": "ByteLevel"}})"),
            "tokenizer.json: merges[0]: 'ab' is not two tokens separated by a space");
  EXPECT_EQ(json_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Whitespace"}})"),
            "tokenizer.json: pre_tokenizer: the pipeline (normalizer '', pre-tokenizer 'Whitespace') is neither byte-level BPE nor SentencePiece BPE");
  EXPECT_NE(json_error("{\"model\": "), "no error");
}

TEST(tokenizer, gguf_metadata_errors_are_named) {
  testing::gguf_writer w;
  w.header(0, 3).kv_string("tokenizer.ggml.model", "gpt2").kv_strings("tokenizer.ggml.tokens", {"a", "b"}).kv_strings("tokenizer.ggml.merges", {"a b"});
  try {
    (void)tokenizer::from_gguf(gguf_file::parse(w.bytes, "tok.gguf"));
    FAIL() << "expected load_error";
  } catch (const load_error& e) {
    EXPECT_STREQ(e.what(), "tok.gguf: merges[0]: merge 'a' + 'b' uses or makes a token outside the vocabulary");
  }
  testing::gguf_writer bad_pre;
  bad_pre.header(0, 3).kv_string("tokenizer.ggml.model", "gpt2").kv_strings("tokenizer.ggml.tokens", {"a"}).kv_string("tokenizer.ggml.pre", "llama3");
  EXPECT_THROW((void)tokenizer::from_gguf(gguf_file::parse(bad_pre.bytes, "tok.gguf")), load_error);
}

// A SentencePiece vocabulary in GGUF form (scores, no merges), as llama.cpp's converter writes
// LLaMA-2: merges follow the merged token's score, unknown characters fall back to bytes.
TEST(tokenizer, gguf_sentencepiece_by_score) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<std::int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
    scores.push_back(0);
  }
  for (const auto& [piece, score] : std::vector<std::pair<std::string, float>>{
           {"\xE2\x96\x81", -1}, {"h", -2}, {"e", -3}, {"l", -4}, {"o", -5}, {"\xE2\x96\x81h", -10}, {"ll", -6},
           {"he", -20}, {"\xE2\x96\x81he", -7}, {"llo", -8}, {"\xE2\x96\x81hello", -9}}) {
    tokens.push_back(piece);
    types.push_back(1);
    scores.push_back(score);
  }
  testing::gguf_writer w;
  w.header(0, 6).kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", tokens)
      .kv_i32s("tokenizer.ggml.token_type", types).kv_f32s("tokenizer.ggml.scores", scores)
      .kv_u32("tokenizer.ggml.bos_token_id", 1).kv_u32("tokenizer.ggml.unknown_token_id", 0);
  const auto tok = tokenizer::from_gguf(gguf_file::parse(w.bytes, "spm.gguf"));
  EXPECT_TRUE(tok.add_bos());
  const auto id = [&](std::string_view text) { return tok.find(text); };
  // "▁hello": ll (-6) first, then ▁h? no: ▁he is not reachable before ▁h (-10) and he (-20);
  // llo (-8) next, then ▁h (-10), then ▁he (needs ▁h + e: -7), then ▁hello (▁he + llo: -9).
  EXPECT_EQ(tok.encode("hello"), std::vector<token_id>{id("\xE2\x96\x81hello")});
  // "é" is not in the vocabulary: its two UTF-8 bytes become byte tokens.
  EXPECT_EQ(tok.encode("h\xC3\xA9"), (std::vector<token_id>{id("\xE2\x96\x81h"), id("<0xC3>"), id("<0xA9>")}));
  EXPECT_EQ(tok.decode(tok.encode("h\xC3\xA9 hello")), "h\xC3\xA9 hello");
  EXPECT_EQ(tok.encode("<s>hello"), (std::vector<token_id>{1, id("\xE2\x96\x81hello")}));
}

}  // namespace
}  // namespace pagedkv::llama

namespace pagedkv::llama {
namespace {

// The same SentencePiece vocabulary as tiny_spm.tokenizer.json, written as llama.cpp writes LLaMA-2
// to GGUF: no merges, token scores that fall with merge order (tools/make_fuzz_seeds.py). Merging by
// score must give Hugging Face's merge-rank ids.
TEST(tokenizer, gguf_sentencepiece_scores_match_hf_merges) {
  const auto file = gguf_file::open(std::string(PAGEDKV_GOLDEN_DIR) + "/../../fuzz/corpus/gguf/tiny_sentencepiece.gguf");
  const auto tok = tokenizer::from_gguf(file);
  EXPECT_TRUE(tok.spec().merges.empty());
  const auto cases = testing::tokenizer_golden().at("tiny_spm").size();
  EXPECT_EQ(testing::expect_golden_ids(tok, "tiny_spm"), static_cast<int>(cases));
}

}  // namespace
}  // namespace pagedkv::llama

namespace pagedkv::llama {
namespace {

// tiny_spm with the newer SentencePiece pipeline: no normalizer, a Metaspace pre-tokenizer that
// prefixes "▁" only at the start of the input and only when no space is there already.
TEST(tokenizer, metaspace_prepend_first_matches_hf) {
  std::ifstream in(std::string(PAGEDKV_GOLDEN_DIR) + "/tiny_spm.tokenizer.json");
  auto json = nlohmann::json::parse(in);
  json["normalizer"] = nullptr;
  json["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
  const auto tok = tokenizer::from_tokenizer_json(json.dump(), "tiny_spm_metaspace.json");
  EXPECT_EQ(tok.spec().spm_prefix, space_prefix::metaspace_first);
  const auto cases = testing::tokenizer_golden().at("tiny_spm_metaspace").size();
  EXPECT_EQ(testing::expect_golden_ids(tok, "tiny_spm_metaspace"), static_cast<int>(cases));
}

}  // namespace
}  // namespace pagedkv::llama

namespace pagedkv::llama {
namespace {

// Streaming the ids of text with multi-byte characters split across tokens: every piece is whole
// UTF-8 and the pieces add up to decode().
TEST(tokenizer, stream_decoder_holds_back_partial_characters) {
  const auto tok = tokenizer::from_tokenizer_json_file(std::string(PAGEDKV_GOLDEN_DIR) + "/tiny_bpe.tokenizer.json");
  const std::string text = "emoji \xF0\x9F\x99\x82\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE4\xBD\xA0\xE5\xA5\xBD caf\xC3\xA9 \xF0\x9F\xA4\x97!";
  const auto ids = tok.encode(text);
  stream_decoder stream(tok);
  std::string joined;
  int split_characters = 0;
  for (const auto id : ids) {
    const auto piece = stream.push(id);
    for (std::size_t pos = 0; pos < piece.size();) {
      const auto c = decode_utf8(piece, pos);
      EXPECT_TRUE(c.valid) << "piece " << nlohmann::json(piece).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      pos += c.length;
    }
    split_characters += tok.token_to_piece(id) != piece;
    joined += piece;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, text);
  EXPECT_GT(split_characters, 0);  // the test really exercised held-back bytes

  stream_decoder cut(tok);
  const auto first_byte = tok.find(std::string(byte_to_unicode(0xF0)));
  ASSERT_GE(first_byte, 0);
  EXPECT_EQ(cut.push(first_byte), "");
  EXPECT_EQ(cut.finish(), "\xF0");  // an unfinished character comes out at the end as it is
}

}  // namespace
}  // namespace pagedkv::llama
