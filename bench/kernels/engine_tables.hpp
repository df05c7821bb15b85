// Block tables as an engine builds them, for bench_decode's paging rows: host code only.
#pragma once

#include <pagedkv/kv_cache_manager.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

/// `count` block tables of ctx tokens each (row-major, a row per sequence) as a kv_cache_manager
/// with free list FreeList builds them on a pool of `capacity` blocks that earlier traffic
/// scattered: four rounds of admitting sequences of random length (1 to ctx tokens) until a tenth
/// of the pool is left and finishing a random half of them; then the rest finish but for
/// sequences holding what the `count` leave of the pool (others still running); then the `count`
/// sequences arrive with a quarter of ctx as the prompt and grow a token at a time in turn, as
/// decode steps grow a batch. Prefix caching off. extent_blocks: kv_cache_options'.
template <class FreeList>
std::vector<pagedkv::block_id> engine_tables(int count, int ctx, int block_size, std::int32_t capacity,
                                             std::int32_t extent_blocks) {
  pagedkv::kv_cache_manager<FreeList> m(pagedkv::kv_cache_options{.block_size = block_size,
                                                                  .num_device_blocks = capacity,
                                                                  .enable_prefix_caching = false,
                                                                  .extent_blocks = extent_blocks});
  std::mt19937_64 rng(11);
  std::vector<pagedkv::token_id> tokens(std::size_t(ctx), 1);
  const auto prompt = [&](int n) { return std::span<const pagedkv::token_id>(tokens.data(), std::size_t(n)); };
  std::vector<pagedkv::seq_id> others;
  pagedkv::seq_id next = std::uint64_t(count);
  for (int round = 0; round < 4; ++round) {
    for (;;) {
      const int len = std::uniform_int_distribution<int>(1, ctx)(rng);
      if (m.num_free_blocks() - (len + block_size - 1) / block_size < capacity / 10) break;
      m.allocate(next, prompt(len));
      others.push_back(next++);
    }
    std::shuffle(others.begin(), others.end(), rng);
    for (std::size_t i = 0; i < others.size() / 2; ++i) m.free(others[i]);
    others.erase(others.begin(), others.begin() + std::ptrdiff_t(others.size() / 2));
  }
  const std::int32_t needed = count * ((ctx + block_size - 1) / block_size);
  while (!others.empty() && capacity - m.num_free_blocks() > capacity - needed) {
    m.free(others.back());
    others.pop_back();
  }
  const int first = std::max(1, ctx / 4);
  for (int i = 0; i < count; ++i) m.allocate(pagedkv::seq_id(i), prompt(first));
  pagedkv::slot_id slot = 0;
  for (int t = first; t < ctx; ++t)
    for (int i = 0; i < count; ++i) m.append(pagedkv::seq_id(i), prompt(1), std::span(&slot, 1));
  std::vector<pagedkv::block_id> ids;
  for (int i = 0; i < count; ++i) {
    const auto blocks = m.table(pagedkv::seq_id(i)).blocks();
    ids.insert(ids.end(), blocks.begin(), blocks.end());
  }
  return ids;
}
