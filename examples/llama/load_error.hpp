// Errors of the runner's file readers. A model file is untrusted input: every read is bounds-checked
// and every failure names the file, the field being read and the byte offset where it went wrong,
// so that "my model does not load" comes with the place to look.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace pagedkv::llama {

/// A model, config or tokenizer file that cannot be used: what() reads
/// "<file>: <field> at byte <offset>: <problem>".
class load_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws load_error naming the file, the field and the offset, with the problem streamed in.
template <class... Parts>
[[noreturn]] void fail_at(std::string_view file, std::string_view field, std::uint64_t offset,
                          const Parts&... parts) {
  std::ostringstream message;
  message << file << ": " << field << " at byte " << offset << ": ";
  (message << ... << parts);
  throw load_error(message.str());
}

/// Throws load_error for a problem that is not at one place in the file (a missing key, a bad
/// combination of values).
template <class... Parts>
[[noreturn]] void fail_in(std::string_view file, std::string_view field, const Parts&... parts) {
  std::ostringstream message;
  message << file << ": " << field << ": ";
  (message << ... << parts);
  throw load_error(message.str());
}

}  // namespace pagedkv::llama
