#include "cli_checks.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pagedkv::llama::cli {
namespace {

/// A whole number as digits, anything else as the shortest text that reads back the same.
std::string format_number(double value) {
  std::ostringstream out;
  if (std::isfinite(value) && value == std::trunc(value) && std::abs(value) < 0x1p53) out << std::int64_t(value);
  else out << value;
  return out.str();
}

std::string format_interval(bound min, bound max) {
  return (min.included ? "[" : "(") + format_number(min.value) + ", " + format_number(max.value) +
         (max.included ? "]" : ")");
}

}  // namespace

CLI::Validator number_in(bound min, bound max) {
  const std::string interval = format_interval(min, max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0.0;
        const char* end = text.data() + text.size();
        const auto [last, error] = std::from_chars(text.data(), end, value);
        if (error != std::errc() || last != end) return "'" + text + "' is not a number";
        if (std::isnan(value)) return "'" + text + "' is not a number in " + interval;
        const bool above = min.included ? value >= min.value : value > min.value;
        const bool below = max.included ? value <= max.value : value < max.value;
        if (!above || !below) return text + " is not in " + interval;
        return {};
      },
      "in " + interval);
}

std::vector<prompt_input> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the prompts file");
  std::vector<prompt_input> prompts;
  std::int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (!line.empty()) prompts.push_back({std::move(line), path + ":" + std::to_string(line_number)});
  }
  if (in.bad()) throw std::runtime_error(path + ": cannot read the prompts file");
  if (prompts.empty()) throw std::runtime_error(path + ": no prompts (one per non-empty line)");
  return prompts;
}

std::optional<std::uint64_t> available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key, unit;
    std::uint64_t kib = 0;
    if (fields >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_bytes > 0) return std::uint64_t(pages) * std::uint64_t(page_bytes);
  return std::nullopt;
}

}  // namespace pagedkv::llama::cli
