// A small persistent pool for the CPU model: num_threads - 1 workers wait on a condition variable,
// run() hands them the indices of one parallel loop and the calling thread takes part. Kept
// because waking parked workers costs less than starting threads in each of a step's layers (the
// numbers are in docs/design.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

namespace pagedkv::llama {

class thread_pool {
 public:
  /// num_threads threads in all, the caller of run() included; values below 1 count as 1.
  explicit thread_pool(std::int32_t num_threads) {
    for (std::int32_t i = 1; i < num_threads; ++i)
      workers_.emplace_back([this](std::stop_token stop) { work(stop); });
  }
  ~thread_pool() {
    for (auto& worker : workers_) worker.request_stop();
    wake_.notify_all();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  [[nodiscard]] std::int32_t size() const noexcept { return std::int32_t(workers_.size()) + 1; }

  /// Runs task(i) for every i in [0, num_tasks) over the pool's threads; returns when all are
  /// done. The first exception a task throws is rethrown here, after the others finished.
  /// One run() at a time.
  void run(std::int32_t num_tasks, const std::function<void(std::int32_t)>& task) {
    {
      std::lock_guard lock(mutex_);
      task_ = &task;
      num_tasks_ = num_tasks;
      next_task_ = 0;
      busy_workers_ = std::int32_t(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    take_tasks();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return busy_workers_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(std::stop_token stop) {
    std::uint64_t seen = 0;
    while (true) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, stop, [&] { return generation_ != seen; });
        if (stop.stop_requested()) return;
        seen = generation_;
      }
      take_tasks();
      std::lock_guard lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }

  void take_tasks() {
    while (true) {
      std::int32_t i;
      {
        std::lock_guard lock(mutex_);
        if (next_task_ >= num_tasks_) return;
        i = next_task_++;
      }
      try {
        (*task_)(i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::condition_variable done_;
  const std::function<void(std::int32_t)>* task_ = nullptr;
  std::int32_t num_tasks_ = 0;
  std::int32_t next_task_ = 0;
  std::int32_t busy_workers_ = 0;
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
  std::vector<std::jthread> workers_;  // last: stopped and joined before the members they use go
};

}  // namespace pagedkv::llama
