// The manager's hot paths for a full-attention-only model (issue 22's target: no more than 10%
// slower than before its features), compiled twice into one binary by compare.sh: once against
// this tree's headers and once against another revision's, its namespace renamed by the macro
// PAGEDKV_HOT_PATHS_NS so that both coexist. Names start with PAGEDKV_HOT_PATHS_VARIANT.
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/prefix_cache.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace PAGEDKV_HOT_PATHS_NS;

std::vector<token_id> random_tokens(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<token_id> dist(0, 49151);
  std::vector<token_id> tokens(n);
  for (token_id& t : tokens) t = dist(rng);
  return tokens;
}

std::string name(const char* what) { return std::string(PAGEDKV_HOT_PATHS_VARIANT) + "/" + what; }

/// allocate + free of a 1024-token prompt whose first 1008 tokens are cached (63 block hits).
void allocate_hit(benchmark::State& state) {
  kv_cache_manager<> m({.block_size = 16, .num_device_blocks = 4096});
  const std::vector<token_id> prompt = random_tokens(1024, 1);
  m.allocate(0, prompt);
  m.mark_computed(0, 1024);
  seq_id seq = 1;
  for (auto _ : state) {
    auto a = m.allocate(seq, prompt);
    benchmark::DoNotOptimize(a.num_cached_tokens);
    m.free(seq++);
  }
}

/// allocate + free of a fresh 1024-token prompt (hashing and a miss at the first block).
void allocate_miss(benchmark::State& state) {
  kv_cache_manager<> m({.block_size = 16, .num_device_blocks = 4096});
  std::vector<std::vector<token_id>> prompts;
  for (unsigned i = 0; i < 64; ++i) prompts.push_back(random_tokens(1024, 100 + i));
  seq_id seq = 0;
  for (auto _ : state) {
    auto a = m.allocate(seq, prompts[seq % 64]);
    benchmark::DoNotOptimize(a.num_cached_tokens);
    m.free(seq++);
  }
}

/// One decode token: append + mark_computed (which publishes every 16th token's block).
void decode_append(benchmark::State& state) {
  kv_cache_manager<> m({.block_size = 16, .num_device_blocks = 1 << 16});
  const std::vector<token_id> prompt = random_tokens(64, 3);
  const token_id token = 7;
  slot_id slot = 0;
  seq_id seq = 0;
  m.allocate(seq, prompt);
  std::int32_t steps = 0;
  for (auto _ : state) {
    m.append(seq, std::span(&token, 1), std::span(&slot, 1));
    m.mark_computed(seq, m.num_tokens(seq));
    if (++steps == 1024) {
      state.PauseTiming();
      m.free(seq);
      m.allocate(++seq, prompt);
      steps = 0;
      state.ResumeTiming();
    }
  }
}

/// prefix_cache::match of a 128-block chain among 64.
void lookup(benchmark::State& state) {
  constexpr std::int32_t block_size = 16;
  constexpr std::int32_t chain_blocks = 128;
  constexpr std::int32_t num_chains = 64;
  prefix_cache<> cache(num_chains * chain_blocks, block_size);
  std::vector<std::vector<token_id>> prompts;
  std::vector<std::vector<block_hash>> hashes(num_chains);
  block_id next = 0;
  for (std::int32_t c = 0; c < num_chains; ++c) {
    prompts.push_back(random_tokens(chain_blocks * block_size, 200u + static_cast<unsigned>(c)));
    cache.extend_hashes(prompts.back(), {}, hashes[static_cast<std::size_t>(c)]);
    chain_link parent{};
    for (std::int32_t b = 0; b < chain_blocks; ++b) {
      parent = *cache.insert(next++, hashes[static_cast<std::size_t>(c)][static_cast<std::size_t>(b)], parent,
                             std::span(prompts.back()).subspan(static_cast<std::size_t>(b * block_size), block_size), {});
    }
  }
  std::vector<chain_link> links;
  links.reserve(chain_blocks);
  std::size_t c = 0;
  for (auto _ : state) {
    links.clear();
    benchmark::DoNotOptimize(cache.match(prompts[c], {}, hashes[c], chain_blocks, links));
    c = (c + 1) % num_chains;
  }
}

const bool registered = [] {
  benchmark::RegisterBenchmark(name("allocate_hit_free").c_str(), allocate_hit);
  benchmark::RegisterBenchmark(name("allocate_miss_free").c_str(), allocate_miss);
  benchmark::RegisterBenchmark(name("decode_append").c_str(), decode_append);
  benchmark::RegisterBenchmark(name("lookup_128_blocks").c_str(), lookup);
  return true;
}();

}  // namespace
