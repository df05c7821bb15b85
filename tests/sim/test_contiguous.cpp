#include "sim/contiguous.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>

namespace pagedkv::sim {
namespace {

request make_request(std::uint64_t id, std::int32_t prompt_len, std::int32_t output_len,
                     std::int32_t max_output_len = 0, std::int64_t arrival = 0,
                     std::int32_t samples = 1) {
  request r;
  r.id = id;
  r.arrival_step = arrival;
  r.prompt.assign(static_cast<std::size_t>(prompt_len), 7);
  r.output_len = output_len;
  r.max_output_len = std::max(max_output_len, output_len);
  r.num_samples = samples;
  return r;
}

TEST(Contiguous, ReservationPerPolicy) {
  auto r = make_request(0, 100, 30, 500);
  EXPECT_EQ(reservation_slots(r, reservation_policy::max_length), 600);
  EXPECT_EQ(reservation_slots(r, reservation_policy::exact), 130);
  EXPECT_EQ(reservation_slots(r, reservation_policy::power_of_two), 256);
  EXPECT_EQ(reservation_slots(r, reservation_policy::pow2_output), 132);
  r.output_len = 28;
  EXPECT_EQ(reservation_slots(r, reservation_policy::power_of_two), 128);
  EXPECT_EQ(reservation_slots(r, reservation_policy::pow2_output), 132);
}

// Buddy placement rounds every range up: an exact reservation of 7 slots holds 8.
TEST(Contiguous, BuddyPlacementRoundsReservationsUp) {
  trace requests{make_request(0, 3, 4)};
  buddy_contiguous_simulator sim(requests, reservation_policy::exact, {.capacity_slots = 16});
  auto s = sim.run();
  EXPECT_EQ(s.peak_reserved_slots, 8);
  EXPECT_DOUBLE_EQ(s.all.kv_utilization, 22.0 / 32.0);
  EXPECT_DOUBLE_EQ(s.all.internal_fraction, 4.0 / 64.0);
}

// One request, prompt 3, output 4: live slots are 4, 5, 6, 7 over its 4 steps.
TEST(Contiguous, SingleRequestUtilizationByHand) {
  trace requests{make_request(0, 3, 4, 10)};
  for (auto [policy, reserved] : {std::pair{reservation_policy::exact, 7},
                                  std::pair{reservation_policy::power_of_two, 8},
                                  std::pair{reservation_policy::max_length, 13}}) {
    contiguous_simulator sim(requests, policy, {.capacity_slots = 16});
    auto s = sim.run();
    EXPECT_EQ(s.total_steps, 4);
    EXPECT_EQ(s.finished_requests, 1);
    EXPECT_DOUBLE_EQ(s.all.kv_utilization, 22.0 / (4.0 * reserved)) << to_string(policy);
    EXPECT_DOUBLE_EQ(s.all.future_fraction, (3 + 2 + 1 + 0) / 64.0);
    EXPECT_DOUBLE_EQ(s.all.internal_fraction, 4.0 * (reserved - 7) / 64.0);
    EXPECT_EQ(s.peak_reserved_slots, reserved);
    EXPECT_EQ(sim.finished()[0].tokens_per_sequence, std::vector<std::int32_t>{4});
  }
}

// A hole pattern where 8 slots are free but no 7-slot range exists: the refusal is counted as
// external fragmentation, and the request gets in once the middle range goes.
TEST(Contiguous, ExternalFragmentationIsMeasured) {
  trace requests{make_request(0, 2, 2), make_request(1, 1, 5), make_request(2, 2, 2),
                 make_request(3, 3, 4)};
  contiguous_simulator sim(requests, reservation_policy::exact, {.capacity_slots = 14});
  sim.step();  // A [0,4), B [4,10), C [10,14); D waits
  sim.step();  // A and C finish: [0,4) and [10,14) free
  EXPECT_EQ(sim.allocator().free_slots(), 8);
  EXPECT_EQ(sim.allocator().largest_free_extent(), 4);
  sim.step();  // D (7 slots) refused with 8 free: stranded
  EXPECT_EQ(sim.num_waiting(), 1U);
  auto s = sim.run();
  EXPECT_EQ(s.finished_requests, 4);
  EXPECT_EQ(sim.finished().back().admitted_step, 5);  // after B's last step (4)
  // Steps 2, 3 and 4 strand 8 of 14 slots; steps 0 and 1 waited on a plain shortage.
  EXPECT_EQ(s.saturated.steps, 5);
  EXPECT_DOUBLE_EQ(s.saturated.external_fraction, 3 * 8 / (5 * 14.0));
}

TEST(Contiguous, GroupsReserveOneRangePerSequenceAllOrNothing) {
  trace requests{make_request(0, 4, 4, 0, 0, 3), make_request(1, 4, 4, 0, 0, 3)};
  contiguous_simulator sim(requests, reservation_policy::exact, {.capacity_slots = 40});
  sim.step();
  EXPECT_EQ(sim.running().size(), 3U);  // the second group needs 24 slots, 16 are free
  EXPECT_EQ(sim.allocator().allocated_slots(), 24);
  auto s = sim.run();
  EXPECT_EQ(s.total_steps, 8);
  for (const auto& f : sim.finished()) EXPECT_EQ(f.tokens_per_sequence, std::vector<std::int32_t>(3, 4));
}

TEST(Contiguous, UnrunnableRequestsAreRejectedUpFront) {
  trace too_big{make_request(0, 10, 10)};
  EXPECT_THROW(contiguous_simulator(too_big, reservation_policy::exact, {.capacity_slots = 19}),
               error);
  trace long_prompt{make_request(0, 100, 1)};
  EXPECT_THROW(contiguous_simulator(long_prompt, reservation_policy::exact,
                                    {.capacity_slots = 1000, .max_running_sequences = 8,
                                     .max_tokens_per_step = 99}),
               error);
  // Every running sequence must be able to decode each step.
  trace fine{make_request(0, 4, 4)};
  EXPECT_THROW(contiguous_simulator(fine, reservation_policy::exact,
                                    {.capacity_slots = 100, .max_running_sequences = 64,
                                     .max_tokens_per_step = 32}),
               error);
  EXPECT_NO_THROW(contiguous_simulator(fine, reservation_policy::exact,
                                       {.capacity_slots = 100, .max_running_sequences = 32,
                                        .max_tokens_per_step = 32}));
}

// Invariants over random traces and limits: memory never over capacity and equal to the running
// reservations, the sequence limit and token budget hold, and every request finishes exactly once
// with exactly its output length on every sequence, output_len steps after admission.
template <class Simulator>
void check_invariants() {
  const auto policy = *rc::gen::element(reservation_policy::max_length, reservation_policy::exact,
                                        reservation_policy::power_of_two,
                                        reservation_policy::pow2_output);
  scheduler_limits limits{.capacity_slots = *rc::gen::inRange<std::int64_t>(64, 400),
                          .max_running_sequences = *rc::gen::inRange(1, 12),
                          .max_tokens_per_step = *rc::gen::inRange(32, 80)};
  const auto count = *rc::gen::inRange(1, 30);
  trace requests;
  std::int64_t arrival = 0;
  for (int i = 0; i < count; ++i) {
    arrival += *rc::gen::inRange(0, 4);
    auto prompt = *rc::gen::inRange(1, 32);
    auto output = *rc::gen::inRange(1, 20);
    auto samples = *rc::gen::inRange(1, std::min(limits.max_running_sequences, 3) + 1);
    auto r = make_request(static_cast<std::uint64_t>(i), prompt, output,
                          output + *rc::gen::inRange(0, 10), arrival, samples);
    RC_PRE(Simulator::allocator_type::size_for(reservation_slots(r, policy)) * samples <=
           limits.capacity_slots);
    requests.push_back(r);
  }

  Simulator sim(requests, policy, limits);
  std::int64_t steps = 0;
  while (!sim.done()) {
    sim.step();
    RC_ASSERT(++steps < 100000);
    std::int64_t reserved = 0, new_prompt_tokens = 0, decodes = 0;
    std::map<std::size_t, bool> new_groups;
    for (const auto& seq : sim.running()) {
      reserved += seq.reserved;
      RC_ASSERT(seq.reserved == Simulator::allocator_type::size_for(
                                    reservation_slots(requests[seq.request_index], policy)));
      if (seq.generated == 1) {
        new_groups[seq.request_index] = true;
      } else {
        ++decodes;
      }
    }
    for (auto [index, _] : new_groups) new_prompt_tokens += requests[index].prompt_len();
    RC_ASSERT(reserved == sim.allocator().allocated_slots());
    RC_ASSERT(reserved <= limits.capacity_slots);
    RC_ASSERT(std::ssize(sim.running()) <= limits.max_running_sequences);
    RC_ASSERT(decodes + new_prompt_tokens <= limits.max_tokens_per_step);
  }
  RC_ASSERT(sim.allocator().free_slots() == limits.capacity_slots);
  RC_ASSERT(sim.finished().size() == requests.size());
  std::vector<bool> seen(requests.size(), false);
  for (const auto& f : sim.finished()) {
    const auto& r = requests[f.id];
    RC_ASSERT(!seen[f.id]);
    seen[f.id] = true;
    RC_ASSERT(std::ssize(f.tokens_per_sequence) == r.num_sequences());
    for (auto tokens : f.tokens_per_sequence) RC_ASSERT(tokens == r.output_len);
    RC_ASSERT(f.finished_step - f.admitted_step + 1 == r.output_len);
    RC_ASSERT(f.admitted_step >= r.arrival_step);
  }
  auto s = sim.result();
  RC_ASSERT(s.finished_requests == std::ssize(requests));
  RC_ASSERT(s.preemptions == 0);
}

RC_GTEST_PROP(ContiguousProperty, InvariantsHoldFirstFit, ()) {
  check_invariants<contiguous_simulator>();
}

RC_GTEST_PROP(ContiguousProperty, InvariantsHoldBuddy, ()) {
  check_invariants<buddy_contiguous_simulator>();
}

}  // namespace
}  // namespace pagedkv::sim
