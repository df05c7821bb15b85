// The tensor-parallel backend's threads (cuda/tp_backend.hpp), apart from CUDA and NCCL so that
// their failure handling is tested on any machine: one worker thread per rank, each job run on
// every rank at once, and the first failure or a deadline answered by one abort call (which, in
// the backend, makes NCCL's pending collectives return) before the ranks are waited for.
//
//   rank_group group(2, [](std::int32_t r) { cudaSetDevice(r); });
//   if (const auto f = group.run(job, 120.0, [&] { abort_all(); })) throw ...;  // f->rank, f->what
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pagedkv::llama {

class rank_group {
 public:
  /// How a run ended that did not end with every rank returning normally.
  struct failure {
    std::int32_t rank = -1;     ///< the first rank whose job threw before the abort; -1: the deadline passed
    std::string what;           ///< its exception's what(), or empty
    bool all_returned = false;  ///< every job returned within the grace period after the abort
  };

  /// Starts `ranks` workers; worker r runs start(r) first (its exception is rethrown by every job).
  rank_group(std::int32_t ranks, std::function<void(std::int32_t)> start) {
    for (std::int32_t r = 0; r < ranks; ++r) workers_.push_back(std::make_unique<worker>(r, start));
  }
  ~rank_group() = default;  // each worker finishes its job, if any, and is joined
  rank_group(const rank_group&) = delete;
  rank_group& operator=(const rank_group&) = delete;

  [[nodiscard]] std::int32_t size() const noexcept { return std::int32_t(workers_.size()); }

  /// Runs job(r) on every worker r and waits. nullopt when all returned within timeout_s. Else,
  /// at the first exception or at the deadline, calls abort() once, waits up to grace_s for the
  /// jobs to return, and says which rank failed. `job` must stay valid until the jobs return; a
  /// group whose jobs did not return must be abandon()ed, not destroyed.
  std::optional<failure> run(const std::function<void(std::int32_t)>& job, double timeout_s,
                             const std::function<void()>& abort, double grace_s = 30.0) {
    const auto state = std::make_shared<progress>();
    const std::size_t n = workers_.size();
    for (std::size_t r = 0; r < n; ++r) workers_[r]->post(job, state);
    std::unique_lock lock(state->mutex);
    const bool settled = state->changed.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                                 [&] { return state->done == n || state->first_failed >= 0; });
    if (settled && state->first_failed < 0) return std::nullopt;
    failure f{.rank = state->first_failed, .what = state->first_error};
    lock.unlock();
    abort();
    lock.lock();
    f.all_returned = state->changed.wait_for(lock, std::chrono::duration<double>(grace_s), [&] { return state->done == n; });
    return f;
  }

  /// Leaves every worker thread running, unowned (for jobs that never returned: the process is
  /// ending); the group is then safe to destroy.
  void abandon() {
    for (auto& w : workers_) w.release()->detach();
    workers_.clear();
  }

 private:
  struct progress {
    std::mutex mutex;
    std::condition_variable changed;
    std::size_t done = 0;
    std::int32_t first_failed = -1;
    std::string first_error;
  };

  class worker {
   public:
    worker(std::int32_t rank, const std::function<void(std::int32_t)>& start)
        : rank_(rank), thread_([this, start] { loop(start); }) {}
    ~worker() {
      {
        const std::lock_guard lock(mutex_);
        stop_ = true;
      }
      wake_.notify_one();
      if (thread_.joinable()) thread_.join();
    }
    void post(const std::function<void(std::int32_t)>& job, std::shared_ptr<progress> state) {
      {
        const std::lock_guard lock(mutex_);
        job_ = &job;
        state_ = std::move(state);
      }
      wake_.notify_one();
    }
    void detach() { thread_.detach(); }  // the worker object is leaked with it: the thread uses it

   private:
    void loop(const std::function<void(std::int32_t)>& start) {
      std::exception_ptr start_error;
      try {
        start(rank_);
      } catch (...) {
        start_error = std::current_exception();
      }
      for (;;) {
        const std::function<void(std::int32_t)>* job = nullptr;
        std::shared_ptr<progress> state;
        {
          std::unique_lock lock(mutex_);
          wake_.wait(lock, [&] { return stop_ || job_; });
          if (!job_) return;  // stopped with nothing to do
          job = std::exchange(job_, nullptr);
          state = std::move(state_);
        }
        std::exception_ptr error = start_error;
        std::string what;
        if (!error) {
          try {
            (*job)(rank_);
          } catch (...) {
            error = std::current_exception();
          }
        }
        if (error) {
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
            what = "an exception of unknown type";
          }
        }
        const std::lock_guard lock(state->mutex);
        ++state->done;
        if (error && state->first_failed < 0) {
          state->first_failed = rank_;
          state->first_error = what;
        }
        state->changed.notify_all();
      }
    }

    std::int32_t rank_;
    std::mutex mutex_;
    std::condition_variable wake_;
    const std::function<void(std::int32_t)>* job_ = nullptr;
    std::shared_ptr<progress> state_;
    bool stop_ = false;
    std::thread thread_;  // last: starts once the members above exist
  };

  std::vector<std::unique_ptr<worker>> workers_;
};

}  // namespace pagedkv::llama
