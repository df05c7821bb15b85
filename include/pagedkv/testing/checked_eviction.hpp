// checked_eviction<Eviction>: an eviction policy that runs another and checks, on every call, the
// promises prefix_cache relies on and cannot check itself. The conformance kit builds the manager
// it tests with it (conformance.hpp), so a broken policy fails at the pop() that breaks the rule:
// - pop() returns only an idle block: one pushed and neither erased nor popped since. A block the
//   cache took back with erase() (a hit made it active again) is still referenced; evicting it
//   would hand its KV to another sequence while the first still reads it.
// - a queue that offers unpin_all() (priority_eviction, tinylfu_eviction) promises pins: pop()
//   never returns a block pushed at pinned_priority until unpin_all() released it.
// A broken promise fails the RapidCheck case (RC_FAIL) naming the block. Pulls in RapidCheck.
#pragma once

#include <pagedkv/eviction.hpp>
#include <pagedkv/types.hpp>

#include <rapidcheck.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagedkv::testing {

/// A queue whose owner promises that pinned_priority blocks stay until unpin_all().
template <class Queue>
concept pinning_eviction_queue = requires(Queue q, std::int32_t priority) { q.unpin_all(priority); };

template <class Eviction>
struct checked_eviction {
  using inner_policy = Eviction;

  class queue {
    using inner_queue = typename Eviction::queue;
    enum class state : std::uint8_t { absent, idle, pinned };

   public:
    explicit queue(std::int32_t capacity) : inner_(capacity), states_(static_cast<std::size_t>(capacity)) {}

    void push(block_id id, std::int32_t priority) {
      note_push(id, priority);
      inner_.push(id, priority);
    }
    /// For policies that key by content (retention.hpp): prefix_cache passes the block's hash.
    void push(block_id id, std::int32_t priority, block_hash hash)
      requires requires(inner_queue q, block_id i, std::int32_t p, block_hash h) { q.push(i, p, h); }
    {
      note_push(id, priority);
      inner_.push(id, priority, hash);
    }
    void erase(block_id id) {
      at(id) = state::absent;
      inner_.erase(id);
    }
    std::optional<block_id> pop() {
      const std::optional<block_id> victim = inner_.pop();
      if (!victim) return victim;
      if (*victim < 0 || static_cast<std::size_t>(*victim) >= states_.size()) {
        RC_FAIL("eviction policy's pop() returned block " + std::to_string(*victim) + ", which is no block id");
      }
      if (at(*victim) == state::absent) {
        RC_FAIL("eviction policy's pop() returned block " + std::to_string(*victim) +
                ", which is not idle: the cache took it back with erase() (or it was popped) since its last "
                "push(), so a sequence still references it");
      }
      if (at(*victim) == state::pinned) {
        RC_FAIL("eviction policy's pop() returned block " + std::to_string(*victim) +
                ", pushed at pinned_priority and not unpinned since: a queue with unpin_all() promises pins");
      }
      at(*victim) = state::absent;
      return victim;
    }
    [[nodiscard]] bool contains(block_id id) const { return inner_.contains(id); }
    [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(inner_.size()); }

    /// Tells a policy with per-block state that the block left the cache (retention.hpp).
    void forget(block_id id)
      requires requires(inner_queue q, block_id i) { q.forget(i); }
    {
      inner_.forget(id);
    }
    void unpin_all(std::int32_t priority = 0)
      requires pinning_eviction_queue<inner_queue>
    {
      for (state& s : states_) s = s == state::pinned ? state::idle : s;
      inner_.unpin_all(priority);
    }
    [[nodiscard]] inner_queue& inner() noexcept { return inner_; }

   private:
    state& at(block_id id) { return states_.at(static_cast<std::size_t>(id)); }
    void note_push(block_id id, std::int32_t priority) {
      at(id) = pinning_eviction_queue<inner_queue> && priority == pinned_priority ? state::pinned : state::idle;
    }

    inner_queue inner_;
    std::vector<state> states_;
  };
};

static_assert(eviction_policy<checked_eviction<lru_eviction>> && eviction_policy<checked_eviction<priority_eviction>>);

/// The policy a checked_eviction runs; the type itself for any other policy.
template <class Eviction>
struct unchecked_eviction {
  using type = Eviction;
};
template <class Eviction>
struct unchecked_eviction<checked_eviction<Eviction>> {
  using type = Eviction;
};
template <class Eviction>
using unchecked_eviction_t = typename unchecked_eviction<Eviction>::type;

}  // namespace pagedkv::testing
