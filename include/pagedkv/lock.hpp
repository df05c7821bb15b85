// Lock policies: whether a pagedkv object guards its state for use from several threads.
#pragma once

#include <concepts>
#include <mutex>

namespace pagedkv {

/// A lock policy is a BasicLockable type that is default constructible.
template <class Lock>
concept lock_policy = std::default_initializable<Lock> && requires(Lock lock) {
  lock.lock();
  lock.unlock();
};

/// No locking: the caller keeps the object on one thread (the common case: one scheduler thread).
struct no_lock {
  constexpr void lock() noexcept {}
  constexpr void unlock() noexcept {}
};

/// A std::mutex around every public operation, for engines that touch a pool from several threads.
using mutex_lock = std::mutex;

static_assert(lock_policy<no_lock>);
static_assert(lock_policy<mutex_lock>);

}  // namespace pagedkv
