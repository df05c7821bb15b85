// file_tier (file_tier.hpp) as a prefix_store: round trips, the index across reopening, capacity,
// refused calls, and damaged files (truncated, a flipped payload or header byte, another prefix's
// file under a colliding name) read as misses, counted, never as K/V. Then the three levels
// together: a host tier over a file tier under a manager and a scheduler.
#include <pagedkv/file_tier.hpp>
#include <pagedkv/host_tier.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/scheduler.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace pagedkv {
namespace {

namespace fs = std::filesystem;

/// A fresh directory, removed with the test.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("pagedkv_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> bytes(n);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

/// The keys of a chain of `blocks` blocks of `block_size` tokens from `first`.
std::vector<store_key> chain_keys(token_id first, std::int32_t blocks, std::int32_t block_size, std::int64_t adapter = 0) {
  std::vector<token_id> tokens(static_cast<std::size_t>(blocks * block_size));
  std::iota(tokens.begin(), tokens.end(), first);
  const prefix_cache<> cache(1, block_size);
  std::vector<block_hash> hashes;
  cache.extend_hashes(tokens, {.adapter_id = adapter}, hashes);
  std::vector<store_key> keys;
  prefix_digest digest = root_digest({.adapter_id = adapter});
  for (std::int32_t i = 0; i < blocks; ++i) {
    digest = chain_digest(digest, std::span(tokens).subspan(static_cast<std::size_t>(i * block_size),
                                                            static_cast<std::size_t>(block_size)));
    keys.push_back({hashes[static_cast<std::size_t>(i)], digest});
  }
  return keys;
}

void flip_byte(const fs::path& p, std::streamoff at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  const char c = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x10));
}

bool load_ok(file_tier& tier, const store_key& key, std::vector<std::byte>& into) {
  const store_ticket ticket = tier.load(key, into);
  std::vector<store_completion> done;
  tier.poll(done);
  EXPECT_EQ(done.size(), 1U);
  EXPECT_EQ(done.front().ticket, ticket);
  return done.front().ok;
}

TEST(PrefixDigest, TellsPrefixesKeysAndFramingApart) {
  const std::vector<token_id> a{1, 2}, b{1, 3};
  EXPECT_EQ(chain_digest(root_digest({}), a), chain_digest(root_digest({}), a));
  EXPECT_NE(chain_digest(root_digest({}), a), chain_digest(root_digest({}), b));
  EXPECT_NE(chain_digest(root_digest({.adapter_id = 1}), a), chain_digest(root_digest({}), a));
  EXPECT_NE(root_digest({.cache_salt = "ab"}), root_digest({.cache_salt = "a"}));
  // Equal last blocks after different prefixes differ.
  EXPECT_NE(chain_digest(chain_digest(root_digest({}), a), a), chain_digest(chain_digest(root_digest({}), b), a));
}

TEST(FileTier, StoresLoadsAndLooksUpChains) {
  scratch_dir dir("file_tier_round_trip");
  std::mt19937_64 rng(7);
  constexpr std::size_t bytes = 333;  // not a power of two
  file_tier tier({.directory = dir.path, .max_blocks = 8, .block_bytes = bytes});
  const std::vector<store_key> keys = chain_keys(0, 4, 3);
  std::vector<std::vector<std::byte>> payloads;
  for (std::size_t i = 0; i < 3; ++i) {  // blocks 0, 1, 2 of the chain; not 3
    payloads.push_back(random_bytes(bytes, rng));
    tier.store(keys[i], payloads.back());
  }
  EXPECT_EQ(tier.lookup(keys), 3);
  EXPECT_EQ(tier.lookup(std::span(keys).subspan(1)), 2);
  EXPECT_EQ(tier.lookup(std::span(keys).subspan(3)), 0);
  // The same block after another prefix (or adapter) has another digest: not held.
  EXPECT_EQ(tier.lookup(chain_keys(0, 1, 3, 5)), 0);
  std::vector<std::byte> into(bytes);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(load_ok(tier, keys[i], into));
    EXPECT_EQ(into, payloads[i]);
  }
  EXPECT_FALSE(load_ok(tier, keys[3], into));
  EXPECT_EQ(tier.stats().stored_blocks, 3);
  EXPECT_EQ(tier.stats().loaded_blocks, 3);
  EXPECT_EQ(tier.stats().missed_loads, 1);
  for (const auto& entry : fs::directory_iterator(dir.path)) EXPECT_EQ(entry.path().extension(), ".blk");

  // A tier that opens the directory again finds the blocks; a leftover temporary file is removed.
  std::ofstream(dir.path / "0123456789abcdef.tmp") << "half a block";
  file_tier reopened({.directory = dir.path, .max_blocks = 8, .block_bytes = bytes});
  EXPECT_EQ(reopened.num_blocks(), 3);
  EXPECT_FALSE(fs::exists(dir.path / "0123456789abcdef.tmp"));
  ASSERT_TRUE(load_ok(reopened, keys[1], into));
  EXPECT_EQ(into, payloads[1]);
}

TEST(FileTier, EvictsTheLeastRecentlyUsedBeyondItsCapacity) {
  scratch_dir dir("file_tier_capacity");
  std::mt19937_64 rng(8);
  file_tier tier({.directory = dir.path, .max_blocks = 2, .block_bytes = 16});
  const std::vector<store_key> keys = chain_keys(100, 3, 2);
  const std::vector<std::byte> payload = random_bytes(16, rng);
  tier.store(keys[0], payload);
  tier.store(keys[1], payload);
  std::vector<std::byte> into(16);
  ASSERT_TRUE(load_ok(tier, keys[0], into));  // block 0 is now the most recently used
  tier.store(keys[2], payload);
  EXPECT_EQ(tier.num_blocks(), 2);
  EXPECT_EQ(tier.stats().evicted_blocks, 1);
  EXPECT_FALSE(fs::exists(tier.path_of(keys[1].hash)));
  EXPECT_EQ(tier.lookup(std::span(keys).subspan(0, 1)), 1);
  EXPECT_EQ(tier.lookup(std::span(keys).subspan(2, 1)), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 2);
}

TEST(FileTier, RefusedCallsChangeNothing) {
  scratch_dir dir("file_tier_refused");
  EXPECT_THROW(file_tier({.directory = dir.path, .max_blocks = 0, .block_bytes = 16}), error);
  EXPECT_THROW(file_tier({.directory = dir.path, .max_blocks = 4, .block_bytes = 0}), error);
  std::ofstream(dir.path.string() + "_file") << "x";  // a file where the directory should be
  EXPECT_THROW(file_tier({.directory = dir.path.string() + "_file/sub", .max_blocks = 4, .block_bytes = 16}), error);
  fs::remove(dir.path.string() + "_file");
  file_tier tier({.directory = dir.path, .max_blocks = 4, .block_bytes = 16});
  const std::vector<store_key> keys = chain_keys(0, 1, 4);
  const std::vector<std::byte> short_payload(15);
  try {
    tier.store(keys[0], short_payload);
    FAIL() << "a payload of the wrong size was stored";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  EXPECT_EQ(tier.num_blocks(), 0);
  EXPECT_EQ(tier.stats().stored_blocks, 0);
  EXPECT_TRUE(fs::is_empty(dir.path));
}

/// Each way of damaging a stored file, applied to a fresh copy: every one is a miss, counted, and
/// deletes the file; the bytes read never pass for the block.
TEST(FileTier, ADamagedFileIsAMissNeverKV) {
  scratch_dir dir("file_tier_damage");
  constexpr std::size_t bytes = 100;
  std::mt19937_64 rng(9);
  const std::vector<store_key> keys = chain_keys(7, 2, 5);
  const std::vector<std::byte> payload = random_bytes(bytes, rng);
  struct damage {
    const char* what;
    void (*apply)(const fs::path&);
  };
  const damage damages[] = {
      {"truncated payload", [](const fs::path& p) { fs::resize_file(p, file_tier::header_bytes + bytes - 1); }},
      {"truncated header", [](const fs::path& p) { fs::resize_file(p, 20); }},
      {"empty file", [](const fs::path& p) { fs::resize_file(p, 0); }},
      {"a byte appended", [](const fs::path& p) { std::ofstream(p, std::ios::app | std::ios::binary) << 'x'; }},
      {"payload byte flipped", [](const fs::path& p) { flip_byte(p, file_tier::header_bytes + 37); }},
      {"last payload byte flipped", [](const fs::path& p) { flip_byte(p, file_tier::header_bytes + bytes - 1); }},
      {"checksum flipped", [](const fs::path& p) { flip_byte(p, 50); }},
      {"version flipped", [](const fs::path& p) { flip_byte(p, 8); }},
      {"magic flipped", [](const fs::path& p) { flip_byte(p, 0); }},
      {"hash flipped", [](const fs::path& p) { flip_byte(p, 17); }},
      {"digest flipped", [](const fs::path& p) { flip_byte(p, 30); }},
      {"byte count flipped", [](const fs::path& p) { flip_byte(p, 40); }},
  };
  file_tier tier({.directory = dir.path, .max_blocks = 4, .block_bytes = bytes});
  std::int64_t damaged = 0;
  for (const damage& d : damages) {
    SCOPED_TRACE(d.what);
    tier.store(keys[0], payload);
    ASSERT_EQ(tier.lookup(std::span(keys).subspan(0, 1)), 1);
    d.apply(tier.path_of(keys[0].hash));
    std::vector<std::byte> into(bytes, std::byte{0});
    EXPECT_FALSE(load_ok(tier, keys[0], into));
    EXPECT_EQ(tier.stats().damaged_blocks, ++damaged);
    EXPECT_FALSE(fs::exists(tier.path_of(keys[0].hash))) << "a damaged file is deleted";
    EXPECT_EQ(tier.lookup(std::span(keys).subspan(0, 1)), 0);
  }
  // Another prefix's block under the same name (a hash collision): its digest differs, a miss.
  tier.store(keys[0], payload);
  fs::copy_file(tier.path_of(keys[0].hash), tier.path_of(keys[1].hash));
  file_tier reopened({.directory = dir.path, .max_blocks = 4, .block_bytes = bytes});
  std::vector<std::byte> into(bytes);
  EXPECT_EQ(reopened.stats().damaged_blocks, 1) << "a header naming another hash than its file";
  EXPECT_FALSE(load_ok(reopened, keys[1], into));
  ASSERT_TRUE(load_ok(reopened, keys[0], into));
  EXPECT_EQ(into, payload);
}

// ---- the three levels ----

std::vector<token_id> iota_tokens(token_id first, std::int32_t count) {
  std::vector<token_id> tokens(static_cast<std::size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

/// A prefix pushed out of the device and then out of the host tier is stored down to the file
/// tier, fetched back into host blocks and loaded into the sequence's device blocks.
TEST(HostTierOverFileTier, AnEvictedHostBlockIsStoredDownAndFetchedBack) {
  scratch_dir dir("three_levels");
  constexpr std::int32_t block_size = 2;
  constexpr std::int32_t host_blocks = 2;
  // Partial reuse off: a freed prompt's last, partly filled block would stay cached and take evictions.
  kv_cache_manager<> manager({.block_size = block_size, .num_device_blocks = 4, .enable_partial_reuse = false});
  host_prefix_tier<lru_eviction, file_tier> tier({.num_blocks = host_blocks, .block_size = block_size});
  std::vector<std::int64_t> host_kv(host_blocks * block_size);  // one int64 per token: its "K/V"
  file_tier files({.directory = dir.path, .max_blocks = 16, .block_bytes = block_size * sizeof(std::int64_t)});
  tier.attach_store(files, std::as_writable_bytes(std::span(host_kv)));
  manager.cache().set_event_callback([&](const cache_event& e) { tier.observe(e); });
  std::vector<std::int64_t> device_kv(4 * block_size);
  const auto run_offloads = [&] {
    for (const block_copy& c : tier.take_offloads()) {
      std::copy_n(device_kv.begin() + c.src * block_size, block_size, host_kv.begin() + c.dst * block_size);
    }
    tier.complete();
  };
  const auto serve = [&](seq_id seq, const std::vector<token_id>& prompt) {
    EXPECT_EQ(tier.fetch(manager.cache(), prompt, {}), 0) << "file_tier completes loads at once";
    manager.allocate(seq, prompt);
    const tier_load load = tier.load(manager, seq);
    run_offloads();
    for (const block_copy& c : load.copies) {
      std::copy_n(host_kv.begin() + c.src * block_size, block_size, device_kv.begin() + c.dst * block_size);
    }
    tier.complete();
    for (std::int32_t p = manager.num_computed_tokens(seq); p < static_cast<std::int32_t>(prompt.size()); ++p) {
      device_kv[static_cast<std::size_t>(manager.table(seq).slot(p))] = 1000 * seq + prompt[static_cast<std::size_t>(p)];
    }
    manager.mark_computed(seq, static_cast<std::int32_t>(prompt.size()));
    return load.num_loaded_tokens;
  };
  const std::vector<token_id> first = iota_tokens(0, 5);  // two full blocks, then one token
  EXPECT_EQ(serve(1, first), 0);
  manager.free(1);
  // Push them out of the device (offloaded to the host tier), then out of the host tier.
  manager.evict_cached_blocks(2);
  run_offloads();
  const std::vector<token_id> other = iota_tokens(50, 5);
  EXPECT_EQ(serve(2, other), 0);
  manager.free(2);
  manager.evict_cached_blocks(2);
  run_offloads();
  EXPECT_EQ(tier.stats().stored_down_blocks, 2);
  EXPECT_EQ(files.num_blocks(), 2);
  // The first prompt returns: both blocks come from the files, with the first sequence's K/V.
  EXPECT_EQ(serve(3, first), 4);
  EXPECT_EQ(tier.stats().fetched_blocks, 2);
  for (std::int32_t p = 0; p < 4; ++p) {
    EXPECT_EQ(device_kv[static_cast<std::size_t>(manager.table(3).slot(p))], 1000 + p) << "position " << p;
  }
}

/// Sessions return after others pushed them out of the device and the host tier; the scheduler
/// fetches them from the file tier and loads them. Every scheduled sequence reads its whole
/// history's K/V through the plan's block tables.
TEST(HostTierOverFileTier, ASchedulerServesReturningSessionsFromFiles) {
  scratch_dir dir("three_levels_scheduler");
  constexpr std::int32_t block_size = 4;
  constexpr std::int32_t device_blocks = 12;
  constexpr std::int32_t host_blocks = 6;
  scheduler<> sched({.max_tokens_per_step = 64, .max_num_seqs = 4},
                    {.block_size = block_size, .num_device_blocks = device_blocks});
  host_prefix_tier<lru_eviction, file_tier> tier({.num_blocks = host_blocks, .block_size = block_size});
  std::vector<std::uint64_t> device_kv(device_blocks * block_size), host_kv(host_blocks * block_size);
  file_tier files({.directory = dir.path, .max_blocks = 64, .block_bytes = block_size * sizeof(std::uint64_t)});
  tier.attach_store(files, std::as_writable_bytes(std::span(host_kv)));
  sched.attach_prefix_tier(tier);
  // A position's "K/V": a hash of the tokens up to it, so a block after another prefix differs.
  const auto kv_of = [](std::span<const token_id> tokens, std::int32_t p) {
    std::uint64_t h = 1469598103934665603ULL;
    for (std::int32_t i = 0; i <= p; ++i) h = (h ^ static_cast<std::uint32_t>(tokens[static_cast<std::size_t>(i)])) * 1099511628211ULL;
    return h;
  };
  const auto copy = [&](const std::vector<block_copy>& copies, const std::vector<std::uint64_t>& from,
                        std::vector<std::uint64_t>& to) {
    for (const copy_run& r : merge_copies(copies)) {
      std::copy_n(from.begin() + std::ptrdiff_t{r.src} * block_size, r.num_blocks * block_size,
                  to.begin() + std::ptrdiff_t{r.dst} * block_size);
    }
  };
  std::map<int, std::vector<token_id>> conversations;
  request_id next = 1;
  for (int turn = 0; turn < 2; ++turn) {
    for (int session = 0; session < 8; ++session) {
      std::vector<token_id>& history = conversations[session];
      if (history.empty()) history = iota_tokens(session * 1000, 13);
      history.push_back(turn);
      sched.add_request(next++, {.prompt = history, .max_new_tokens = 2});
      while (sched.has_unfinished()) {
        const step_plan plan = sched.schedule();
        ASSERT_FALSE(plan.empty());
        copy(plan.offload, device_kv, host_kv);
        copy(plan.load, host_kv, device_kv);
        for (std::size_t i = 0; i < plan.batch.size(); ++i) {
          const scheduled_sequence& s = plan.batch[i];
          const std::span<const token_id> tokens = sched.kv().tokens(s.seq);
          for (std::int32_t j = 0; j < s.num_tokens; ++j) {
            device_kv.at(static_cast<std::size_t>(plan.slot_mapping[s.slot_offset + static_cast<std::size_t>(j)])) =
                kv_of(tokens, s.first_position + j);
          }
          for (std::int32_t p = 0; p < s.kv_len(); ++p) {
            const block_id b = plan.block_tables[i * static_cast<std::size_t>(plan.max_blocks_per_seq) +
                                                 static_cast<std::size_t>(p / block_size)];
            ASSERT_EQ(device_kv[static_cast<std::size_t>(b * block_size + p % block_size)], kv_of(tokens, p))
                << "sequence " << s.seq << " position " << p;
          }
        }
        sched.complete(plan, [&](const sampling_request& r) {
          return std::vector<continuation>{{r.seqs[0], static_cast<token_id>(sched.kv().tokens(r.seqs[0]).size() % 7)}};
        });
      }
    }
  }
  EXPECT_GT(tier.stats().stored_down_blocks, 0);
  EXPECT_GT(tier.stats().fetched_blocks, 0) << "returning sessions found their prefix in the files";
  EXPECT_GT(sched.stats().loaded_tokens, tier.stats().fetched_blocks * block_size / 2);
  EXPECT_EQ(sched.stats().fetch_waits, 0) << "file_tier completes its loads inside fetch";
  EXPECT_EQ(files.stats().damaged_blocks, 0);
}

/// A store that claims every block and never completes a load: a remote store that hung.
struct hung_store {
  std::int32_t lookup(std::span<const store_key> chain) { return static_cast<std::int32_t>(chain.size()); }
  void store(const store_key&, std::span<const std::byte>) {}
  store_ticket load(const store_key&, std::span<std::byte>) { return ++loads; }
  void poll(std::vector<store_completion>&) {}
  store_ticket loads = 0;
};
static_assert(prefix_store<hung_store>);

/// Regression: a fetch that never completes held its request (and every request behind it) in
/// the queue forever. After scheduler_options' fetch timeout, in steps or in seconds of the
/// scheduler's time source, the fetch is a miss for the request: admitted, computing its prompt.
TEST(HostTierOverAStore, AFetchThatNeverCompletesTimesOutIntoAMiss) {
  constexpr std::int32_t block_size = 4;
  for (const bool in_steps : {true, false}) {
    SCOPED_TRACE(in_steps ? "timeout in steps" : "timeout in seconds");
    scheduler_options options{.max_tokens_per_step = 64, .max_num_seqs = 4};
    options.fetch_timeout_steps = in_steps ? 3 : 0;
    options.fetch_timeout_seconds = in_steps ? 0.0 : 2.0;
    scheduler<> sched(options, {.block_size = block_size, .num_device_blocks = 16});
    double now = 50.0;
    sched.set_time_source([&] { return now; });
    host_prefix_tier<lru_eviction, hung_store> tier({.num_blocks = 8, .block_size = block_size});
    hung_store store;
    std::vector<std::byte> host_kv(8 * block_size);
    tier.attach_store(store, host_kv);
    sched.attach_prefix_tier(tier);
    sched.add_request(1, {.prompt = iota_tokens(0, 13), .max_new_tokens = 1});  // 3 full blocks before the last token
    sched.add_request(2, {.prompt = iota_tokens(500, 3), .max_new_tokens = 1});  // behind it; no block to fetch
    std::int32_t waited = 0;
    step_plan plan = sched.schedule();
    for (; plan.empty() && waited < 10; plan = sched.schedule()) {
      ++waited;
      now += 0.75;
    }
    EXPECT_EQ(waited, 3) << "3 steps, or 2.25 s >= 2 s at 0.75 s a step";
    EXPECT_EQ(store.loads, 3u) << "the fetch started once, and is not started again";
    EXPECT_EQ(sched.stats().fetch_waits, 3);
    EXPECT_EQ(sched.stats().fetch_timeouts, 1);
    ASSERT_EQ(plan.batch.size(), 2u) << "the request and the one behind it are admitted";
    EXPECT_EQ(plan.batch[0].first_position, 0) << "the blocks in flight are computed";
    EXPECT_EQ(plan.batch[0].num_tokens, 13);
    EXPECT_TRUE(plan.load.empty());
    EXPECT_EQ(sched.output(1).num_loaded_prompt_tokens, 0);
    EXPECT_EQ(tier.num_fetching_blocks(), 3) << "still in flight in the tier, whose host blocks the store may write";
    sched.complete(plan, [](const sampling_request& r) { return std::vector<continuation>{{r.seqs[0], 1}}; });
    EXPECT_FALSE(sched.has_unfinished());
  }
  EXPECT_THROW(scheduler<>({.max_tokens_per_step = 8, .max_num_seqs = 1, .fetch_timeout_steps = -1},
                           {.block_size = block_size, .num_device_blocks = 16}),
               error);
}

}  // namespace
}  // namespace pagedkv
