// Helpers shared by the core tests.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <vector>

namespace pagedkv::test {

/// n consecutive token ids starting at `first`: prompts that differ by `first` share no block.
inline std::vector<token_id> iota_tokens(std::size_t n, token_id first = 0) {
  std::vector<token_id> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

/// What the stateful tests write into a simulated KV slot: the token and its position, so that a
/// read through a block table proves it reached exactly the right slot.
struct stamp {
  token_id token = -1;
  std::int32_t position = -1;
  friend bool operator==(const stamp&, const stamp&) = default;
};

/// Copies one block of a simulated KV array, as the copy and swap kernels do.
inline void copy_block(const std::vector<stamp>& from, block_id src, std::vector<stamp>& to, block_id dst,
                       std::int32_t block_size) {
  const auto n = static_cast<std::ptrdiff_t>(block_size);
  std::copy_n(from.begin() + src * n, n, to.begin() + dst * n);
}

/// The error code a call throws, or nothing if it returns.
template <class F>
std::optional<errc> error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.code();
  }
  return std::nullopt;
}

}  // namespace pagedkv::test
