// Byte-pair-encoding tokenizers of LLaMA-family models, built from GGUF metadata or from a Hugging
// Face tokenizer.json, producing the ids Hugging Face `tokenizers` produces:
//
//  - byte-level BPE (GPT-2 style; SmolLM2): text is cut into words by the GPT-2 regex (after
//    isolating digits, for SmolLM2), each word's bytes are mapped to GPT-2's printable alphabet,
//    and merges apply by rank;
//  - SentencePiece-style BPE (LLaMA-2): spaces become U+2581 "▁", a "▁" is prefixed, merges apply
//    by rank (tokenizer.json) or by the merged token's score (GGUF), and characters outside the
//    vocabulary fall back to <0xXX> byte tokens.
//
// Special tokens (control, user-defined and unknown ones) found in the text are matched first,
// leftmost-longest, unless the caller asks to treat them as plain text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv::llama {

class gguf_file;
using token_id = std::int32_t;

enum class tokenizer_model { byte_level_bpe, sentencepiece_bpe };

/// GGUF's token types (tokenizer.ggml.token_type), numbered as in the file.
enum class token_kind : std::uint8_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

/// How byte-level BPE cuts text into words.
enum class pre_tokenizer {
  gpt2,         ///< the GPT-2 regex
  gpt2_digits,  ///< every digit on its own, then the GPT-2 regex (SmolLM2, StarCoder)
};

/// When SentencePiece-style BPE puts a "▁" in front of a run of text between special tokens.
enum class space_prefix {
  none,
  always,            ///< every run, even one that starts with a space (llama.cpp; HF's Prepend normalizer)
  metaspace_always,  ///< every run that does not start with a space or "▁" (HF Metaspace, prepend_scheme "always")
  metaspace_first,   ///< only a run at the very start of the input, unless it starts with a space or "▁" ("first")
};

/// Everything a tokenizer is made from, whichever file it came from.
struct tokenizer_spec {
  tokenizer_model model = tokenizer_model::byte_level_bpe;
  std::vector<std::string> tokens;  ///< id -> text, in the model's alphabet (GPT-2 bytes or "▁")
  std::vector<token_kind> kinds;    ///< id -> kind; empty means all normal
  std::vector<float> scores;        ///< SentencePiece merge priorities (higher merges first), used when `merges` is empty
  std::vector<std::pair<std::string, std::string>> merges;  ///< BPE merges, highest priority first
  pre_tokenizer pre = pre_tokenizer::gpt2;
  bool add_prefix_space = false;    ///< byte-level: put a space before text that does not start with one
  space_prefix spm_prefix = space_prefix::always;
  bool byte_fallback = true;        ///< SentencePiece: unknown characters become <0xXX> tokens
  /// What a character outside the vocabulary (and without byte fallback) becomes: unknown_id, or
  /// nothing, as in HF's BPE without an unk_token (byte-level vocabularies; SmolLM2 lacks some
  /// control bytes).
  bool encode_unknown = true;
  token_id bos_id = -1;             ///< -1: none
  token_id eos_id = -1;
  token_id unknown_id = -1;
  token_id padding_id = -1;
  bool add_bos = false;             ///< the model expects bos_id before a prompt
};

/// Whether encode() turns the text of special tokens into their ids, or tokenizes it as text
/// (for user-supplied content that must not inject control tokens).
enum class special_tokens { parse, as_text };

class tokenizer {
 public:
  /// Checks the spec (ids in range, merges made of known tokens) and builds the lookup tables.
  /// `source` names the file in errors. Throws load_error.
  tokenizer(tokenizer_spec spec, std::string source);

  /// From tokenizer.ggml.* metadata (model "gpt2" or "llama"). Throws load_error.
  static tokenizer from_gguf(const gguf_file& file);
  /// From a Hugging Face tokenizer.json (BPE model). Throws load_error.
  static tokenizer from_tokenizer_json(std::string_view json_text, std::string_view file_name);
  static tokenizer from_tokenizer_json_file(const std::filesystem::path& path);

  /// The ids of `text`, without BOS (prepend bos_id() yourself when add_bos() says so).
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, special_tokens specials = special_tokens::parse) const;
  /// The text of `ids` as bytes (which may be partial UTF-8 at the ends). Throws std::out_of_range
  /// for an id outside the vocabulary.
  [[nodiscard]] std::string decode(std::span<const token_id> ids) const;
  /// The bytes one token stands for, for streaming: decode() is the concatenation of these, less
  /// the leading space that SentencePiece's prefix added.
  [[nodiscard]] std::string token_to_piece(token_id id) const;

  [[nodiscard]] std::size_t vocab_size() const noexcept { return spec_.tokens.size(); }
  [[nodiscard]] const std::string& token_text(token_id id) const;
  [[nodiscard]] token_id find(std::string_view token_text) const;  ///< -1 when not in the vocabulary
  [[nodiscard]] bool is_special(token_id id) const;
  [[nodiscard]] const tokenizer_spec& spec() const noexcept { return spec_; }
  [[nodiscard]] tokenizer_model model() const noexcept { return spec_.model; }
  [[nodiscard]] token_id bos_id() const noexcept { return spec_.bos_id; }
  [[nodiscard]] token_id eos_id() const noexcept { return spec_.eos_id; }
  [[nodiscard]] bool add_bos() const noexcept { return spec_.add_bos; }

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view text) const noexcept { return std::hash<std::string_view>{}(text); }
  };
  struct merge_result {
    std::int32_t rank;
    token_id merged;
  };

  void encode_text(std::string_view text, bool at_start, std::vector<token_id>& out) const;
  void encode_word(std::string_view word, std::vector<token_id>& out) const;
  void check_id(token_id id) const;

  tokenizer_spec spec_;
  std::string source_;
  std::unordered_map<std::string, token_id, string_hash, std::equal_to<>> ids_;
  std::unordered_map<std::uint64_t, merge_result> merges_;  // (left id << 32 | right id) -> rank, merged id
  std::vector<token_id> specials_;                          // matched in text, longest first
  token_id byte_tokens_[256];                               // <0xXX> ids for SentencePiece byte fallback, -1 if absent
};

/// Turns generated ids into text one token at a time, for streaming: every piece it returns ends
/// on a whole UTF-8 character, holding back the first bytes of a character whose remaining bytes
/// come in later tokens (emoji and CJK often span several byte-level tokens).
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& tok) : tokenizer_(&tok) {}
  /// Appends `id`'s bytes; returns the text that is now complete (possibly empty).
  [[nodiscard]] std::string push(token_id id);
  /// Returns the bytes still held back (an unfinished character) and empties the buffer.
  [[nodiscard]] std::string finish();

 private:
  const tokenizer* tokenizer_;
  std::string pending_;
};

/// One message of a chat.
struct chat_message {
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
};

/// SmolLM2's default system prompt, which its chat template adds when a chat has none.
inline constexpr std::string_view smollm2_default_system_prompt =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// Formats a chat in ChatML, as SmolLM2's chat template does:
///   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
/// with a system message of `default_system_prompt` first when the chat does not begin with one
/// (and the prompt is not empty).
std::string format_chatml(std::span<const chat_message> messages, bool add_generation_prompt = true,
                          std::string_view default_system_prompt = smollm2_default_system_prompt);

}  // namespace pagedkv::llama
