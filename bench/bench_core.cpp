// Host primitives: allocation, sharing, hashing, lookup and table export. Targets on the 2-core
// dev machine (issue 2): allocate+free <= 10 ns, hashing <= 1 ns/token, lookup <= 50 ns/block,
// exporting 256 sequences of 2k tokens <= 50 us. Run: build/release/bench/bench_core
#include <pagedkv/pagedkv.hpp>

#include "cached_chains.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace pagedkv {
namespace {

using bench::random_tokens;

/// Per-item time as a counter: seconds per `items` processed each iteration.
benchmark::Counter per_item(double items) {
  return benchmark::Counter(items, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

template <class Pool>
void BM_AllocateFree(benchmark::State& state) {
  Pool pool(4096);
  for (auto _ : state) {
    const block_id id = *pool.try_allocate();
    benchmark::DoNotOptimize(id);
    pool.release(id);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateFree<block_pool<lifo_free_list>>)->Name("allocate_free/lifo");
BENCHMARK(BM_AllocateFree<block_pool<fifo_free_list>>)->Name("allocate_free/fifo");
BENCHMARK(BM_AllocateFree<block_pool<lru_free_list>>)->Name("allocate_free/lru");
BENCHMARK(BM_AllocateFree<block_pool<lifo_free_list, mutex_lock>>)->Name("allocate_free/lifo_mutex");
BENCHMARK(BM_AllocateFree<block_pool<extent_free_list>>)->Name("allocate_free/extent");

/// allocate_near + release on a pool whose free blocks are scattered (a random half in use), the
/// hint rotating over 64 used blocks, as 64 sequences growing in turn ask near their last ones.
template <class Pool>
void BM_AllocateNearFree(benchmark::State& state) {
  Pool pool(4096);
  std::vector<block_id> all(4096);
  pool.allocate(all);
  std::shuffle(all.begin(), all.end(), std::mt19937(5));
  pool.release(std::span<const block_id>(all).first(2048));
  std::size_t i = 0;
  for (auto _ : state) {
    const block_id id = pool.allocate_near(all[2048 + i++ % 64]);
    benchmark::DoNotOptimize(id);
    pool.release(id);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateNearFree<block_pool<lifo_free_list>>)->Name("allocate_near_free/lifo");
BENCHMARK(BM_AllocateNearFree<block_pool<extent_free_list>>)->Name("allocate_near_free/extent");

void BM_BulkAllocate(benchmark::State& state) {
  block_pool<> pool(4096);
  std::vector<block_id> ids(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    pool.allocate(ids);
    benchmark::DoNotOptimize(ids.data());
    pool.release(ids);
  }
  state.counters["per_block"] = per_item(static_cast<double>(ids.size()));
}
BENCHMARK(BM_BulkAllocate)->Name("bulk_allocate_release")->Arg(16)->Arg(128)->ArgName("blocks");

void BM_Fork(benchmark::State& state) {
  const auto num_tokens = static_cast<std::size_t>(state.range(0));
  kv_cache_manager<> m({.block_size = 16, .num_device_blocks = 4096, .enable_prefix_caching = false});
  m.allocate(0, random_tokens(num_tokens, 1));
  for (auto _ : state) {
    m.fork(0, 1);
    m.free(1);
  }
  state.counters["per_block"] = per_item(static_cast<double>(m.table(0).num_blocks()));
}
BENCHMARK(BM_Fork)->Name("fork_free")->Arg(100)->Arg(2048)->ArgName("tokens");

void BM_CopyOnWriteAppend(benchmark::State& state) {
  kv_cache_manager<> m({.block_size = 16, .num_device_blocks = 4096, .enable_prefix_caching = false});
  m.allocate(0, random_tokens(100, 2));  // last block holds 4 of 16 tokens: shared and partial
  const token_id token = 7;
  slot_id slot = 0;
  for (auto _ : state) {
    m.fork(0, 1);
    auto copy = m.append(1, std::span(&token, 1), std::span(&slot, 1));
    benchmark::DoNotOptimize(copy);
    m.free(1);
  }
}
BENCHMARK(BM_CopyOnWriteAppend)->Name("fork_cow_append_free");

void BM_DecodeAppend(benchmark::State& state) {
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
    if (++steps == 1024) {  // keep the sequence bounded
      state.PauseTiming();
      m.free(seq);
      m.allocate(++seq, prompt);
      steps = 0;
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_DecodeAppend)->Name("decode_append_with_caching");

void BM_HashPrompt(benchmark::State& state) {
  prefix_cache<> cache(1, static_cast<std::int32_t>(state.range(0)));
  const std::vector<token_id> prompt = random_tokens(8192, 4);
  std::vector<block_hash> hashes;
  for (auto _ : state) {
    hashes.clear();
    cache.extend_hashes(prompt, {}, hashes);
    benchmark::DoNotOptimize(hashes.data());
  }
  state.counters["per_token"] = per_item(static_cast<double>(prompt.size()));
}
BENCHMARK(BM_HashPrompt)->Name("hash_prompt")->Arg(16)->Arg(256)->ArgName("block_size");

/// A cache holding `num_chains` chains of 128 blocks each; the lookup walks one whole chain.
void BM_Lookup(benchmark::State& state) {
  constexpr std::int32_t chain_blocks = bench::cached_chains::chain_blocks;
  const auto num_chains = static_cast<std::int32_t>(state.range(0));
  bench::cached_chains chains(num_chains, 100);
  std::vector<chain_link> links;
  links.reserve(chain_blocks);
  std::int32_t c = 0;
  for (auto _ : state) {
    links.clear();
    const auto& prompt = chains.prompts[static_cast<std::size_t>(c)];
    benchmark::DoNotOptimize(
        chains.cache.match(prompt, {}, chains.hashes[static_cast<std::size_t>(c)], chain_blocks, links));
    c = c + 1 == num_chains ? 0 : c + 1;
  }
  state.counters["per_block"] = per_item(chain_blocks);
}
BENCHMARK(BM_Lookup)->Name("lookup")->Arg(1)->Arg(64)->ArgName("chains");

void BM_Insert(benchmark::State& state) {
  constexpr std::int32_t block_size = 16;
  constexpr std::int32_t blocks = 1024;
  const std::vector<token_id> prompt = random_tokens(blocks * block_size, 5);
  prefix_cache<> cache(blocks, block_size);
  std::vector<block_hash> hashes;
  cache.extend_hashes(prompt, {}, hashes);
  for (auto _ : state) {
    chain_link parent{};
    for (std::int32_t b = 0; b < blocks; ++b) {
      parent = *cache.insert(b, hashes[static_cast<std::size_t>(b)], parent,
                             std::span(prompt).subspan(static_cast<std::size_t>(b * block_size), block_size), {});
    }
    state.PauseTiming();
    cache.clear();
    state.ResumeTiming();
  }
  state.counters["per_block"] = per_item(blocks);
}
BENCHMARK(BM_Insert)->Name("insert");

/// 256 sequences of 2k tokens (128 blocks of 16 each) exported for a kernel launch.
void BM_Export(benchmark::State& state) {
  constexpr std::int32_t num_seqs = 256;
  constexpr std::int32_t tokens = 2048;
  const bool csr = state.range(0) == 1;
  std::mt19937 rng(6);
  std::vector<block_id> ids(num_seqs * tokens / 16);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<block_table> tables;
  std::vector<slot_id> slots(tokens);
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    tables.emplace_back(16);
    for (std::int32_t b = 0; b < tokens / 16; ++b) tables.back().push_block(ids[static_cast<std::size_t>(s * tokens / 16 + b)]);
    tables.back().append(slots);
  }
  std::vector<const block_table*> views;
  for (const block_table& t : tables) views.push_back(&t);
  std::vector<std::int32_t> a(ids.size() + num_seqs + 1), b(ids.size()), c(num_seqs);
  for (auto _ : state) {
    if (csr) {
      export_csr(views, a, b, c);
    } else {
      export_dense(views, tokens / 16, b, c);
    }
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(ids.size() * sizeof(std::int32_t)));
}
BENCHMARK(BM_Export)->Name("export_256x2k")->Arg(0)->Arg(1)->ArgName("csr")->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
