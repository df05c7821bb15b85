// Errors are part of pagedkv's API: every misuse raises pagedkv::error, whose code() says what kind
// of problem it was and whose what() names the offending value. A call that throws leaves the
// object it was called on unchanged.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace pagedkv {

enum class errc {
  out_of_blocks,       ///< not enough free blocks for an all-or-nothing request
  invalid_argument,    ///< zero, negative or absurd sizes, spans of the wrong length
  invalid_block,       ///< a block id outside [0, capacity)
  no_references,       ///< release of a block that holds no references (a double free)
  unknown_sequence,    ///< a sequence id the manager does not know
  duplicate_sequence,  ///< allocate or fork onto a sequence id that is already live
  wrong_location,      ///< an operation on a swapped-out sequence that needs it on the device, or vice versa
  buffer_too_small,    ///< a caller-provided output buffer cannot hold the result
  pin_budget_exceeded, ///< a pin beyond pin_budget_eviction's budget
};

constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::out_of_blocks: return "out_of_blocks";
    case errc::invalid_argument: return "invalid_argument";
    case errc::invalid_block: return "invalid_block";
    case errc::no_references: return "no_references";
    case errc::unknown_sequence: return "unknown_sequence";
    case errc::duplicate_sequence: return "duplicate_sequence";
    case errc::wrong_location: return "wrong_location";
    case errc::buffer_too_small: return "buffer_too_small";
    case errc::pin_budget_exceeded: return "pin_budget_exceeded";
  }
  return "unknown";
}

/// The one exception type pagedkv throws. Catch it whole, or branch on code().
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& message)
      : std::runtime_error("pagedkv: " + message), code_(code) {}
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

namespace detail {

/// Throws error(code, message) with the message made of the arguments streamed in order, e.g.
/// fail(errc::invalid_block, "release of block ", id, ": capacity is ", n).
template <class... Parts>
[[noreturn]] void fail(errc code, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw error(code, message.str());
}

}  // namespace detail
}  // namespace pagedkv
