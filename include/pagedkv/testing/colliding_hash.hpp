// Hash policies that collide on purpose, for conformance runs: with them the prefix cache's
// verification of tokens, parents, generations and keys alone must keep every hit right.
// Part of pagedkv::testing; needs nothing beyond pagedkv.
#pragma once

#include <pagedkv/hash.hpp>
#include <pagedkv/types.hpp>

#include <cstddef>
#include <span>

namespace pagedkv::testing {

/// A block's hash is its depth in the chain, whatever its tokens, parent or key: every chain
/// position collides across prompts, so stale parents and old generations meet the probes.
struct depth_hash {
  block_hash operator()(block_hash parent, std::span<const std::byte>) const noexcept { return parent + 1; }
};

/// A proper chained hash reduced to 5 values: collisions across depths and contents alike.
struct modulus_hash {
  block_hash operator()(block_hash parent, std::span<const std::byte> bytes) const noexcept {
    return xxh3_hash{}(parent, bytes) % 5;
  }
};

/// The last block's tokens only, ignoring the parent: equal blocks after different prefixes
/// collide, so only the parent check tells them apart.
struct last_block_hash {
  block_hash operator()(block_hash, std::span<const std::byte> bytes) const noexcept {
    return xxh3_hash{}(0, bytes);
  }
};

static_assert(hash_policy<depth_hash> && hash_policy<modulus_hash> && hash_policy<last_block_hash>);

}  // namespace pagedkv::testing
