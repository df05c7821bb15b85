// What pagedkv-llama checks before it loads the weights or runs a request, so that bad input ends
// in a message naming the problem rather than a long run, a crash or a silent wrong answer: option
// values, the prompts and where each came from, the cache against the machine's memory.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pagedkv::llama::cli {

/// The process's exit status: what a script calling pagedkv-llama can tell apart.
enum class exit_status : int {
  success = 0,
  failure = 1,   ///< a file could not be loaded, or the run failed
  bad_usage = 2, ///< the command line or a prompt was refused before anything ran
  rejected = 3,  ///< a request cannot fit in the KV cache; whatever it generated was printed
};

/// A refusal or failure that ends the run with its exit status; what() names the problem.
class error : public std::runtime_error {
 public:
  error(exit_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  [[nodiscard]] exit_status status() const noexcept { return status_; }

 private:
  exit_status status_;
};

/// One end of an interval, included or not.
struct bound {
  double value;
  bool included = true;
};

/// A CLI11 check that an option's value is a number in the interval [min, max] (or open at an end).
/// The message names the value and the interval as written, "0 is not in (0, 1]", where CLI11's
/// Range prints an unbounded side as 309 digits; NaN, which passes CLI11's Range, and text that is
/// not a number are refused too. CLI11 puts the option's name in front.
CLI::Validator number_in(bound min, bound max);

/// One prompt and where it came from, for messages: "--prompt" or "prompts.txt:3".
struct prompt_input {
  std::string text;
  std::string source;
};

/// The non-empty lines of a prompts file, each with its line number. Throws std::runtime_error
/// naming the file when it cannot be read or holds no prompt.
std::vector<prompt_input> read_prompts_file(const std::string& path);

/// Bytes of memory the machine can give now: /proc/meminfo's MemAvailable, else the physical
/// memory (sysconf); nullopt when neither is known.
std::optional<std::uint64_t> available_memory_bytes();

}  // namespace pagedkv::llama::cli
