// Sizes in bytes as people write them on a command line: "512MiB", "2GiB", "1000000".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pagedkv::llama {

/// Parses a whole number of units: digits, optional spaces, an optional unit. Units are B, kB, MB,
/// GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024), in any case ("512mib").
/// Throws std::invalid_argument whose message quotes the text: empty, not a whole number (signs,
/// fractions), an unknown unit, zero, or more than 2^64 - 1 bytes.
std::uint64_t parse_byte_size(std::string_view text);

/// "720.0 MiB", "1.5 GiB", "512 B": binary units, one decimal, for summaries.
std::string format_byte_size(std::uint64_t bytes);

}  // namespace pagedkv::llama
