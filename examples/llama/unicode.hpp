// The little Unicode the tokenizers need: UTF-8 decoding that survives invalid bytes, the general
// categories L and N and the White_Space property (what \p{L}, \p{N} and \s mean in the GPT-2
// pre-tokenizer regex), and GPT-2's byte <-> printable-character mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagedkv::llama {

/// One decoded character. An invalid or truncated UTF-8 sequence decodes as a single byte with
/// `valid` false, so any byte string can be walked without loss.
struct utf8_char {
  char32_t code_point = 0;
  std::size_t length = 1;  ///< bytes taken from the input, 1 to 4
  bool valid = true;
};

/// Decodes the character at `pos` (precondition: pos < text.size()).
utf8_char decode_utf8(std::string_view text, std::size_t pos) noexcept;
void append_utf8(std::string& out, char32_t code_point);

bool is_letter(char32_t code_point) noexcept;      ///< general category L*
bool is_number(char32_t code_point) noexcept;      ///< general category N*
bool is_whitespace(char32_t code_point) noexcept;  ///< the White_Space property (regex \s)

/// GPT-2's byte-level alphabet: every byte maps to a printable character (printable Latin-1 bytes to
/// themselves, the rest to U+0100 onwards), so that BPE works on text without spaces or controls.
std::string_view byte_to_unicode(std::uint8_t byte) noexcept;  ///< the UTF-8 of the mapped character
/// The byte a byte-level character stands for, or -1 when the character is not in the alphabet.
int unicode_to_byte(char32_t code_point) noexcept;

}  // namespace pagedkv::llama
