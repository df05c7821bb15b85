// KV events in vLLM's wire schema, for routers that track which replica caches which prefix
// (llm-d, Dynamo): a kv_event_recorder turns the cache's events (prefix_cache's, or a
// host_prefix_tier's) into BlockStored / BlockRemoved / AllBlocksCleared, and encode_kv_events
// writes a batch as msgpack exactly as vLLM's publisher does (msgspec structs, array_like, tagged
// with the class name):
//
//   KVEventBatch     = [ts (float64), [event, ...]]
//   BlockStored      = ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size,
//                       lora_id | nil, medium | nil]
//   BlockRemoved     = ["BlockRemoved", [hash, ...], medium | nil]
//   AllBlocksCleared = ["AllBlocksCleared"]
//
// Hashes are docs/hashing.md's (uint64). The medium tells the tiers apart: "GPU" for the device
// cache, "CPU" for the host tier. Needs msgpack-cxx's headers (Debian: libmsgpack-cxx-dev), used
// without Boost; pagedkv.hpp does not include this header.
#pragma once

#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/types.hpp>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace pagedkv {

struct block_stored_event {
  std::vector<block_hash> block_hashes{};         ///< a chain: each block's parent is the one before
  std::optional<block_hash> parent_block_hash{};  ///< the first block's parent; none for a root
  std::vector<token_id> token_ids{};              ///< block_size tokens per block, in order
  std::int32_t block_size = 0;
  std::optional<std::int64_t> lora_id{};          ///< the adapter, none for the base model
  std::optional<std::string> medium{};
  friend bool operator==(const block_stored_event&, const block_stored_event&) = default;
};
struct block_removed_event {
  std::vector<block_hash> block_hashes{};
  std::optional<std::string> medium{};
  friend bool operator==(const block_removed_event&, const block_removed_event&) = default;
};
struct all_blocks_cleared_event {
  friend bool operator==(const all_blocks_cleared_event&, const all_blocks_cleared_event&) = default;
};
using kv_event = std::variant<block_stored_event, block_removed_event, all_blocks_cleared_event>;

struct kv_event_batch {
  double ts = 0.0;  ///< seconds since the epoch, as vLLM's time.time()
  std::vector<kv_event> events{};
  friend bool operator==(const kv_event_batch&, const kv_event_batch&) = default;
};

/// Collects cache events into vLLM's events: install it as (or call it from) a cache's event
/// callback, then take() a batch per engine step. Blocks stored one after another along a chain
/// under one adapter become one BlockStored, as vLLM emits one per request's new blocks; removals
/// in a row become one BlockRemoved.
class kv_event_recorder {
 public:
  /// `medium`: "GPU" for a device cache, "CPU" for a host tier.
  kv_event_recorder(std::int32_t block_size, std::string medium) : block_size_(block_size), medium_(std::move(medium)) {}

  void operator()(const cache_event& e) {
    switch (e.type) {
      case cache_event::kind::stored: return stored(e);
      case cache_event::kind::removed: return removed(e);
      case cache_event::kind::cleared:
        events_.emplace_back(all_blocks_cleared_event{});
        adapter_of_.clear();
        return;
    }
  }

  /// The events since the last take(), stamped `ts`.
  [[nodiscard]] kv_event_batch take(double ts) { return {ts, std::exchange(events_, {})}; }
  [[nodiscard]] bool empty() const noexcept { return events_.empty(); }

 private:
  void stored(const cache_event& e) {
    // A child block's adapter is its root's: the event names a key for roots only.
    std::int64_t adapter = e.key.adapter_id;
    if (e.parent_hash) {
      const auto it = adapter_of_.find(*e.parent_hash);
      adapter = it == adapter_of_.end() ? 0 : it->second;
    }
    adapter_of_[e.hash] = adapter;
    const std::optional<std::int64_t> lora = adapter == 0 ? std::nullopt : std::optional(adapter);
    if (!events_.empty()) {
      if (auto* last = std::get_if<block_stored_event>(&events_.back());
          last && e.parent_hash && *e.parent_hash == last->block_hashes.back() && last->lora_id == lora) {
        last->block_hashes.push_back(e.hash);
        last->token_ids.insert(last->token_ids.end(), e.tokens.begin(), e.tokens.end());
        return;
      }
    }
    events_.emplace_back(block_stored_event{.block_hashes = {e.hash},
                                            .parent_block_hash = e.parent_hash,
                                            .token_ids = {e.tokens.begin(), e.tokens.end()},
                                            .block_size = block_size_,
                                            .lora_id = lora,
                                            .medium = medium_});
  }
  void removed(const cache_event& e) {
    adapter_of_.erase(e.hash);
    if (!events_.empty()) {
      if (auto* last = std::get_if<block_removed_event>(&events_.back())) {
        last->block_hashes.push_back(e.hash);
        return;
      }
    }
    events_.emplace_back(block_removed_event{.block_hashes = {e.hash}, .medium = medium_});
  }

  std::int32_t block_size_;
  std::string medium_;
  std::vector<kv_event> events_;
  std::unordered_map<block_hash, std::int64_t> adapter_of_;  // cached blocks' adapters
};

namespace detail {

template <class T>
void pack_optional(msgpack::packer<msgpack::sbuffer>& p, const std::optional<T>& value) {
  if (value) {
    p.pack(*value);
  } else {
    p.pack_nil();
  }
}

}  // namespace detail

/// The batch as vLLM's publisher serialises a KVEventBatch (see the file comment).
inline std::string encode_kv_events(const kv_event_batch& batch) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> p(buffer);
  p.pack_array(2);
  p.pack_double(batch.ts);
  p.pack_array(static_cast<std::uint32_t>(batch.events.size()));
  for (const kv_event& event : batch.events) {
    if (const auto* s = std::get_if<block_stored_event>(&event)) {
      p.pack_array(7);
      p.pack(std::string("BlockStored"));
      p.pack(s->block_hashes);
      detail::pack_optional(p, s->parent_block_hash);
      p.pack(s->token_ids);
      p.pack(s->block_size);
      detail::pack_optional(p, s->lora_id);
      detail::pack_optional(p, s->medium);
    } else if (const auto* r = std::get_if<block_removed_event>(&event)) {
      p.pack_array(3);
      p.pack(std::string("BlockRemoved"));
      p.pack(r->block_hashes);
      detail::pack_optional(p, r->medium);
    } else {
      p.pack_array(1);
      p.pack(std::string("AllBlocksCleared"));
    }
  }
  return {buffer.data(), buffer.size()};
}

}  // namespace pagedkv
