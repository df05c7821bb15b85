// Guard mode for the device pool, for an engine's debug builds and for tests: catches block
// tables that point at freed blocks, and tells the engine which blocks to poison on the device.
//
// pool_guard<Manager> watches a kv_cache_manager from outside: nothing to swap in, no cost when
// unused, O(device blocks + table entries) a call when used. Once per step, after schedule() and
// before the engine executes the plan:
//
//   pagedkv::pool_guard guard(scheduler.kv(), [&](std::span<const block_id> blocks) {
//     poison_blocks_on_device(blocks);  // e.g. fill their K/V with NaN
//   });
//   ... const step_plan plan = scheduler.schedule(); guard.before_step(plan); execute(plan); ...
//
// before_step(plan):
// 1. audits the pool: each device block's refcount must equal the table entries that hold it
//    plus one if the prefix cache holds it. A table entry on a block of refcount 0 is a table
//    pointing at a freed block; more holders than references is a block freed and handed out
//    again while a table still held it (use after free); fewer is a leak.
// 2. checks the plan against the manager: each batch row's block ids are its sequence's table and
//    each slot lies in the block the table has for its position (a stale plan, kept across an
//    abort or a preemption, fails here).
// 3. hands the hook every device block freed since the last call, and every block that was free
//    then and is held now (fresh, to be written by this plan's copies or forward): the engine
//    poisons them before it runs the plan, so that a kernel reading a freed block, or a fresh
//    block before the step wrote it, reads poison. A block the plan's swap_out or copies read is
//    handed over at the next call instead, if it is free then. A block freed and handed out again
//    between two calls is not poisoned: forks hand blocks to new sequences without freeing them,
//    so a change of holders alone proves nothing (the audit still catches a table left on it).
// Errors: error(no_references) for a table or plan on a freed or reused block, invalid_block for
// a leak or a plan row that disagrees with its table; the message names the block, the sequence
// and the position.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pagedkv {

template <class Manager>
class pool_guard {
 public:
  /// Overwrites the given device blocks with a poison pattern (the engine's hook).
  using poison_hook = std::function<void(std::span<const block_id>)>;

  /// Watches `manager`, which must outlive the guard. Blocks in use now count as written.
  explicit pool_guard(const Manager& manager, poison_hook poison = {})
      : manager_(manager), poison_(std::move(poison)), free_before_(snapshot()) {}

  /// The audit, the plan check and the poisoning above. Returns the blocks handed to the hook.
  std::vector<block_id> before_step(const step_plan& plan) {
    audit();
    check_plan(plan);
    return poison_changed(plan);
  }

  /// Step 1 alone: the refcount audit.
  void audit() const {
    const auto& pool = manager_.device_pool();
    std::vector<std::int32_t> holders(static_cast<std::size_t>(pool.capacity()), 0);
    std::vector<std::pair<seq_id, std::int32_t>> first_holder(holders.size(), {0, -1});
    manager_.for_each_sequence([&](seq_id seq, const block_table& table, location where) {
      if (where != location::device) return;
      const std::span<const block_id> blocks = table.blocks();
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const block_id b = checked(blocks[i], seq, static_cast<std::int32_t>(i));
        if (holders[static_cast<std::size_t>(b)]++ == 0) first_holder[static_cast<std::size_t>(b)] = {seq, static_cast<std::int32_t>(i)};
      }
      // A partial prefix hit holds its cached source block until the step that copies it is over.
      if constexpr (requires { manager_.partial_source(seq); }) {
        if (const block_id source = manager_.partial_source(seq); source != null_block) {
          if (!in_pool(source)) {
            detail::fail(errc::invalid_block, "pool guard: sequence ", seq, "'s partial hit holds source block ", source,
                         ", outside the pool of ", pool.capacity());
          }
          ++holders[static_cast<std::size_t>(source)];
        }
      }
    });
    for (block_id b = 0; b < pool.capacity(); ++b) {
      const std::int32_t tables = holders[static_cast<std::size_t>(b)];
      const std::int32_t expected = tables + (manager_.cache().contains(b) ? 1 : 0);
      const std::int32_t refs = pool.ref_count(b);
      if (refs == expected) continue;
      const auto [seq, index] = first_holder[static_cast<std::size_t>(b)];
      if (refs < expected) {
        detail::fail(errc::no_references, "pool guard: block ", b, " is held by ", tables, " table entries",
                     manager_.cache().contains(b) ? " and the prefix cache" : "", " but has ", refs,
                     " references: it was freed", refs > 0 ? " and handed out again" : "", " while sequence ", seq,
                     " still holds it at block index ", index);
      }
      detail::fail(errc::invalid_block, "pool guard: block ", b, " has ", refs, " references but only ", tables,
                   " table entries", manager_.cache().contains(b) ? " and the prefix cache" : "",
                   " hold it: a leaked reference");
    }
  }

  /// Step 2 alone: the plan's tables and slots against the manager's.
  void check_plan(const step_plan& plan) const {
    const std::int32_t block_size = manager_.block_size();
    for (std::size_t row = 0; row < plan.batch.size(); ++row) {
      const scheduled_sequence& s = plan.batch[row];
      if (!manager_.contains(s.seq)) {
        detail::fail(errc::no_references, "pool guard: the plan schedules sequence ", s.seq,
                     ", which was freed: its row's blocks may belong to others");
      }
      const block_table& table = manager_.table(s.seq);
      const std::int32_t used = (s.kv_len() + block_size - 1) / block_size;
      for (std::int32_t j = 0; j < used && plan.max_blocks_per_seq > 0; ++j) {
        const block_id in_plan = plan.block_tables.at(row * static_cast<std::size_t>(plan.max_blocks_per_seq) + static_cast<std::size_t>(j));
        const block_id in_table = j < table.num_blocks() ? table.block(j) : null_block;
        if (in_plan != in_table) {
          detail::fail(in_table == null_block || manager_.device_pool().is_free(in_plan) ? errc::no_references
                                                                                           : errc::invalid_block,
                       "pool guard: the plan's row for sequence ", s.seq, " holds block ", in_plan, " at index ", j,
                       " where its table holds ", in_table, manager_.device_pool().is_free(in_plan) ? " (block is free)" : "");
        }
      }
      for (std::int32_t t = 0; t < s.num_tokens; ++t) {
        const slot_id slot = plan.slot_mapping.at(s.slot_offset + static_cast<std::size_t>(t));
        const std::int32_t position = s.first_position + t;
        if (position >= table.num_tokens() || slot != table.slot(position)) {
          detail::fail(errc::invalid_block, "pool guard: the plan writes position ", position, " of sequence ", s.seq,
                       " to slot ", slot, ", which is not the table's slot for it");
        }
      }
    }
  }

 private:
  bool in_pool(block_id b) const { return b >= 0 && b < manager_.device_pool().capacity(); }

  block_id checked(block_id b, seq_id seq, std::int32_t index) const {
    if (!in_pool(b)) {
      detail::fail(errc::invalid_block, "pool guard: sequence ", seq, " holds block ", b, " at index ", index,
                   ", outside the pool of ", manager_.device_pool().capacity());
    }
    return b;
  }

  /// Which device blocks are free (refcount 0) now.
  std::vector<bool> snapshot() const {
    const auto& pool = manager_.device_pool();
    std::vector<bool> free(static_cast<std::size_t>(pool.capacity()));
    for (block_id b = 0; b < pool.capacity(); ++b) free[static_cast<std::size_t>(b)] = pool.is_free(b);
    return free;
  }

  std::vector<block_id> poison_changed(const step_plan& plan) {
    std::vector<bool> free_now = snapshot();
    std::vector<bool> read_by_plan(free_now.size(), false);
    for (const block_copy& c : plan.swap_out) read_by_plan.at(static_cast<std::size_t>(c.src)) = true;
    for (const block_copy& c : plan.copies) read_by_plan.at(static_cast<std::size_t>(c.src)) = true;
    std::vector<block_id> poisoned;
    std::vector<block_id> next_deferred;
    for (std::size_t b = 0; b < free_now.size(); ++b) {
      const auto id = static_cast<block_id>(b);
      const bool changed = free_now[b] ? !free_before_[b] || std::ranges::binary_search(deferred_, id)
                                       : free_before_[b] && !manager_.cache().contains(id);
      if (!changed) continue;
      if (free_now[b] && read_by_plan[b]) {
        next_deferred.push_back(id);  // the plan still reads it: poison it next time
      } else {
        poisoned.push_back(id);
      }
    }
    deferred_ = std::move(next_deferred);
    free_before_ = std::move(free_now);
    if (poison_ && !poisoned.empty()) poison_(poisoned);
    return poisoned;
  }

  const Manager& manager_;
  poison_hook poison_;
  std::vector<bool> free_before_;
  std::vector<block_id> deferred_;  ///< sorted: blocks freed before a plan that still read them
};

}  // namespace pagedkv
