// Retention policies for prefix_cache: eviction policies that keep blocks cached on purpose.
//
// - ttl_eviction<Inner, Clock>: a block stays cached at least a time-to-live after its last use
//   (in steps the engine counts, or in seconds); expired blocks are evicted in Inner's order.
// - pin_budget_eviction<Inner>: pinned prefixes are never evicted; pins are capped by a budget and
//   a pin beyond it is refused (errc::pin_budget_exceeded) or, for a pinned_priority sequence,
//   kept at the highest evictable priority.
// - tinylfu_eviction: frequency-aware. A count-min sketch over block hashes (TinyLFU's frequency
//   filter) remembers how often each prefix block went idle, evicted or not; blocks seen once go
//   before blocks seen again, least recently idle first within each.
//
// Each composes with priority: ttl and pin_budget wrap any eviction policy (priority_eviction
// included), and tinylfu orders by priority first. Each is a type chosen by template parameter,
// like lru_eviction and priority_eviction: a manager that does not name one pays nothing.
//
// Three optional queue members extend eviction_policy, and prefix_cache calls them only when a
// queue has them: push(id, priority, hash) hands the policy the block's chained hash, forget(id)
// says a block left the cache (evicted or cleared), so per-block state does not outlive its
// content, and num_held() counts idle blocks the policy keeps for now but releases as its clock
// moves (a TTL's), which a scheduler waits for rather than refusing a request that needs them.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/eviction.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <ratio>
#include <span>
#include <string_view>
#include <vector>

namespace pagedkv {

/// An eviction queue that wants each block's chained hash when it goes idle.
template <class Queue>
concept hashed_eviction_queue = requires(Queue queue, block_id id, std::int32_t priority, block_hash hash) {
  { queue.push(id, priority, hash) } -> std::same_as<void>;
};

namespace detail {

/// Pushes to an inner queue with the hash when it takes one.
template <class Queue>
void push_idle(Queue& queue, block_id id, std::int32_t priority, block_hash hash) {
  if constexpr (hashed_eviction_queue<Queue>) {
    queue.push(id, priority, hash);
  } else {
    queue.push(id, priority);
  }
}

template <class Queue>
void forget_block(Queue& queue, block_id id) {
  if constexpr (requires { queue.forget(id); }) queue.forget(id);
}

}  // namespace detail

// ---- time to live ----

/// A clock of engine steps: time moves only when the engine calls advance() (once per scheduled
/// step, say), so a TTL in steps does not depend on how fast a step runs.
class step_clock {
 public:
  using rep = std::int64_t;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<rep, period>;
  using time_point = std::chrono::time_point<step_clock, duration>;
  static constexpr bool is_steady = true;

  [[nodiscard]] time_point now() const noexcept { return now_; }
  void advance(duration steps = duration{1}) noexcept { now_ += steps; }

 private:
  time_point now_{};
};

/// A count of engine steps, for ttl_eviction<Inner, step_clock>::queue::set_ttl.
using steps = step_clock::duration;

/// A clock in seconds whose time its owner sets: a scheduler sets it once per step from its time
/// source (scheduler::set_time_source), so a TTL in seconds follows whatever clock the engine, a
/// simulator or a test injects. It never goes back: an earlier time is ignored.
class manual_clock {
 public:
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<rep, period>;
  using time_point = std::chrono::time_point<manual_clock, duration>;
  static constexpr bool is_steady = true;

  [[nodiscard]] time_point now() const noexcept { return now_; }
  void set(time_point t) noexcept { now_ = std::max(now_, t); }

 private:
  time_point now_{};
};

/// A clock ttl_eviction can read: now() on a (const) instance, never going back.
template <class Clock>
concept ttl_clock = std::default_initializable<Clock> && requires(const Clock clock) {
  typename Clock::duration;
  typename Clock::time_point;
  { clock.now() } -> std::same_as<typename Clock::time_point>;
};

/// Keeps every idle block at least ttl() after it went idle (its last use ended); blocks whose TTL
/// has passed are evicted in Inner's order (least recently used, or by priority). The TTL is 0 until
/// set_ttl, which makes the policy Inner. Clock is step_clock (steps: a scheduler advances it each
/// schedule(), an engine of its own each step), manual_clock (seconds from the scheduler's time
/// source) or std::chrono::steady_clock (seconds, read directly). Protected blocks wait in a list
/// in the order they went idle, which is also their expiry order, so each push, erase and expiry is
/// O(1) plus Inner's cost. A TTL is a hold: a protected block is never evicted, so an allocation
/// that finds no expired block fails with out_of_blocks (num_free_blocks does not count protected
/// blocks). num_held() counts them: scheduler waits for them to expire, never refusing a request
/// that fits the pool (docs/design.md, "Retention policies").
template <eviction_policy Inner = lru_eviction, ttl_clock Clock = step_clock>
struct ttl_eviction {
  static constexpr std::string_view name = "ttl";
  using inner_policy = Inner;
  using clock_type = Clock;

  class queue {
   public:
    using duration = typename Clock::duration;

    explicit queue(std::int32_t capacity)
        : inner_(capacity), protected_(capacity), info_(static_cast<std::size_t>(capacity)) {}

    void push(block_id id, std::int32_t priority) { push(id, priority, 0); }
    void push(block_id id, std::int32_t priority, block_hash hash) {
      info_[static_cast<std::size_t>(id)] = {clock_.now(), priority, hash};
      protected_.push_back(id);
    }
    void erase(block_id id) {
      if (protected_.contains(id)) {
        protected_.remove(id);
      } else {
        inner_.erase(id);
      }
    }
    std::optional<block_id> pop() {
      expire();
      return inner_.pop();
    }
    [[nodiscard]] bool contains(block_id id) const { return protected_.contains(id) || inner_.contains(id); }
    /// Idle blocks whose TTL has passed and that Inner may evict.
    [[nodiscard]] std::int32_t size() const {
      expire();
      return static_cast<std::int32_t>(inner_.size());
    }
    void forget(block_id id) { detail::forget_block(inner_, id); }

    /// Idle blocks still within their TTL.
    [[nodiscard]] std::int32_t num_protected() const {
      expire();
      return protected_.size();
    }
    /// Idle blocks that time will release: those within the TTL, and Inner's own held blocks.
    [[nodiscard]] std::int32_t num_held() const { return num_protected() + detail::num_held_idle(inner_); }
    [[nodiscard]] duration ttl() const noexcept { return ttl_; }
    /// Sets the TTL of every idle block still within the old one, from when it went idle (blocks
    /// the old TTL already released stay evictable).
    /// Errors: invalid_argument for a negative TTL.
    void set_ttl(duration ttl) {
      if (ttl < duration::zero()) {
        detail::fail(errc::invalid_argument, "ttl_eviction TTL of ", ttl.count(), " ticks is negative");
      }
      expire();
      ttl_ = ttl;
    }
    /// The clock: a scheduler moves a step_clock or a manual_clock on each schedule(); an engine
    /// without one advances a step_clock here once per step.
    [[nodiscard]] Clock& clock() noexcept { return clock_; }
    [[nodiscard]] const Clock& clock() const noexcept { return clock_; }
    /// The inner policy's queue, for its own calls (priority_eviction's unpin_all).
    [[nodiscard]] typename Inner::queue& inner() noexcept { return inner_; }

   private:
    struct idle_info {
      typename Clock::time_point since{};
      std::int32_t priority = 0;
      block_hash hash = 0;
    };

    /// Hands the blocks whose TTL has passed to Inner, oldest first. Logically const: what the
    /// queue holds does not change, only which part of it may be evicted, as time goes on.
    void expire() const {
      const typename Clock::time_point now = clock_.now();
      while (!protected_.empty()) {
        const block_id id = protected_.front();
        const idle_info& info = info_[static_cast<std::size_t>(id)];
        if (now - info.since < ttl_) break;
        protected_.remove(id);
        detail::push_idle(inner_, id, info.priority, info.hash);
      }
    }

    mutable typename Inner::queue inner_;
    mutable detail::intrusive_list protected_;  // idle within the TTL, in the order they went idle
    std::vector<idle_info> info_;
    duration ttl_ = duration::zero();
    [[no_unique_address]] Clock clock_{};
  };
};

// ---- pin budget ----

/// Pinned blocks are never evicted, and at most pin_budget() blocks are pinned at once. Pin a
/// cached prefix with pin_prefix (below) or a block with queue::pin; a pin beyond the budget is
/// refused with errc::pin_budget_exceeded and pins nothing. A sequence allocated with
/// cache_priority pinned_priority asks for its blocks to be pinned when they go idle: within the
/// budget they are, beyond it they stay at pinned_priority - 1 (refused_pins() counts them), since
/// freeing a sequence cannot fail. A pin holds until unpin, or until the block leaves the cache
/// (reset_prefix_cache), whether the block is idle or in use. Unpinned blocks go to Inner. The
/// budget is 0 until set_pin_budget.
template <eviction_policy Inner = lru_eviction>
struct pin_budget_eviction {
  static constexpr std::string_view name = "pin_budget";
  using inner_policy = Inner;

  class queue {
   public:
    explicit queue(std::int32_t capacity) : inner_(capacity), state_(static_cast<std::size_t>(capacity)) {}

    void push(block_id id, std::int32_t priority) { push(id, priority, 0); }
    void push(block_id id, std::int32_t priority, block_hash hash) {
      block_state& s = state_[static_cast<std::size_t>(id)];
      if (!s.pinned && priority == pinned_priority) {
        if (num_pinned_ < budget_) {
          s.pinned = true;
          ++num_pinned_;
        } else {
          ++refused_pins_;
          priority = pinned_priority - 1;
        }
      }
      s.priority = priority;
      s.hash = hash;
      if (s.pinned) {
        s.idle = true;
      } else {
        detail::push_idle(inner_, id, priority, hash);
      }
    }
    void erase(block_id id) {
      block_state& s = state_[static_cast<std::size_t>(id)];
      if (s.idle) {
        s.idle = false;
      } else {
        inner_.erase(id);
      }
    }
    std::optional<block_id> pop() { return inner_.pop(); }
    [[nodiscard]] bool contains(block_id id) const {
      return state_[static_cast<std::size_t>(id)].idle || inner_.contains(id);
    }
    /// Idle blocks that are not pinned.
    [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(inner_.size()); }
    /// Inner's idle blocks that time will release; pinned blocks stay until unpinned.
    [[nodiscard]] std::int32_t num_held() const { return detail::num_held_idle(inner_); }
    void forget(block_id id) {
      block_state& s = state_[static_cast<std::size_t>(id)];
      if (s.pinned) --num_pinned_;
      s = {};
      detail::forget_block(inner_, id);
    }

    [[nodiscard]] std::int32_t pin_budget() const noexcept { return budget_; }
    /// Pinned blocks, idle or in use.
    [[nodiscard]] std::int32_t num_pinned() const noexcept { return num_pinned_; }
    /// pinned_priority requests kept evictable because the budget was spent.
    [[nodiscard]] std::int64_t refused_pins() const noexcept { return refused_pins_; }
    [[nodiscard]] bool is_pinned(block_id id) const { return state_.at(static_cast<std::size_t>(id)).pinned; }

    /// Errors: invalid_argument if `blocks` is negative or below num_pinned() (unpin first).
    void set_pin_budget(std::int32_t blocks) {
      if (blocks < num_pinned_ || blocks < 0) {
        detail::fail(errc::invalid_argument, "pin budget of ", blocks, " blocks: ", num_pinned_,
                     " are pinned (unpin some first)");
      }
      budget_ = blocks;
    }
    /// Pins block `id`, a cached block of the caller's cache (no-op if pinned).
    /// Errors: pin_budget_exceeded when the budget is spent.
    void pin(block_id id) {
      block_state& s = state_.at(static_cast<std::size_t>(id));
      if (s.pinned) return;
      if (num_pinned_ >= budget_) {
        detail::fail(errc::pin_budget_exceeded, "pin of block ", id, ": the budget of ", budget_,
                     " blocks is spent");
      }
      s.pinned = true;
      ++num_pinned_;
      if (inner_.contains(id)) {
        inner_.erase(id);
        s.idle = true;
      }
    }
    /// Makes block `id` evictable again (Inner's order, at the priority it was last used with).
    /// No-op if it is not pinned.
    void unpin(block_id id) {
      block_state& s = state_.at(static_cast<std::size_t>(id));
      if (!s.pinned) return;
      s.pinned = false;
      --num_pinned_;
      if (s.idle) {
        s.idle = false;
        detail::push_idle(inner_, id, s.priority == pinned_priority ? pinned_priority - 1 : s.priority, s.hash);
      }
    }
    [[nodiscard]] typename Inner::queue& inner() noexcept { return inner_; }

   private:
    struct block_state {
      bool pinned = false;
      bool idle = false;  // pinned and idle: in this queue, not in Inner's
      std::int32_t priority = 0;
      block_hash hash = 0;
    };
    typename Inner::queue inner_;
    std::vector<block_state> state_;
    std::int32_t budget_ = 0;
    std::int32_t num_pinned_ = 0;
    std::int64_t refused_pins_ = 0;
  };
};

/// A prefix_cache whose eviction policy is pin_budget_eviction.
template <class Cache>
concept pinning_cache = requires(Cache& cache, block_id id) {
  cache.eviction_queue().pin(id);
  cache.eviction_queue().unpin(id);
  { cache.eviction_queue().pin_budget() } -> std::convertible_to<std::int32_t>;
};

namespace detail {

/// The device cache's links for the longest cached prefix of `tokens` (whole blocks).
template <class Cache>
std::vector<chain_link> cached_chain(const Cache& cache, std::span<const token_id> tokens, const prefix_key& key) {
  std::vector<block_hash> hashes;
  cache.extend_hashes(tokens, key, hashes);
  std::vector<chain_link> chain;
  cache.match(tokens, key, hashes, static_cast<std::int32_t>(hashes.size()), chain);
  return chain;
}

}  // namespace detail

/// Pins the cached blocks of the longest cached prefix of `tokens` under `key` (whole blocks only)
/// and returns how many blocks that prefix holds; blocks of it already pinned count once. Call it
/// after the prefix is computed (mark_computed), e.g. on a manager's cache():
/// `pin_prefix(manager.cache(), system_prompt)`.
/// Errors: pin_budget_exceeded, pinning nothing, when the budget cannot take the new pins.
template <pinning_cache Cache>
std::int32_t pin_prefix(Cache& cache, std::span<const token_id> tokens, const prefix_key& key = {}) {
  const std::vector<chain_link> chain = detail::cached_chain(cache, tokens, key);
  auto& queue = cache.eviction_queue();
  const auto new_pins = static_cast<std::int32_t>(
      std::count_if(chain.begin(), chain.end(), [&](const chain_link& l) { return !queue.is_pinned(l.block); }));
  if (queue.num_pinned() + new_pins > queue.pin_budget()) {
    detail::fail(errc::pin_budget_exceeded, "pin_prefix of ", chain.size(), " cached blocks (", new_pins,
                 " new): ", queue.num_pinned(), " of the budget of ", queue.pin_budget(), " are pinned");
  }
  for (const chain_link& link : chain) queue.pin(link.block);
  return static_cast<std::int32_t>(chain.size());
}

/// Unpins the cached blocks of the longest cached prefix of `tokens`; returns how many it unpinned.
template <pinning_cache Cache>
std::int32_t unpin_prefix(Cache& cache, std::span<const token_id> tokens, const prefix_key& key = {}) {
  std::int32_t unpinned = 0;
  for (const chain_link& link : detail::cached_chain(cache, tokens, key)) {
    if (!cache.eviction_queue().is_pinned(link.block)) continue;
    cache.eviction_queue().unpin(link.block);
    ++unpinned;
  }
  return unpinned;
}

// ---- frequency ----

/// TinyLFU's frequency filter: a count-min sketch of 4-bit counters, 4 rows of `width` (a power of
/// two), keyed by 64-bit hashes. estimate(h) never undercounts the increments of h since the last
/// aging, up to 15. After 10 * width increments every counter is halved (aging), so that past
/// popularity fades: a prefix hot an hour ago does not outrank one hot now.
class frequency_sketch {
 public:
  static constexpr std::uint32_t max_count = 15;
  static constexpr int rows = 4;

  /// Errors: invalid_argument if width is not a power of two in [1, 2^26].
  explicit frequency_sketch(std::uint32_t width) : width_(checked(width)), counters_(rows * std::size_t{width}, 0) {}

  void increment(block_hash h) noexcept {
    for (int row = 0; row < rows; ++row) {
      std::uint8_t& c = counters_[index(h, row)];
      if (c < max_count) ++c;
    }
    if (++increments_ >= 10 * std::uint64_t{width_}) age();
  }
  [[nodiscard]] std::uint32_t estimate(block_hash h) const noexcept {
    std::uint32_t least = max_count;
    for (int row = 0; row < rows; ++row) least = std::min<std::uint32_t>(least, counters_[index(h, row)]);
    return least;
  }
  /// Halves every counter.
  void age() noexcept {
    for (std::uint8_t& c : counters_) c = static_cast<std::uint8_t>(c / 2);
    increments_ = 0;
    ++agings_;
  }
  [[nodiscard]] std::uint32_t width() const noexcept { return width_; }
  [[nodiscard]] std::uint64_t agings() const noexcept { return agings_; }

 private:
  static std::uint32_t checked(std::uint32_t width) {
    if (!std::has_single_bit(width) || width > (1U << 26)) {
      detail::fail(errc::invalid_argument, "frequency_sketch width ", width, " is not a power of two in [1, 2^26]");
    }
    return width;
  }
  [[nodiscard]] std::size_t index(block_hash h, int row) const noexcept {
    // A different odd multiplier per row, then the high bits: rows index independently enough.
    static constexpr std::uint64_t multipliers[rows] = {0x9e3779b97f4a7c15ULL, 0xc2b2ae3d27d4eb4fULL,
                                                        0x165667b19e3779f9ULL, 0xd6e8feb86659fd93ULL};
    const std::uint64_t mixed = (h ^ (h >> 31)) * multipliers[row];
    return static_cast<std::size_t>(row) * width_ + static_cast<std::size_t>((mixed >> 32) & (width_ - 1));
  }

  std::uint32_t width_;
  std::vector<std::uint8_t> counters_;  // [rows, width]
  std::uint64_t increments_ = 0;
  std::uint64_t agings_ = 0;
};

/// Frequency-aware eviction with TinyLFU's filter: each time a block goes idle its hash is counted
/// in a frequency_sketch (4 x capacity rounded up to a power of two, at least 64, counters), which
/// remembers prefixes after their blocks are evicted. Victims: lowest priority first; within a
/// priority, blocks whose hash the sketch has seen only once (probation: one-off prompts, a scan)
/// before blocks seen again (protected: returning sessions, shared system prompts); least recently
/// idle first within each. A recomputed prefix that comes back is protected at once: that is what
/// the sketch buys over per-block counts, which die with the block. pinned_priority blocks are kept
/// until unpin_all, as with priority_eviction. O(log n) per operation.
struct tinylfu_eviction {
  static constexpr std::string_view name = "tinylfu";
  class queue {
   public:
    explicit queue(std::int32_t capacity)
        : order_(capacity),
          sketch_(std::bit_ceil(std::max<std::uint32_t>(64, 4 * static_cast<std::uint32_t>(capacity)))) {}

    /// Without a hash, the block id stands for the content (prefix_cache always passes the hash).
    void push(block_id id, std::int32_t priority) { push(id, priority, static_cast<block_hash>(id)); }
    void push(block_id id, std::int32_t priority, block_hash hash) {
      sketch_.increment(hash);
      order_.push(id, priority, sketch_.estimate(hash) >= 2 ? protected_segment : probation_segment);
    }
    void erase(block_id id) { order_.erase(id); }
    std::optional<block_id> pop() { return order_.pop(); }
    [[nodiscard]] bool contains(block_id id) const { return order_.contains(id); }
    [[nodiscard]] std::int32_t size() const { return order_.size(); }

    /// Whether idle block `id` is protected (its hash was seen at least twice when it went idle).
    [[nodiscard]] bool is_protected(block_id id) const { return order_.segment(id) == protected_segment; }
    [[nodiscard]] std::int32_t num_pinned() const noexcept { return order_.num_pinned(); }
    [[nodiscard]] const frequency_sketch& sketch() const noexcept { return sketch_; }
    /// Makes every pinned idle block evictable at `priority`, as priority_eviction's unpin_all,
    /// each keeping the time it went idle.
    void unpin_all(std::int32_t priority = 0) { order_.unpin_all(priority, false); }

   private:
    static constexpr std::uint8_t probation_segment = 0;
    static constexpr std::uint8_t protected_segment = 1;
    detail::priority_order<std::uint8_t> order_;
    frequency_sketch sketch_;
  };
};

namespace detail {

/// Moves the TTL clocks of an eviction queue, and of the queues it wraps, one engine step on: a
/// step_clock advances by one, a manual_clock is set to `now_seconds`; any other clock (steady
/// time) reads its own. What scheduler::schedule() calls once per step.
template <class Queue>
void tick_retention_clocks(Queue& queue, double now_seconds) {
  if constexpr (requires { queue.clock().advance(); }) {
    queue.clock().advance();
  } else if constexpr (requires { queue.clock().set(manual_clock::time_point{}); }) {
    queue.clock().set(manual_clock::time_point{manual_clock::duration{now_seconds}});
  }
  if constexpr (requires { queue.inner(); }) tick_retention_clocks(queue.inner(), now_seconds);
}

}  // namespace detail

static_assert(eviction_policy<ttl_eviction<>>);
static_assert(eviction_policy<ttl_eviction<lru_eviction, manual_clock>>);
static_assert(eviction_policy<ttl_eviction<priority_eviction, std::chrono::steady_clock>>);
static_assert(eviction_policy<pin_budget_eviction<>>);
static_assert(eviction_policy<pin_budget_eviction<priority_eviction>>);
static_assert(eviction_policy<tinylfu_eviction>);
static_assert(hashed_eviction_queue<ttl_eviction<tinylfu_eviction>::queue>);

}  // namespace pagedkv
