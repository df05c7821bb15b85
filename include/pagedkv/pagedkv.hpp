// Umbrella header: everything in include/pagedkv/.
#pragma once

#include <pagedkv/block_pool.hpp>
#include <pagedkv/block_table.hpp>
#include <pagedkv/error.hpp>
#include <pagedkv/eviction.hpp>
#include <pagedkv/file_tier.hpp>
#include <pagedkv/free_list.hpp>
#include <pagedkv/hash.hpp>
#include <pagedkv/host_tier.hpp>
#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/kv_cache_spec.hpp>
#include <pagedkv/kv_cache_types.hpp>
#include <pagedkv/lock.hpp>
#include <pagedkv/pool_guard.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/prefix_lookup.hpp>
#include <pagedkv/prefix_store.hpp>
#include <pagedkv/retention.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/scheduler_policy.hpp>
#include <pagedkv/types.hpp>
