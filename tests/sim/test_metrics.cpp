#include "sim/metrics.hpp"

#include <gtest/gtest.h>

namespace pagedkv::sim {
namespace {

TEST(Metrics, BreakdownSumsToCapacityAndSplitsSaturatedSteps) {
  metrics_accumulator acc(100);
  // A saturated step: 30 live, 20 still to come, 10 never used, 40 free of which 40 stranded.
  acc.record({.live_slots = 30, .reserved_slots = 60, .future_slots = 20, .free_slots = 40,
              .unusable_free_slots = 40, .running_sequences = 3, .waiting_requests = 1});
  // A drain step: nothing waits, 10 live in 10 reserved, 1 request finishes.
  acc.record({.live_slots = 10, .reserved_slots = 10, .free_slots = 90, .running_sequences = 1,
              .finished_requests = 1});
  auto s = acc.result();
  EXPECT_EQ(s.total_steps, 2);
  EXPECT_EQ(s.finished_requests, 1);
  EXPECT_DOUBLE_EQ(s.throughput_requests_per_step, 0.5);
  EXPECT_DOUBLE_EQ(s.mean_running_sequences, 2.0);
  EXPECT_EQ(s.max_running_sequences, 3);
  EXPECT_EQ(s.peak_reserved_slots, 60);
  EXPECT_DOUBLE_EQ(s.mean_reserved_slots, 35.0);
  EXPECT_DOUBLE_EQ(s.sharing_saving, 0.0);

  EXPECT_EQ(s.saturated.steps, 1);
  EXPECT_DOUBLE_EQ(s.saturated.kv_utilization, 0.5);
  EXPECT_DOUBLE_EQ(s.saturated.live_fraction, 0.3);
  EXPECT_DOUBLE_EQ(s.saturated.future_fraction, 0.2);
  EXPECT_DOUBLE_EQ(s.saturated.internal_fraction, 0.1);
  EXPECT_DOUBLE_EQ(s.saturated.external_fraction, 0.4);
  EXPECT_DOUBLE_EQ(s.saturated.idle_fraction, 0.0);

  EXPECT_EQ(s.all.steps, 2);
  EXPECT_DOUBLE_EQ(s.all.kv_utilization, 40.0 / 70.0);
  auto& a = s.all;
  EXPECT_DOUBLE_EQ(a.live_fraction + a.future_fraction + a.internal_fraction +
                       a.external_fraction + a.idle_fraction, 1.0);
}

TEST(Metrics, SharingSavingComparesWithUnsharedReservation) {
  metrics_accumulator acc(1000);
  acc.record({.live_slots = 100, .reserved_slots = 112, .free_slots = 888, .running_sequences = 4,
              .unshared_reserved_slots = 400});
  acc.record({.live_slots = 100, .reserved_slots = 288, .free_slots = 712, .running_sequences = 4,
              .unshared_reserved_slots = 400});
  auto s = acc.result();
  EXPECT_DOUBLE_EQ(s.sharing_saving, 0.5);
  EXPECT_EQ(s.peak_unshared_reserved_slots, 400);
  EXPECT_EQ(s.peak_reserved_slots, 288);
}

TEST(Metrics, InconsistentSamplesAreRejectedAndNotRecorded) {
  metrics_accumulator acc(100);
  EXPECT_THROW(acc.record({.live_slots = 50, .reserved_slots = 40, .free_slots = 60}), error);
  EXPECT_THROW(acc.record({.live_slots = 10, .reserved_slots = 40, .free_slots = 50}), error);
  EXPECT_THROW(acc.record({.reserved_slots = 40, .free_slots = 60, .unusable_free_slots = 61}),
               error);
  EXPECT_EQ(acc.steps(), 0);
  EXPECT_THROW(metrics_accumulator{0}, error);
}

}  // namespace
}  // namespace pagedkv::sim
