#include "pretokenize.hpp"

#include "unicode.hpp"

namespace pagedkv::llama {
namespace {

enum class char_class { letter, number, space, other };

struct decoded {
  std::size_t offset;
  char32_t code_point;
  char_class kind;
};

std::vector<decoded> decode_all(std::string_view text) {
  std::vector<decoded> chars;
  for (std::size_t pos = 0; pos < text.size();) {
    const auto c = decode_utf8(text, pos);
    char_class kind = char_class::other;
    if (c.valid) {
      if (is_letter(c.code_point)) kind = char_class::letter;
      else if (is_number(c.code_point)) kind = char_class::number;
      else if (is_whitespace(c.code_point)) kind = char_class::space;
    }
    chars.push_back({pos, c.valid ? c.code_point : 0xFFFD, kind});
    pos += c.length;
  }
  return chars;
}

// Length in characters of the contraction ('s 't 'm 'd 're 've 'll) starting at i, or 0.
std::size_t contraction_at(const std::vector<decoded>& chars, std::size_t i) {
  if (chars[i].code_point != U'\'' || i + 1 >= chars.size()) return 0;
  const char32_t a = chars[i + 1].code_point;
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= chars.size()) return 0;
  const char32_t b = chars[i + 2].code_point;
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

}  // namespace

std::vector<std::string_view> split_gpt2(std::string_view text) {
  const auto chars = decode_all(text);
  const std::size_t n = chars.size();
  const auto offset = [&](std::size_t i) { return i < n ? chars[i].offset : text.size(); };
  std::vector<std::string_view> pieces;
  std::size_t i = 0;
  while (i < n) {
    std::size_t end = i;  // one past the last character of the piece
    if (const auto length = contraction_at(chars, i)) {
      end = i + length;
    } else {
      // " ?X+" for X in letter, number, other: an optional literal space, then a run of X.
      const bool space_first = chars[i].code_point == U' ' && i + 1 < n && chars[i + 1].kind != char_class::space;
      const std::size_t start = space_first ? i + 1 : i;
      const char_class kind = chars[start].kind;
      if (kind != char_class::space) {
        end = start;
        while (end < n && chars[end].kind == kind) ++end;
      } else {
        // "\s+(?!\S)" then "\s+": a whitespace run, less its last character when a non-space follows
        // (that character starts the next word) unless the run is one character long.
        end = i;
        while (end < n && chars[end].kind == char_class::space) ++end;
        if (end < n && end - i > 1) --end;
      }
    }
    pieces.push_back(text.substr(offset(i), offset(end) - offset(i)));
    i = end;
  }
  return pieces;
}

std::vector<std::string_view> split_digits(std::string_view text) {
  std::vector<std::string_view> pieces;
  std::size_t start = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const auto c = decode_utf8(text, pos);
    if (c.valid && is_number(c.code_point)) {
      if (pos > start) pieces.push_back(text.substr(start, pos - start));
      pieces.push_back(text.substr(pos, c.length));
      start = pos + c.length;
    }
    pos += c.length;
  }
  if (start < text.size()) pieces.push_back(text.substr(start));
  return pieces;
}

}  // namespace pagedkv::llama
