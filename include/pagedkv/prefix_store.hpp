// prefix_store: the interface of a third level of the prefix cache, below the host tier: an
// engine's own store of KV blocks (a directory of files: file_tier; a remote store), keyed by the
// blocks' chained hashes and holding their bytes beyond the process's life.
//
// host_prefix_tier<Eviction, Store> talks to it. The store sees bytes, never block ids: the tier
// hands it the bytes of one host block (a span of the engine's pinned host buffer) to store, and a
// host block's bytes to load into. Four calls:
//
//   lookup(chain)        how many leading blocks of a hash chain the store holds (synchronous,
//                        cheap: an index or a header read, not the payload)
//   store(key, payload)  keeps a block; reads `payload` before it returns (an asynchronous store
//                        copies it), so the host block may be reused at once
//   load(key, into)      starts reading a block into a host block; returns a ticket
//   poll(done)           appends the loads completed since the last poll: ticket and whether
//                        `into` now holds exactly the bytes stored under that key
//
// A load may complete inside load() (file_tier) or later on the store's own thread; poll hands
// completions over on the caller's thread, so the tier needs no lock. A block whose bytes are
// missing, truncated, corrupted or stored under another prefix completes with ok = false: a miss,
// never wrong K/V.
//
// Keys outlive the process, so a hit cannot be verified against block ids and generations, as the
// device cache and the host tier verify theirs. A key carries, beside the hash the store is keyed
// by, a 128-bit digest of the whole prefix through the block (the key's adapter and salt and every
// token, XXH3-128 chained per block); a store hit must match both, so equal blocks after different
// prefixes, or two prefixes whose 64-bit hashes collide, never share KV.
#pragma once

#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/types.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace pagedkv {

/// XXH3-128 of a whole prefix: the adapter, the salt and every token through one block.
struct prefix_digest {
  std::uint64_t low = 0;
  std::uint64_t high = 0;
  friend bool operator==(const prefix_digest&, const prefix_digest&) = default;
};

/// The digest of the empty prefix under `key`: the chain's start.
inline prefix_digest root_digest(const prefix_key& key) noexcept {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  static constexpr char domain[] = "pagedkv prefix digest v1";
  XXH3_128bits_update(&state, domain, sizeof domain - 1);
  XXH3_128bits_update(&state, &key.adapter_id, sizeof key.adapter_id);
  const std::uint64_t salt_bytes = key.cache_salt.size();  // framed: salt "ab" + token != salt "a" + ...
  XXH3_128bits_update(&state, &salt_bytes, sizeof salt_bytes);
  XXH3_128bits_update(&state, key.cache_salt.data(), key.cache_salt.size());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

/// The digest of `parent`'s prefix followed by one block of `tokens`.
inline prefix_digest chain_digest(const prefix_digest& parent, std::span<const token_id> tokens) noexcept {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent.low, sizeof parent.low);
  XXH3_128bits_update(&state, &parent.high, sizeof parent.high);
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

/// A block as a store knows it.
struct store_key {
  block_hash hash = 0;       ///< the block's chained hash (docs/hashing.md): what the store is keyed by
  prefix_digest digest{};    ///< the whole prefix through the block: what a hit must match
  friend bool operator==(const store_key&, const store_key&) = default;
};

using store_ticket = std::uint64_t;

struct store_completion {
  store_ticket ticket = 0;
  bool ok = false;  ///< the host block holds the block's bytes; false: a miss
};

/// A third-level tier (see the file comment). lookup, store and load may throw only for errors of
/// the store itself (a directory that cannot be written); a missing or damaged block is a miss.
template <class Store>
concept prefix_store = requires(Store& store, std::span<const store_key> chain, const store_key& key,
                                std::span<const std::byte> payload, std::span<std::byte> into,
                                std::vector<store_completion>& done) {
  { store.lookup(chain) } -> std::convertible_to<std::int32_t>;
  { store.store(key, payload) } -> std::same_as<void>;
  { store.load(key, into) } -> std::same_as<store_ticket>;
  { store.poll(done) } -> std::same_as<void>;
};

/// No third level: host_prefix_tier's default, which compiles every store path away.
struct no_prefix_store {
  std::int32_t lookup(std::span<const store_key>) { return 0; }
  void store(const store_key&, std::span<const std::byte>) {}
  store_ticket load(const store_key&, std::span<std::byte>) { return 0; }
  void poll(std::vector<store_completion>&) {}
};

static_assert(prefix_store<no_prefix_store>);

}  // namespace pagedkv
