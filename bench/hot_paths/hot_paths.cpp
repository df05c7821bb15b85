// The manager's hot paths for a full-attention-only model (issue 22's target: no more than 10%
// slower than before its features), compiled twice into one binary by compare.sh: once against
// this tree's headers and once against another revision's, its namespace renamed by the macro
// PAGEDKV_HOT_PATHS_NS so that both coexist. Names start with PAGEDKV_HOT_PATHS_VARIANT.
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/prefix_cache.hpp>

#include "../cached_chains.hpp"

#include <benchmark/benchmark.h>

#include <span>
#include <string>
#include <vector>

namespace {

using namespace PAGEDKV_HOT_PATHS_NS;

using bench::random_tokens;

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
  constexpr std::int32_t num_chains = 64;
  bench::cached_chains chains(num_chains, 200);
  std::vector<chain_link> links;
  links.reserve(bench::cached_chains::chain_blocks);
  std::size_t c = 0;
  for (auto _ : state) {
    links.clear();
    benchmark::DoNotOptimize(
        chains.cache.match(chains.prompts[c], {}, chains.hashes[c], bench::cached_chains::chain_blocks, links));
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
