// block_pool against a model (a refcount per id), for every free-list policy.
#include <pagedkv/block_pool.hpp>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <vector>

namespace pagedkv {
namespace {

template <class FreeList>
void check_against_model() {
  const auto capacity = *rc::gen::inRange(1, 40);
  block_pool<FreeList> pool(capacity);
  std::map<block_id, std::int32_t> model;  // used blocks and their counts
  const auto ops = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::inRange(0, 5), rc::gen::inRange(0, 64)));
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

}  // namespace
}  // namespace pagedkv
