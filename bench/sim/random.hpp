// Portable random transforms over std::mt19937_64, whose output sequence the standard fixes. The
// standard's distributions are left implementation-defined, so traces drawn with them would differ
// between libstdc++ and libc++; these few lines make a seed name the same trace everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace pagedkv::sim {

/// Uniform in [0, 1) with 53 random bits.
inline double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

/// Uniform in (0, 1]: safe to take the log of.
inline double uniform01_open_low(std::mt19937_64& rng) { return 1.0 - uniform01(rng); }

/// Uniform integer in [0, bound) (bound >= 1), by rejection so that no value is favoured.
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  std::uint64_t x;
  do x = rng(); while (x >= limit);
  return x % bound;
}

/// N(0, 1) by Box-Muller (one of the pair; simplicity over speed).
inline double standard_normal(std::mt19937_64& rng) {
  double radius = std::sqrt(-2.0 * std::log(uniform01_open_low(rng)));
  return radius * std::cos(2 * 3.14159265358979323846 * uniform01(rng));
}

/// Exponential with the given rate (mean 1 / rate).
inline double exponential(std::mt19937_64& rng, double rate) {
  return -std::log(uniform01_open_low(rng)) / rate;
}

}  // namespace pagedkv::sim
