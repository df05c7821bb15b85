// A separate project that tests its own policies with pagedkv's conformance kit (pagedkv::testing):
// a free list (a stack) the kit must pass, the same stack with a bug the kit must catch, and an
// admission policy run through the scheduler's property over a manager with that stack.
// Exits non-zero unless the kit ran the properties over these very policies.
#include <pagedkv/testing/conformance.hpp>
#include <pagedkv/testing/scheduler_conformance.hpp>

#include <cstdint>
#include <cstdio>
#include <iostream>
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

/// Higher priority first, then newest first: a LIFO queue within each priority.
struct priority_then_newest_admission {
  static constexpr bool before(pagedkv::admission_key a, pagedkv::admission_key b) noexcept {
    return a.priority != b.priority ? a.priority > b.priority : a.arrival > b.arrival;
  }
};

}  // namespace

int main() {
  namespace kit = pagedkv::testing;
  const kit::conformance_report good = kit::check_kv_cache_manager_conformance<stack_free_list>({.name = "stack"});
  std::cout << good;
  if (!good || good.reached.sequences < 100 || stack_free_list::pops == 0) {
    std::printf("conformance consumer: the kit did not pass the stack free list over 100 sequences "
                "(%lld sequences, %lld pops)\n",
                static_cast<long long>(good.reached.sequences), static_cast<long long>(stack_free_list::pops));
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
                                       pagedkv::kv_cache_manager<stack_free_list>>({.name = "priority, newest first"});
  std::cout << scheduled;
  if (!scheduled || scheduled.reached.cases < 100 || stack_free_list::pops == pops_before) {
    std::printf("conformance consumer: the kit did not pass the admission policy over 100 cases\n");
    return 1;
  }
  return 0;
}
