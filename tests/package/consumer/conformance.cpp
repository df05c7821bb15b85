// A separate project that tests its own policies with pagedkv's conformance kit (pagedkv::testing):
// a free list (a stack) and an eviction policy (FIFO with a twist) the kit must pass together, the
// same stack with a bug the kit must catch, and an admission policy run through the scheduler's
// property over a manager with that stack and FIFO. Exits non-zero unless the kit ran the
// properties over these very policies.
#include <pagedkv/testing/conformance.hpp>
#include <pagedkv/testing/scheduler_conformance.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

/// A fixed array and a top index; counts its pops so that the test can see the kit used it.
struct stack_free_list {
  inline static std::int64_t pops = 0;
  class list {
   public:
    explicit list(std::int32_t capacity) : ids_(static_cast<std::size_t>(capacity)) {}
    void push(pagedkv::block_id id) { ids_[static_cast<std::size_t>(top_++)] = id; }
    pagedkv::block_id pop() {
      ++pops;
      return ids_[static_cast<std::size_t>(--top_)];
    }
    [[nodiscard]] std::int32_t size() const noexcept { return top_; }

   private:
    std::vector<pagedkv::block_id> ids_;
    std::int32_t top_ = 0;
  };
};

/// The same stack with an off-by-one pop: it hands out the block below the top, which stays on
/// the list and is handed out again while in use.
struct off_by_one_stack_free_list {
  class list {
   public:
    explicit list(std::int32_t capacity) : ids_(static_cast<std::size_t>(capacity)) {}
    void push(pagedkv::block_id id) { ids_[static_cast<std::size_t>(top_++)] = id; }
    pagedkv::block_id pop() {
      --top_;
      return ids_[static_cast<std::size_t>(top_ > 0 ? top_ - 1 : 0)];
    }
    [[nodiscard]] std::int32_t size() const noexcept { return top_; }

   private:
    std::vector<pagedkv::block_id> ids_;
    std::int32_t top_ = 0;
  };
};

/// FIFO with a twist: the oldest idle block goes first, but a block that went idle twice since it
/// was cached (a prefix that came back) waits in a second FIFO that is evicted only when the first
/// is empty. Priorities are ignored. Counts its evictions so that the test can see the kit used it.
struct fifo_sparing_reused_eviction {
  inline static std::int64_t pops = 0;
  class queue {
   public:
    explicit queue(std::int32_t capacity) : uses_(static_cast<std::size_t>(capacity), 0) {}
    void push(pagedkv::block_id id, std::int32_t /*priority*/) {
      auto& uses = uses_[static_cast<std::size_t>(id)];
      uses = uses < 2 ? uses + 1 : uses;
      (uses >= 2 ? reused_ : fresh_).push_back(id);
    }
    void erase(pagedkv::block_id id) {
      std::erase(fresh_, id);
      std::erase(reused_, id);
    }
    std::optional<pagedkv::block_id> pop() {
      std::deque<pagedkv::block_id>& q = fresh_.empty() ? reused_ : fresh_;
      if (q.empty()) return std::nullopt;
      const pagedkv::block_id id = q.front();
      q.pop_front();
      uses_[static_cast<std::size_t>(id)] = 0;  // evicted: the id will hold other content
      ++pops;
      return id;
    }
    /// The block left the cache some other way (a reset): its count starts over too.
    void forget(pagedkv::block_id id) { uses_[static_cast<std::size_t>(id)] = 0; }
    [[nodiscard]] bool contains(pagedkv::block_id id) const {
      return std::ranges::find(fresh_, id) != fresh_.end() || std::ranges::find(reused_, id) != reused_.end();
    }
    [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(fresh_.size() + reused_.size()); }

   private:
    std::vector<std::uint8_t> uses_;  // times each cached block went idle, up to 2
    std::deque<pagedkv::block_id> fresh_, reused_;
  };
};

/// Higher priority first, then newest first: a LIFO queue within each priority.
struct priority_then_newest_admission {
  static constexpr bool before(pagedkv::admission_key a, pagedkv::admission_key b) noexcept {
    return a.priority != b.priority ? a.priority > b.priority : a.arrival > b.arrival;
  }
};

}  // namespace

int main() {
  namespace kit = pagedkv::testing;
  using fifo = fifo_sparing_reused_eviction;
  const kit::conformance_report good =
      kit::check_kv_cache_manager_conformance<stack_free_list, pagedkv::xxh3_hash, fifo>({.name = "stack, FIFO"});
  std::cout << good;
  if (!good || good.reached.sequences < 100 || stack_free_list::pops == 0 || fifo::pops == 0) {
    std::printf("conformance consumer: the kit did not pass the stack free list and the FIFO over 100 sequences "
                "(%lld sequences, %lld pops, %lld evictions)\n",
                static_cast<long long>(good.reached.sequences), static_cast<long long>(stack_free_list::pops),
                static_cast<long long>(fifo::pops));
    return 1;
  }
  const kit::conformance_report broken =
      kit::check_kv_cache_manager_conformance<off_by_one_stack_free_list, pagedkv::xxh3_hash, pagedkv::priority_eviction>(
          {.name = "off-by-one stack"});
  if (broken.property_held || broken.counterexample.empty()) {
    std::cout << broken << "conformance consumer: the kit passed a free list that hands out used blocks\n";
    return 1;
  }
  std::cout << broken.name << ": caught, as it must be: " << broken.counterexample.substr(0, broken.counterexample.find('\n'))
            << '\n';
  const std::int64_t pops_before = stack_free_list::pops;
  const kit::scheduler_conformance_report scheduled =
      kit::check_scheduler_conformance<priority_then_newest_admission, pagedkv::preempt_by_swap,
                                       pagedkv::kv_cache_manager<stack_free_list, pagedkv::xxh3_hash, fifo>>(
          {.name = "priority, newest first"});
  std::cout << scheduled;
  if (!scheduled || scheduled.reached.cases < 100 || stack_free_list::pops == pops_before) {
    std::printf("conformance consumer: the kit did not pass the admission policy over 100 cases\n");
    return 1;
  }
  return 0;
}
