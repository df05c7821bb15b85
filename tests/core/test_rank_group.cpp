// The tensor-parallel backend's threads (examples/llama/rank_group.hpp) without GPUs: a job runs
// once on every rank's own thread; a rank that throws while the others wait for it (as NCCL's
// collectives wait for a missing peer) is answered by one abort, which releases them; a rank that
// hangs is aborted at the deadline; a rank that ignores the abort is reported, and the group
// abandoned. Threads meet: run under TSan too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "rank_group.hpp"

namespace {

using pagedkv::llama::rank_group;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// What a collective does for a rank whose peer never comes: waits until the abort.
void wait_for(const std::atomic<bool>& flag) {
  while (!flag.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(RankGroup, RunsEachJobOnceOnEveryRanksOwnThread) {
  std::vector<std::thread::id> started(4);
  rank_group group(4, [&](std::int32_t r) { started[std::size_t(r)] = std::this_thread::get_id(); });
  ASSERT_EQ(group.size(), 4);
  std::vector<int> runs(4, 0);
  for (int step = 0; step < 200; ++step) {
    std::vector<std::thread::id> ran(4);
    const auto f = group.run([&](std::int32_t r) {
      ++runs[std::size_t(r)];
      ran[std::size_t(r)] = std::this_thread::get_id();
    }, 10.0, [] { FAIL() << "no abort when every rank returns"; });
    ASSERT_FALSE(f.has_value());
    EXPECT_EQ(ran, started) << "rank r's jobs run on the thread that ran start(r)";
  }
  EXPECT_EQ(runs, std::vector<int>(4, 200));
  EXPECT_EQ(std::set<std::thread::id>(started.begin(), started.end()).size(), 4u);
}

TEST(RankGroup, AThrowingRankIsAnsweredByOneAbortThatReleasesTheOthers) {
  rank_group group(3, [](std::int32_t) {});
  std::atomic<bool> aborted{false};
  std::atomic<int> aborts{0};
  const auto start = clock_type::now();
  const auto f = group.run([&](std::int32_t r) {
    if (r == 1) throw std::runtime_error("rank 1 broke");
    wait_for(aborted);  // ranks 0 and 2 wait in a "collective" for rank 1
  }, 60.0, [&] {
    ++aborts;
    aborted = true;
  });
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->what, "rank 1 broke");
  EXPECT_TRUE(f->all_returned);
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_LT(seconds_since(start), 30.0) << "the failure, not the 60 s deadline, ended the run";
  // The group still runs jobs afterwards (the backend refuses to; the group itself is sound).
  EXPECT_FALSE(group.run([](std::int32_t) {}, 10.0, [] {}).has_value());
}

TEST(RankGroup, AHungRankIsAbortedAtTheDeadline) {
  rank_group group(2, [](std::int32_t) {});
  std::atomic<bool> aborted{false};
  const auto start = clock_type::now();
  const auto f = group.run([&](std::int32_t r) {
    wait_for(aborted);  // rank 1 hangs; rank 0 waits for it
    if (r == 1) throw std::runtime_error("released by the abort");
  }, 0.2, [&] { aborted = true; });
  const double took = seconds_since(start);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, -1) << "no rank failed before the deadline: " << f->what;
  EXPECT_TRUE(f->all_returned);
  EXPECT_GE(took, 0.2);
  EXPECT_LT(took, 20.0);
}

TEST(RankGroup, ARankThatIgnoresTheAbortIsReportedAndAbandoned) {
  auto group = std::make_unique<rank_group>(2, [](std::int32_t) {});
  // Shared ownership: the abandoned thread may outlive this test's frame.
  const auto release = std::make_shared<std::atomic<bool>>(false);
  const auto finished = std::make_shared<std::atomic<bool>>(false);
  const std::function<void(std::int32_t)> job = [release, finished](std::int32_t r) {
    if (r != 0) return;
    wait_for(*release);
    *finished = true;
  };
  const auto f = group->run(job, 0.05, [] {}, 0.1);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, -1);
  EXPECT_FALSE(f->all_returned);
  group->abandon();
  group.reset();
  *release = true;  // lets the stuck job end (before `job` goes); its worker then waits for ever
  wait_for(*finished);
}

TEST(RankGroup, AStartThatThrowsFailsEveryJobOfThatRank) {
  rank_group group(2, [](std::int32_t r) {
    if (r == 1) throw std::runtime_error("no GPU 1");
  });
  const auto f = group.run([](std::int32_t) {}, 10.0, [] {});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->what, "no GPU 1");
}

}  // namespace
