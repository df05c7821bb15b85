// What the host benchmarks share: bench_core.cpp, and hot_paths/hot_paths.cpp, which compare.sh
// also compiles against another revision's include/ with `pagedkv` renamed by a macro. So this
// header lives under bench/ and uses only the prefix cache's calls both revisions have.
#pragma once

#include <pagedkv/prefix_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace pagedkv::bench {

/// `n` tokens drawn uniformly from a 49,152-token vocabulary, the same for the same seed.
inline std::vector<token_id> random_tokens(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<token_id> dist(0, 49151);
  std::vector<token_id> tokens(n);
  for (token_id& t : tokens) t = dist(rng);
  return tokens;
}

/// A prefix cache holding `num_chains` chains of `chain_blocks` blocks of 16 tokens, chain c the
/// random prompt of seed `first_seed + c`, with each prompt's block hashes: a lookup benchmark
/// walks one whole chain.
struct cached_chains {
  static constexpr std::int32_t block_size = 16;
  static constexpr std::int32_t chain_blocks = 128;

  prefix_cache<> cache;
  std::vector<std::vector<token_id>> prompts;
  std::vector<std::vector<block_hash>> hashes;

  cached_chains(std::int32_t num_chains, unsigned first_seed)
      : cache(num_chains * chain_blocks, block_size), hashes(static_cast<std::size_t>(num_chains)) {
    block_id next = 0;
    for (std::int32_t c = 0; c < num_chains; ++c) {
      prompts.push_back(random_tokens(chain_blocks * block_size, first_seed + static_cast<unsigned>(c)));
      cache.extend_hashes(prompts.back(), {}, hashes[static_cast<std::size_t>(c)]);
      chain_link parent{};
      for (std::int32_t b = 0; b < chain_blocks; ++b) {
        parent = *cache.insert(next++, hashes[static_cast<std::size_t>(c)][static_cast<std::size_t>(b)], parent,
                               std::span(prompts.back()).subspan(static_cast<std::size_t>(b * block_size), block_size),
                               {});
      }
    }
  }
};

}  // namespace pagedkv::bench
