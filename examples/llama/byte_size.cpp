#include "byte_size.hpp"

#include <array>
#include <cctype>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace pagedkv::llama {

namespace {

struct unit {
  std::string_view name;
  std::uint64_t bytes;
};

constexpr std::uint64_t kib = 1024;
constexpr std::array<unit, 9> units{{{"b", 1},
                                     {"kb", 1000},
                                     {"mb", 1000'000},
                                     {"gb", 1000'000'000},
                                     {"tb", 1000'000'000'000},
                                     {"kib", kib},
                                     {"mib", kib * kib},
                                     {"gib", kib * kib * kib},
                                     {"tib", kib * kib * kib * kib}}};

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  return true;
}

[[noreturn]] void reject(std::string_view text, std::string_view why) {
  throw std::invalid_argument("'" + std::string(text) + "' " + std::string(why) +
                              " (a size is a whole number with an optional unit: B, kB, MB, GB, TB, KiB, MiB, "
                              "GiB, TiB; e.g. 512MiB)");
}

}  // namespace

std::uint64_t parse_byte_size(std::string_view text) {
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  std::size_t i = 0;
  std::uint64_t number = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const auto digit = std::uint64_t(text[i] - '0');
    if (number > (max - digit) / 10) reject(text, "is more than 2^64 - 1 bytes");
    number = number * 10 + digit;
  }
  if (i == 0) reject(text, "does not start with a whole number");
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string_view suffix = text.substr(i);
  std::uint64_t scale = 1;
  if (!suffix.empty()) {
    const unit* found = nullptr;
    for (const unit& u : units)
      if (equal_ignoring_case(suffix, u.name)) found = &u;
    if (!found) reject(text, "has an unknown unit");
    scale = found->bytes;
  }
  if (number == 0) reject(text, "is zero");
  if (number > max / scale) reject(text, "is more than 2^64 - 1 bytes");
  return number * scale;
}

std::string format_byte_size(std::uint64_t bytes) {
  constexpr std::array<const char*, 5> names{"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < kib) return std::to_string(bytes) + " B";
  double value = double(bytes) / double(kib);
  std::size_t n = 0;
  for (; value >= 1024.0 && n + 1 < names.size(); ++n) value /= 1024.0;
  char out[32];
  std::snprintf(out, sizeof out, "%.1f %s", value, names[n]);
  return out;
}

}  // namespace pagedkv::llama
