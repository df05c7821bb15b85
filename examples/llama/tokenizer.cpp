#include "tokenizer.hpp"

#include <algorithm>
#include <limits>
#include <queue>
#include <stdexcept>
#include <utility>

#include "load_error.hpp"
#include "pretokenize.hpp"
#include "unicode.hpp"

namespace pagedkv::llama {
namespace {

constexpr std::string_view spm_space = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space

std::uint64_t pair_key(token_id left, token_id right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a SentencePiece byte token "<0xXX>", or -1.
int byte_token_value(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int high = hex_digit(text[3]);
  const int low = hex_digit(text[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

}  // namespace

tokenizer::tokenizer(tokenizer_spec spec, std::string source) : spec_(std::move(spec)), source_(std::move(source)) {
  const auto vocab_size = spec_.tokens.size();
  if (vocab_size == 0) fail_in(source_, "tokens", "the vocabulary is empty");
  if (vocab_size > (std::size_t{1} << 24)) fail_in(source_, "tokens", "a vocabulary of ", vocab_size, " tokens is implausibly large");
  if (spec_.kinds.empty()) spec_.kinds.assign(vocab_size, token_kind::normal);
  if (spec_.kinds.size() != vocab_size)
    fail_in(source_, "token_type", spec_.kinds.size(), " token types for ", vocab_size, " tokens");
  if (!spec_.scores.empty() && spec_.scores.size() != vocab_size)
    fail_in(source_, "scores", spec_.scores.size(), " scores for ", vocab_size, " tokens");
  for (const auto& [name, id] : {std::pair{"bos_token_id", spec_.bos_id}, std::pair{"eos_token_id", spec_.eos_id},
                                std::pair{"unknown_token_id", spec_.unknown_id}, std::pair{"padding_token_id", spec_.padding_id}})
    if (id < -1 || id >= static_cast<token_id>(vocab_size))
      fail_in(source_, name, "token id ", id, " is outside the vocabulary of ", vocab_size);

  // A NaN score would break the heap's ordering; it ranks below every real score instead.
  for (auto& score : spec_.scores)
    if (score != score) score = -std::numeric_limits<float>::infinity();
  ids_.reserve(vocab_size);
  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
  for (std::size_t i = 0; i < vocab_size; ++i) {
    const auto id = static_cast<token_id>(i);
    // Duplicate texts happen in real vocabularies (unused slots); the first id wins, as in HF.
    ids_.emplace(spec_.tokens[i], id);
    const auto kind = spec_.kinds[i];
    if ((kind == token_kind::control || kind == token_kind::user_defined || kind == token_kind::unknown) && !spec_.tokens[i].empty())
      specials_.push_back(id);
    if (const int byte = byte_token_value(spec_.tokens[i]); byte >= 0 && byte_tokens_[byte] < 0) byte_tokens_[byte] = id;
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](token_id a, token_id b) { return spec_.tokens[a].size() > spec_.tokens[b].size(); });

  merges_.reserve(spec_.merges.size());
  for (std::size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    const auto& [left, right] = spec_.merges[rank];
    const auto left_id = find(left);
    const auto right_id = find(right);
    const auto merged_id = find(left + right);
    if (left_id < 0 || right_id < 0 || merged_id < 0)
      fail_in(source_, "merges[" + std::to_string(rank) + "]", "merge '", left, "' + '", right, "' uses or makes a token outside the vocabulary");
    merges_.emplace(pair_key(left_id, right_id), merge_result{static_cast<std::int32_t>(rank), merged_id});  // the first rank wins
  }
  if (spec_.model == tokenizer_model::sentencepiece_bpe && spec_.merges.empty() && spec_.scores.empty())
    fail_in(source_, "scores", "SentencePiece BPE needs merges or token scores");
}

token_id tokenizer::find(std::string_view token_text) const {
  const auto it = ids_.find(token_text);
  return it == ids_.end() ? -1 : it->second;
}

void tokenizer::check_id(token_id id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= spec_.tokens.size())
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(spec_.tokens.size()));
}

const std::string& tokenizer::token_text(token_id id) const {
  check_id(id);
  return spec_.tokens[id];
}

bool tokenizer::is_special(token_id id) const {
  check_id(id);
  const auto kind = spec_.kinds[id];
  return kind == token_kind::control || kind == token_kind::user_defined || kind == token_kind::unknown;
}

std::vector<token_id> tokenizer::encode(std::string_view text, special_tokens specials) const {
  std::vector<token_id> out;
  std::size_t segment_start = 0;
  if (specials == special_tokens::parse && !specials_.empty()) {
    for (std::size_t pos = 0; pos < text.size();) {
      // Leftmost-longest: specials_ is sorted longest first, so the first that matches here wins.
      const auto match = std::find_if(specials_.begin(), specials_.end(),
                                      [&](token_id id) { return text.substr(pos).starts_with(spec_.tokens[id]); });
      if (match == specials_.end()) {
        ++pos;
        continue;
      }
      encode_text(text.substr(segment_start, pos - segment_start), segment_start == 0, out);
      out.push_back(*match);
      pos += spec_.tokens[*match].size();
      segment_start = pos;
    }
  }
  encode_text(text.substr(segment_start), segment_start == 0, out);
  return out;
}

void tokenizer::encode_text(std::string_view text, bool at_start, std::vector<token_id>& out) const {
  if (text.empty()) return;
  if (spec_.model == tokenizer_model::sentencepiece_bpe) {
    std::string word;
    const bool starts_with_space = text[0] == ' ' || text.starts_with(spm_space);
    if (spec_.spm_prefix == space_prefix::always || (spec_.spm_prefix == space_prefix::metaspace_always && !starts_with_space) ||
        (spec_.spm_prefix == space_prefix::metaspace_first && at_start && !starts_with_space))
      word = spm_space;
    for (char c : text) {
      if (c == ' ') word += spm_space;
      else word += c;
    }
    encode_word(word, out);
    return;
  }
  std::string prefixed;
  if (spec_.add_prefix_space && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  std::string mapped;
  const auto encode_piece = [&](std::string_view piece) {
    for (const auto& word : split_gpt2(piece)) {
      mapped.clear();
      for (char c : word) mapped += byte_to_unicode(static_cast<std::uint8_t>(c));
      encode_word(mapped, out);
    }
  };
  if (spec_.pre == pre_tokenizer::gpt2_digits) {
    for (const auto& piece : split_digits(text)) encode_piece(piece);
  } else {
    encode_piece(text);
  }
}

// BPE inside one word: start from its characters and repeatedly merge the adjacent pair with the
// best priority (the lowest merge rank, or the highest score of the merged token), leftmost first
// among equals, until no pair can merge. A linked list of symbols and a heap of candidate pairs
// make it O(n log n) in the word's length.
void tokenizer::encode_word(std::string_view word, std::vector<token_id>& out) const {
  struct symbol {
    std::size_t start;
    std::size_t length;
    token_id id;
    int prev;
    int next;
  };
  std::vector<symbol> symbols;
  const bool spm = spec_.model == tokenizer_model::sentencepiece_bpe;
  for (std::size_t pos = 0; pos < word.size();) {
    const auto c = decode_utf8(word, pos);
    const auto id = find(word.substr(pos, c.length));
    if (id < 0 && spm && spec_.byte_fallback) {
      // Characters outside the vocabulary become byte tokens before merging, as HF's byte_fallback does.
      for (std::size_t b = 0; b < c.length; ++b) {
        const auto byte_id = byte_tokens_[static_cast<std::uint8_t>(word[pos + b])];
        symbols.push_back({pos + b, 1, byte_id, 0, 0});  // -1 (no byte token): unknown, below
      }
    } else {
      symbols.push_back({pos, c.length, id, 0, 0});
    }
    pos += c.length;
  }
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    symbols[i].prev = static_cast<int>(i) - 1;
    symbols[i].next = i + 1 < symbols.size() ? static_cast<int>(i + 1) : -1;
  }

  struct candidate {
    double priority;  // lower merges first
    int left;
    int right;
    token_id merged;
    std::size_t length;  // of the merged text, to detect stale entries
    bool operator>(const candidate& other) const {
      return priority != other.priority ? priority > other.priority : left > other.left;
    }
  };
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> queue;
  const auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const auto& a = symbols[left];
    const auto& b = symbols[right];
    if (spec_.merges.empty()) {
      if (spec_.scores.empty()) return;  // no merges at all: every character stays a token
      const auto merged = find(word.substr(a.start, a.length + b.length));
      if (merged >= 0) queue.push({-static_cast<double>(spec_.scores[merged]), left, right, merged, a.length + b.length});
    } else if (a.id >= 0 && b.id >= 0) {
      if (const auto it = merges_.find(pair_key(a.id, b.id)); it != merges_.end())
        queue.push({static_cast<double>(it->second.rank), left, right, it->second.merged, a.length + b.length});
    }
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) consider(static_cast<int>(i), static_cast<int>(i + 1));

  while (!queue.empty()) {
    const auto top = queue.top();
    queue.pop();
    auto& left = symbols[top.left];
    // Skip pairs that an earlier merge changed: the right symbol was absorbed, or either grew.
    if (left.length == 0 || left.next != top.right || symbols[top.right].length == 0 ||
        left.length + symbols[top.right].length != top.length)
      continue;
    auto& right = symbols[top.right];
    left.length += right.length;
    left.id = top.merged;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.length = 0;
    consider(left.prev, top.left);
    consider(top.left, left.next);
  }

  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const auto& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
    } else if (spm && spec_.byte_fallback) {
      for (std::size_t b = 0; b < s.length; ++b) {
        const auto byte_id = byte_tokens_[static_cast<std::uint8_t>(word[s.start + b])];
        if (byte_id >= 0) out.push_back(byte_id);
        else if (spec_.unknown_id >= 0 && spec_.encode_unknown) out.push_back(spec_.unknown_id);
      }
    } else if (spec_.unknown_id >= 0 && spec_.encode_unknown) {
      out.push_back(spec_.unknown_id);
    }
  }
}

std::string tokenizer::token_to_piece(token_id id) const {
  check_id(id);
  const auto& text = spec_.tokens[id];
  const auto kind = spec_.kinds[id];
  if (kind == token_kind::control || kind == token_kind::user_defined || kind == token_kind::unknown) return text;
  std::string piece;
  if (spec_.model == tokenizer_model::sentencepiece_bpe) {
    if (const int byte = byte_token_value(text); byte >= 0) return std::string(1, static_cast<char>(byte));
    for (std::size_t pos = 0; pos < text.size();) {
      if (text.compare(pos, spm_space.size(), spm_space) == 0) {
        piece += ' ';
        pos += spm_space.size();
      } else {
        piece += text[pos++];
      }
    }
    return piece;
  }
  for (std::size_t pos = 0; pos < text.size();) {
    const auto c = decode_utf8(text, pos);
    const int byte = c.valid ? unicode_to_byte(c.code_point) : -1;
    if (byte >= 0) piece += static_cast<char>(byte);
    else piece.append(text, pos, c.length);  // not in GPT-2's alphabet: keep as written
    pos += c.length;
  }
  return piece;
}

std::string tokenizer::decode(std::span<const token_id> ids) const {
  std::string text;
  for (const auto id : ids) text += token_to_piece(id);
  // SentencePiece's decoder drops the one space that the "▁" prefix stands for.
  if (spec_.model == tokenizer_model::sentencepiece_bpe && spec_.spm_prefix != space_prefix::none && text.starts_with(' '))
    text.erase(0, 1);
  return text;
}

std::string stream_decoder::push(token_id id) {
  pending_ += tokenizer_->token_to_piece(id);
  // Find where an unfinished character starts: a lead byte in the last three bytes whose sequence
  // runs past the end. Anything else, valid or not, is passed on now.
  std::size_t complete = pending_.size();
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, pending_.size()); ++back) {
    const auto byte = static_cast<std::uint8_t>(pending_[pending_.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    const std::size_t length = byte >= 0xF0 && byte <= 0xF4 ? 4 : byte >= 0xE0 && byte < 0xF0 ? 3 : byte >= 0xC2 && byte < 0xE0 ? 2 : 1;
    if (length > back) complete = pending_.size() - back;
    break;
  }
  std::string ready = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return ready;
}

std::string stream_decoder::finish() { return std::exchange(pending_, std::string()); }

std::string format_chatml(std::span<const chat_message> messages, bool add_generation_prompt, std::string_view default_system_prompt) {
  std::string text;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system" && !default_system_prompt.empty())
      ((text += "<|im_start|>system\n") += default_system_prompt) += "<|im_end|>\n";
    ((((text += "<|im_start|>") += messages[i].role) += "\n") += messages[i].content) += "<|im_end|>\n";
  }
  if (add_generation_prompt) text += "<|im_start|>assistant\n";
  return text;
}

}  // namespace pagedkv::llama
