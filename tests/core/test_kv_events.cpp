// kv_events.hpp: the recorder's events from a manager and its host tier, and their msgpack bytes
// decoded field by field as vLLM's msgspec structs (array_like, tagged) lay them out.
#include <pagedkv/host_tier.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/kv_events.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace pagedkv {
namespace {

std::vector<token_id> iota_tokens(token_id first, std::int32_t count) {
  std::vector<token_id> tokens(static_cast<std::size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

/// A decoded msgpack array's element `i`.
const msgpack::object& at(const msgpack::object& array, std::size_t i) {
  EXPECT_EQ(array.type, msgpack::type::ARRAY);
  EXPECT_LT(i, array.via.array.size);
  return array.via.array.ptr[i];
}

TEST(KvEvents, AManagerAndItsHostTierSpeakVllmsSchema) {
  // Partial reuse off: a freed prompt's last, partly filled block would stay cached (with no event)
  // and take one of the evictions whose events this test reads.
  kv_cache_manager<> manager({.block_size = 2, .num_device_blocks = 4, .enable_partial_reuse = false});
  host_prefix_tier<> tier({.num_blocks = 8, .block_size = 2});
  kv_event_recorder gpu(2, "GPU");
  kv_event_recorder cpu(2, "CPU");
  manager.cache().set_event_callback([&](const cache_event& e) {
    gpu(e);
    tier.observe(e);
  });
  tier.set_event_callback([&](const cache_event& e) { cpu(e); });

  manager.allocate(1, iota_tokens(10, 5), {.key = {.adapter_id = 7}});
  manager.mark_computed(1, 5);  // two blocks stored in one chain: one BlockStored
  manager.free(1);
  manager.evict_cached_blocks(2);  // removed on the GPU, stored on the CPU
  manager.reset_prefix_cache();

  std::vector<block_hash> hashes;
  manager.cache().extend_hashes(iota_tokens(10, 5), {.adapter_id = 7}, hashes);
  const kv_event_batch batch = gpu.take(1234.5);
  ASSERT_EQ(batch.events.size(), 3U);
  EXPECT_EQ(std::get<block_stored_event>(batch.events[0]),
            (block_stored_event{.block_hashes = hashes, .parent_block_hash = std::nullopt,
                                .token_ids = iota_tokens(10, 4), .block_size = 2, .lora_id = 7, .medium = "GPU"}));
  EXPECT_EQ(std::get<block_removed_event>(batch.events[1]),
            (block_removed_event{.block_hashes = {hashes[1], hashes[0]}, .medium = "GPU"}));
  EXPECT_TRUE(std::holds_alternative<all_blocks_cleared_event>(batch.events[2]));
  EXPECT_TRUE(gpu.empty());

  // The tier stored the deepest block first: two events, each naming its parent.
  const kv_event_batch host = cpu.take(1.0);
  ASSERT_EQ(host.events.size(), 2U);
  const auto& deep = std::get<block_stored_event>(host.events[0]);
  EXPECT_EQ(deep.block_hashes, std::vector<block_hash>{hashes[1]});
  EXPECT_EQ(deep.parent_block_hash, hashes[0]);
  EXPECT_EQ(deep.medium, "CPU");
  EXPECT_EQ(std::get<block_stored_event>(host.events[1]).parent_block_hash, std::nullopt);
  EXPECT_EQ(std::get<block_stored_event>(host.events[1]).lora_id, 7);

  // The bytes, decoded as msgspec decodes KVEventBatch.
  const std::string bytes = encode_kv_events(batch);
  const msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& root = handle.get();
  ASSERT_EQ(root.type, msgpack::type::ARRAY);
  ASSERT_EQ(root.via.array.size, 2U);
  EXPECT_EQ(at(root, 0).type, msgpack::type::FLOAT64);
  EXPECT_EQ(at(root, 0).as<double>(), 1234.5);
  const msgpack::object& events = at(root, 1);
  ASSERT_EQ(events.via.array.size, 3U);
  const msgpack::object& stored = at(events, 0);
  ASSERT_EQ(stored.via.array.size, 7U);
  EXPECT_EQ(at(stored, 0).as<std::string>(), "BlockStored");
  EXPECT_EQ(at(stored, 1).as<std::vector<std::uint64_t>>(), (std::vector<std::uint64_t>{hashes[0], hashes[1]}));
  EXPECT_TRUE(at(stored, 2).is_nil());
  EXPECT_EQ(at(stored, 3).as<std::vector<std::int64_t>>(), (std::vector<std::int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(at(stored, 4).as<std::int64_t>(), 2);
  EXPECT_EQ(at(stored, 5).as<std::int64_t>(), 7);
  EXPECT_EQ(at(stored, 6).as<std::string>(), "GPU");
  const msgpack::object& removed = at(events, 1);
  ASSERT_EQ(removed.via.array.size, 3U);
  EXPECT_EQ(at(removed, 0).as<std::string>(), "BlockRemoved");
  EXPECT_EQ(at(removed, 1).as<std::vector<std::uint64_t>>(), (std::vector<std::uint64_t>{hashes[1], hashes[0]}));
  EXPECT_EQ(at(removed, 2).as<std::string>(), "GPU");
  const msgpack::object& cleared = at(events, 2);
  ASSERT_EQ(cleared.via.array.size, 1U);
  EXPECT_EQ(at(cleared, 0).as<std::string>(), "AllBlocksCleared");
}

TEST(KvEvents, ABaseModelBlockHasNoLoraAndABrokenChainStartsANewEvent) {
  kv_event_recorder recorder(1, "GPU");
  const std::vector<token_id> a{1};
  const std::vector<token_id> b{2};
  recorder({.type = cache_event::kind::stored, .block = 0, .hash = 10, .parent_hash = {}, .tokens = a});
  recorder({.type = cache_event::kind::stored, .block = 1, .hash = 20, .parent_hash = 99, .tokens = b});
  const kv_event_batch batch = recorder.take(0.0);
  ASSERT_EQ(batch.events.size(), 2U);
  EXPECT_EQ(std::get<block_stored_event>(batch.events[0]).lora_id, std::nullopt);
  EXPECT_EQ(std::get<block_stored_event>(batch.events[1]).parent_block_hash, 99U);
  const std::string bytes = encode_kv_events(batch);
  const msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  EXPECT_TRUE(at(at(at(handle.get(), 1), 0), 5).is_nil());
}

}  // namespace
}  // namespace pagedkv
