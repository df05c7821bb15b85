// The runs of the trace sweep (trace_sweep.hpp): the runtime free list and eviction policy become
// template arguments here, once, for pagedkv-sim and the tests.
#include "sim/trace_sweep.hpp"

#include <pagedkv/eviction.hpp>
#include <pagedkv/free_list.hpp>
#include <pagedkv/host_tier.hpp>
#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/retention.hpp>

namespace pagedkv::sim {
namespace {

template <free_list_policy FreeList, eviction_policy DeviceEviction, eviction_policy TierEviction = DeviceEviction>
summary run_with(const trace& requests, const paged_config& point, const progress_fn& report) {
  return run_paged<kv_cache_manager<FreeList, xxh3_hash, DeviceEviction>, host_prefix_tier<TierEviction>>(
      requests, point, report);
}

template <free_list_policy FreeList>
summary run_with(eviction_choice eviction, const trace& requests, const paged_config& point,
                 const progress_fn& report) {
  switch (eviction) {
    case eviction_choice::lru: return run_with<FreeList, lru_eviction>(requests, point, report);
    case eviction_choice::priority: return run_with<FreeList, priority_eviction>(requests, point, report);
    case eviction_choice::tinylfu: return run_with<FreeList, tinylfu_eviction>(requests, point, report);
    case eviction_choice::ttl: break;
  }
  return run_with<FreeList, lru_eviction, ttl_eviction<lru_eviction, step_clock>>(requests, point, report);
}

}  // namespace

summary run_sweep_point(free_list_choice free_list, eviction_choice eviction, const trace& requests,
                        const paged_config& point, const progress_fn& report) {
  switch (free_list) {
    case free_list_choice::lifo: return run_with<lifo_free_list>(eviction, requests, point, report);
    case free_list_choice::fifo: return run_with<fifo_free_list>(eviction, requests, point, report);
    case free_list_choice::extent: break;
  }
  return run_with<extent_free_list>(eviction, requests, point, report);
}

summary run_hybrid_sweep_point(const trace& requests, const paged_config& point, const progress_fn& report) {
  return run_paged<hybrid_kv_cache_manager<>>(requests, point, report);
}

}  // namespace pagedkv::sim
