// block_pool against a model (a refcount per id), for every free-list policy.
#include <pagedkv/block_pool.hpp>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace pagedkv {
namespace {

template <class FreeList>
block_pool<FreeList> make_pool(std::int32_t capacity) {
  if constexpr (locality_free_list_policy<FreeList>) {
    return block_pool<FreeList>(capacity, *rc::gen::inRange(1, capacity + 1));
  } else {
    return block_pool<FreeList>(capacity);
  }
}

template <class FreeList>
void check_against_model() {
  const auto capacity = *rc::gen::inRange(1, 40);
  block_pool<FreeList> pool = make_pool<FreeList>(capacity);
  std::map<block_id, std::int32_t> model;  // used blocks and their counts
  const auto ops = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::inRange(0, 6), rc::gen::inRange(0, 64)));
  for (auto [op, arg] : ops) {
    const auto free_before = static_cast<std::int32_t>(capacity - model.size());
    switch (op) {
      case 0: {  // bulk allocate, all or nothing
        std::vector<block_id> out(static_cast<std::size_t>(arg % 6));
        const bool ok = pool.try_allocate(out);
        RC_ASSERT(ok == (static_cast<std::int32_t>(out.size()) <= free_before));
        if (ok) {
          for (block_id id : out) RC_ASSERT(model.emplace(id, 1).second);  // never handed out twice
        }
        break;
      }
      case 1:
      case 2: {  // retain or release a used block
        if (model.empty()) break;
        auto it = std::next(model.begin(), arg % static_cast<int>(model.size()));
        if (op == 1) {
          pool.retain(it->first);
          ++it->second;
        } else {
          const bool freed = pool.release(it->first);
          RC_ASSERT(freed == (--it->second == 0));
          if (freed) model.erase(it);
        }
        break;
      }
      case 3: {  // release of a free block is refused and changes nothing
        const block_id id = arg % capacity;
        if (model.contains(id)) break;
        try {
          pool.release(id);
          RC_FAIL("double free accepted");
        } catch (const error& e) {
          RC_ASSERT(e.code() == errc::no_references);
        }
        break;
      }
      case 5: {  // bulk allocate near a hint (any block, or none), all or nothing
        std::vector<block_id> out(static_cast<std::size_t>(arg % 6));
        const block_id hint = arg % (capacity + 1) == capacity ? null_block : arg % (capacity + 1);
        const bool ok = pool.try_allocate_near(out, hint);
        RC_ASSERT(ok == (static_cast<std::int32_t>(out.size()) <= free_before));
        if (ok) {
          for (block_id id : out) RC_ASSERT(model.emplace(id, 1).second);
        }
        break;
      }
      default: {  // bulk release of everything in one call
        std::vector<block_id> all;
        for (auto& [id, count] : model) all.insert(all.end(), static_cast<std::size_t>(count), id);
        pool.release(all);
        model.clear();
      }
    }
    RC_ASSERT(pool.num_free_blocks() == capacity - static_cast<std::int32_t>(model.size()));
    for (block_id id = 0; id < capacity; ++id) {
      const auto it = model.find(id);
      RC_ASSERT(pool.ref_count(id) == (it == model.end() ? 0 : it->second));
    }
  }
}

RC_GTEST_PROP(BlockPoolProperty, LifoMatchesModel, ()) { check_against_model<lifo_free_list>(); }
RC_GTEST_PROP(BlockPoolProperty, FifoMatchesModel, ()) { check_against_model<fifo_free_list>(); }
RC_GTEST_PROP(BlockPoolProperty, LruMatchesModel, ()) { check_against_model<lru_free_list>(); }
RC_GTEST_PROP(BlockPoolProperty, ExtentMatchesModel, ()) { check_against_model<extent_free_list>(); }

// Where extent_free_list puts a block, against a model of which blocks are free: near a hint, in
// the hint's extent while it has a free block, else in a wholly free extent while there is one,
// else in the partly free one with the most free blocks; without one (pop), in the partly free
// extent with the fewest while there is one; always the lowest free id of the extent it chose.
RC_GTEST_PROP(BlockPoolProperty, ExtentChoiceMatchesModel, ()) {
  // Up to 300 blocks: extents of more than 64 and 128 take several words of bits and counts.
  const auto capacity =
      *rc::gen::weightedOneOf<std::int32_t>({{3, rc::gen::inRange(1, 48)}, {1, rc::gen::inRange(48, 300)}});
  const auto extent = *rc::gen::inRange(1, capacity + 1);
  block_pool<extent_free_list> pool(capacity, extent);
  std::vector<bool> used(static_cast<std::size_t>(capacity), false);
  const auto extent_of = [&](block_id id) { return id / extent; };
  const auto free_in = [&](std::int32_t e) {
    std::int32_t n = 0;
    for (block_id id = e * extent; id < std::min(capacity, (e + 1) * extent); ++id) n += used[id] ? 0 : 1;
    return n;
  };
  const auto blocks_in = [&](std::int32_t e) { return std::min(capacity, (e + 1) * extent) - e * extent; };
  const std::int32_t extents = (capacity + extent - 1) / extent;
  const auto ops = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::inRange(0, 3), rc::gen::inRange(-1, 512)));
  for (auto [op, arg] : ops) {
    if (op == 2) {  // release a used block
      std::vector<block_id> in_use;
      for (block_id id = 0; id < capacity; ++id)
        if (used[id]) in_use.push_back(id);
      if (in_use.empty()) continue;
      const block_id id = in_use[static_cast<std::size_t>(arg + 1) % in_use.size()];
      pool.release(id);
      used[id] = false;
      continue;
    }
    if (pool.num_free_blocks() == 0) continue;
    bool any_whole = false;
    std::int32_t fewest = capacity, most = 0;  // free blocks of the partly free extents
    for (std::int32_t e = 0; e < extents; ++e) {
      any_whole |= free_in(e) == blocks_in(e);
      if (free_in(e) > 0 && free_in(e) < blocks_in(e)) {
        fewest = std::min(fewest, free_in(e));
        most = std::max(most, free_in(e));
      }
    }
    const bool any_open = most > 0;
    const block_id hint = op == 0 || arg < 0 ? null_block : arg % capacity;
    const block_id got = op == 0 ? pool.allocate() : pool.allocate_near(hint);
    RC_ASSERT(!used[got]);
    const std::int32_t e = extent_of(got);
    if (hint != null_block && free_in(extent_of(hint)) > 0) {
      RC_ASSERT(e == extent_of(hint));
    } else if (op == 1 ? any_whole : !any_open) {
      RC_ASSERT(free_in(e) == blocks_in(e));
    } else {
      RC_ASSERT(free_in(e) == (op == 1 ? most : fewest));
      RC_ASSERT(free_in(e) < blocks_in(e));
    }
    for (block_id id = e * extent; id < got; ++id) RC_ASSERT(used[id]);  // the lowest free id
    used[got] = true;
  }
}

}  // namespace
}  // namespace pagedkv
