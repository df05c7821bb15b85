// Writes KV event batches for tests/core/kv_events_msgspec.py: a manager (medium "GPU") and its
// host tier (medium "CPU") under two adapters, with a chain, a broken chain, removals and
// clears. For each batch, DIR/<name>.msgpack holds encode_kv_events' bytes and DIR/expected.json
// every field of every event, written from the C++ structs (not from the bytes), so the Python
// side checks the encoder against an independent account of what it was given.
//   kv_events_emit DIR
#include <pagedkv/host_tier.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/kv_events.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <variant>
#include <vector>

namespace {

using namespace pagedkv;

std::vector<token_id> iota_tokens(token_id first, std::int32_t count) {
  std::vector<token_id> tokens(static_cast<std::size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

template <class T>
nlohmann::json optional_json(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json event_json(const kv_event& event) {
  if (const auto* s = std::get_if<block_stored_event>(&event)) {
    return {{"type", "BlockStored"},        {"block_hashes", s->block_hashes},
            {"parent_block_hash", optional_json(s->parent_block_hash)},
            {"token_ids", s->token_ids},    {"block_size", s->block_size},
            {"lora_id", optional_json(s->lora_id)}, {"medium", optional_json(s->medium)}};
  }
  if (const auto* r = std::get_if<block_removed_event>(&event)) {
    return {{"type", "BlockRemoved"}, {"block_hashes", r->block_hashes}, {"medium", optional_json(r->medium)}};
  }
  return {{"type", "AllBlocksCleared"}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: kv_events_emit DIR\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  kv_cache_manager<> manager({.block_size = 3, .num_device_blocks = 6});
  host_prefix_tier<> tier({.num_blocks = 4, .block_size = 3});
  kv_event_recorder gpu(3, "GPU");
  kv_event_recorder cpu(3, "CPU");
  manager.cache().set_event_callback([&](const cache_event& e) {
    gpu(e);
    tier.observe(e);
  });
  tier.set_event_callback([&](const cache_event& e) { cpu(e); });

  // An adapter's chain of two blocks, token ids past 2^16 and one past 2^31 - 2^8.
  std::vector<token_id> adapter_prompt = iota_tokens(70000, 7);
  adapter_prompt[4] = 2147483000;
  manager.allocate(1, adapter_prompt, {.key = {.adapter_id = 9000000000}});
  manager.mark_computed(1, 7);
  // The base model's prompt: lora_id none.
  manager.allocate(2, iota_tokens(0, 4));
  manager.mark_computed(2, 4);
  manager.free(1);
  manager.free(2);
  manager.evict_cached_blocks(3);  // removed on the GPU, stored on the CPU
  (void)tier.take_offloads();      // an engine would run these copies
  tier.complete();
  // A base prompt whose blocks chain under a parent still cached.
  manager.allocate(3, iota_tokens(0, 7));
  manager.mark_computed(3, 7);
  manager.free(3);
  manager.reset_prefix_cache();
  (void)tier.take_offloads();
  tier.complete();
  tier.clear();

  nlohmann::json expected = nlohmann::json::array();
  const auto write = [&](const std::string& name, const kv_event_batch& batch) {
    std::ofstream(dir / (name + ".msgpack"), std::ios::binary) << encode_kv_events(batch);
    nlohmann::json events = nlohmann::json::array();
    for (const kv_event& e : batch.events) events.push_back(event_json(e));
    expected.push_back({{"file", name + ".msgpack"}, {"ts", batch.ts}, {"events", events}});
  };
  write("gpu", gpu.take(1764115200.25));
  write("cpu", cpu.take(1764115200.5));
  std::ofstream(dir / "expected.json") << expected.dump(1);
  std::cout << "wrote " << expected.size() << " batches to " << dir << "\n";
  return 0;
}
