#include "unicode.hpp"

#include <algorithm>
#include <array>
#include <iterator>

namespace pagedkv::llama {
namespace {

struct code_point_range {
  char32_t first;
  char32_t last;
};

#include "unicode_tables.inc"

template <std::size_t N>
bool in_ranges(const code_point_range (&ranges)[N], char32_t code_point) noexcept {
  const auto it = std::upper_bound(std::begin(ranges), std::end(ranges), code_point,
                                   [](char32_t cp, const code_point_range& r) { return cp < r.first; });
  return it != std::begin(ranges) && code_point <= std::prev(it)->last;
}

bool is_printable_latin1(int byte) { return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF); }

struct byte_alphabet {
  std::array<std::string, 256> to_unicode;
  std::array<std::int16_t, 512> to_byte{};  // every mapped character is below U+0144
  byte_alphabet() {
    to_byte.fill(-1);
    int next = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const char32_t code_point = is_printable_latin1(byte) ? static_cast<char32_t>(byte) : static_cast<char32_t>(next++);
      append_utf8(to_unicode[byte], code_point);
      to_byte[code_point] = static_cast<std::int16_t>(byte);
    }
  }
};

const byte_alphabet& alphabet() {
  static const byte_alphabet table;
  return table;
}

}  // namespace

utf8_char decode_utf8(std::string_view text, std::size_t pos) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(text[pos + i]); };
  const std::uint8_t lead = byte(0);
  const utf8_char invalid{lead, 1, false};
  if (lead < 0x80) return {lead, 1, true};
  std::size_t length;
  char32_t code_point;
  char32_t minimum;
  if ((lead & 0xE0) == 0xC0) { length = 2; code_point = lead & 0x1F; minimum = 0x80; }
  else if ((lead & 0xF0) == 0xE0) { length = 3; code_point = lead & 0x0F; minimum = 0x800; }
  else if ((lead & 0xF8) == 0xF0) { length = 4; code_point = lead & 0x07; minimum = 0x10000; }
  else return invalid;
  if (pos + length > text.size()) return invalid;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return invalid;
    code_point = (code_point << 6) | (byte(i) & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not characters.
  if (code_point < minimum || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return invalid;
  return {code_point, length, true};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_letter(char32_t code_point) noexcept {
  if (code_point < 0x80) return (code_point | 0x20) >= 'a' && (code_point | 0x20) <= 'z';
  return in_ranges(letter_ranges, code_point);
}

bool is_number(char32_t code_point) noexcept {
  if (code_point < 0x80) return code_point >= '0' && code_point <= '9';
  return in_ranges(number_ranges, code_point);
}

bool is_whitespace(char32_t cp) noexcept {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string_view byte_to_unicode(std::uint8_t byte) noexcept { return alphabet().to_unicode[byte]; }

int unicode_to_byte(char32_t code_point) noexcept {
  return code_point < alphabet().to_byte.size() ? alphabet().to_byte[code_point] : -1;
}

}  // namespace pagedkv::llama
