// The CPU runner's thread pool (examples/llama/thread_pool.hpp), here rather than in tests/runner
// so that the TSan build, which leaves the examples out, runs it where its threads meet.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "thread_pool.hpp"

namespace {

using pagedkv::llama::thread_pool;

TEST(ThreadPool, RunsEveryTaskOnceAcrossManyRuns) {
  for (const std::int32_t threads : {0, 1, 2, 4}) {
    thread_pool pool(threads);
    EXPECT_EQ(pool.size(), threads < 1 ? 1 : threads);
    for (const std::int32_t tasks : {0, 1, 3, 64, 1000}) {
      std::vector<std::int32_t> hits(std::size_t(tasks), 0);  // each task writes only its own slot
      pool.run(tasks, [&](std::int32_t i) { ++hits[std::size_t(i)]; });
      EXPECT_EQ(hits, std::vector<std::int32_t>(std::size_t(tasks), 1)) << threads << " threads, " << tasks << " tasks";
    }
  }
}

TEST(ThreadPool, RethrowsATaskErrorAfterTheOthersFinished) {
  thread_pool pool(3);
  std::atomic<std::int32_t> finished = 0;
  EXPECT_THROW(pool.run(100,
                        [&](std::int32_t i) {
                          if (i == 17) throw std::runtime_error("task 17");
                          ++finished;
                        }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 99);
  // The pool is usable after an error, and the error does not come back.
  std::atomic<std::int32_t> again = 0;
  pool.run(10, [&](std::int32_t) { ++again; });
  EXPECT_EQ(again.load(), 10);
}

}  // namespace
