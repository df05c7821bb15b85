// The host reference of merge_states: against the closed form in double, in place, and as
// cascade attention (the states of a sequence's blocks cut into parts, merged) against naive
// dense attention over the whole sequence, including sequences sharing a prefix's blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <pagedkv/reference/attention.hpp>
#include <pagedkv/reference/merge.hpp>

#include "attention_case.hpp"

namespace pk = pagedkv::kernels;
using pk::testing::load_as;
using pk::testing::store_as;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Random states (random_states) and poisoned outputs, the params pointing at them.
struct states : pk::testing::random_states {
  std::vector<unsigned char> o;
  std::vector<float> lse;

  states(pk::dtype t, std::int64_t rows, std::int32_t n, std::int32_t d, std::int64_t pad, std::mt19937_64& rng)
      : random_states(t, rows, n, d, pad, 0, rng) {
    o.resize(std::size_t(rows * d) * pk::size_of(t));
    pk::testing::poison(t, o.data(), std::size_t(rows * d));
    lse.assign(std::size_t(rows), std::numeric_limits<float>::quiet_NaN());
    p.o_in = o_in.data();
    p.lse_in = lse_in.data();
    p.o = o.data();
    p.lse = lse.data();
  }
};

/// The merge of row r, dim i of s, in double.
double merged(const states& s, std::int64_t r, std::int32_t i, double* lse_out) {
  const auto& p = s.p;
  double m = -std::numeric_limits<double>::infinity();
  for (std::int32_t k = 0; k < p.num_states; ++k) m = std::max(m, double(s.lse_in[std::size_t(k * p.lse_stride() + r)]));
  double sum = 0, acc = 0;
  for (std::int32_t k = 0; k < p.num_states; ++k) {
    const double lse = s.lse_in[std::size_t(k * p.lse_stride() + r)];
    if (std::isinf(lse)) continue;
    sum += std::exp(lse - m);
    acc += std::exp(lse - m) * load_as(p.o_dtype, s.o_in.data(), std::size_t(k * p.o_stride() + r * p.head_dim + i));
  }
  *lse_out = sum > 0 ? m + std::log(sum) : -std::numeric_limits<double>::infinity();
  return sum > 0 ? acc / sum : 0.0;
}

void expect_merged(const states& s, const unsigned char* o, const float* lse) {
  const auto& p = s.p;
  double num = 0, den = 0, lse_err = 0;
  for (std::int64_t r = 0; r < p.num_rows; ++r) {
    double ref_lse = 0;
    for (std::int32_t i = 0; i < p.head_dim; ++i) {
      const double ref = merged(s, r, i, &ref_lse), x = load_as(p.o_dtype, o, std::size_t(r * p.head_dim + i));
      ASSERT_TRUE(std::isfinite(x)) << "row " << r << " dim " << i << " unwritten or NaN";
      num += (x - ref) * (x - ref);
      den += ref * ref;
    }
    if (std::isinf(ref_lse)) {
      EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << r << ": every state empty, lse " << lse[r];
      for (std::int32_t i = 0; i < p.head_dim; ++i) EXPECT_EQ(load_as(p.o_dtype, o, std::size_t(r * p.head_dim + i)), 0.0f);
    } else {
      lse_err = std::max(lse_err, std::fabs(double(lse[r]) - ref_lse));
    }
  }
  EXPECT_LE(std::sqrt(num / den), pk::testing::tolerance(p.o_dtype));
  EXPECT_LE(lse_err, 1e-4);
}

}  // namespace

TEST(ReferenceMerge, MatchesTheClosedFormInDouble) {
  auto rng = pk::testing::seeded_rng();
  for (auto t : {pk::dtype::f32, pk::dtype::f16, pk::dtype::bf16})
    for (std::int32_t n : {1, 2, 3, 9})
      for (std::int32_t d : {1, 3, 64, 80, 127})
        for (std::int64_t pad : {0, 5}) {
          SCOPED_TRACE(testing::Message() << pk::to_string(t) << " states " << n << " head_dim " << d << " pad " << pad);
          states s(t, 37, n, d, pad, rng);
          pk::reference::merge_states(s.p);
          expect_merged(s, s.o.data(), s.lse.data());
        }
}

TEST(ReferenceMerge, InPlaceOverStateZero) {
  auto rng = pk::testing::seeded_rng();
  for (auto t : {pk::dtype::f32, pk::dtype::bf16}) {
    states s(t, 50, 3, 96, 0, rng);
    const states copy = s;  // the inputs, for the expected values
    s.p.o = s.o_in.data();
    s.p.lse = s.lse_in.data();
    pk::reference::merge_states(s.p);
    expect_merged(copy, s.o_in.data(), s.lse_in.data());
  }
}

TEST(ReferenceMerge, CascadeEqualsAttentionOverTheWholeSequence) {
  // Decode over each sequence's blocks cut into 2 or 3 parts (a shared prefix, its own blocks),
  // each part's output and LSE a state, merged: attention over the whole sequence.
  auto rng = pk::testing::seeded_rng();
  int index = 0;
  for (auto [qt, kvt] : {std::pair{pk::dtype::f32, pk::dtype::f32}, std::pair{pk::dtype::bf16, pk::dtype::bf16},
                         std::pair{pk::dtype::f16, pk::dtype::fp8_e4m3}})
    for (int group : {1, 4})
      for (int bs : {1, 16, 17}) {
        pk::testing::case_config cfg;
        cfg.q_dtype = qt;
        cfg.kv_dtype = kvt;
        cfg.group = group;
        cfg.num_kv_heads = 2;
        cfg.head_dim = index % 2 ? 64 : 80;
        cfg.block_size = bs;
        cfg.layout = index % 2 ? pk::kv_layout::hnd : pk::kv_layout::nhd;
        cfg.per_head_scale = index % 3 == 0;
        cfg.soft_cap = index % 4 == 1 ? 30.0f : 0.0f;
        const std::int32_t prefix_blocks = 1 + int(rng() % 3);
        std::uniform_int_distribution<int> extra(1, 3 * bs + 20);
        for (int s = 0; s < 4; ++s) cfg.kv_lens.push_back(prefix_blocks * bs + extra(rng));
        ++index;
        SCOPED_TRACE(cfg.describe());
        pk::testing::attention_case c;
        pk::testing::make_case(c, cfg, rng);
        pk::testing::share_prefix(c, prefix_blocks);  // the four sequences share their first blocks
        const auto ref = pk::testing::naive_attention(c);
        for (const std::vector<std::int32_t>& cuts :
             {std::vector<std::int32_t>{prefix_blocks}, std::vector<std::int32_t>{0, prefix_blocks + 1},
              std::vector<std::int32_t>{1, prefix_blocks, prefix_blocks + 2}}) {
          const auto parts = pk::testing::cascade_parts(c, cuts);
          const auto n = std::int32_t(parts.size());
          const std::size_t rows = std::size_t(c.num_q_tokens) * std::size_t(c.num_qo_heads());
          const std::size_t row_bytes = std::size_t(cfg.head_dim) * pk::size_of(qt);
          std::vector<unsigned char> o_states(std::size_t(n) * rows * row_bytes), o(rows * row_bytes);
          std::vector<float> lse_states(std::size_t(n) * rows), lse(rows);
          for (std::int32_t i = 0; i < n; ++i) {
            pk::attention_params p = c.params;
            p.table.indices = parts[std::size_t(i)].indices.data();
            p.table.kv_lens = parts[std::size_t(i)].kv_lens.data();
            p.max_kv_len = parts[std::size_t(i)].max_kv_len;
            p.o = o_states.data() + std::size_t(i) * rows * row_bytes;
            p.lse = lse_states.data() + std::size_t(i) * rows;
            pk::reference::attention(p);
          }
          pk::merge_states_params m;
          m.o_in = o_states.data();
          m.lse_in = lse_states.data();
          m.o = o.data();
          m.lse = lse.data();
          m.num_rows = std::int64_t(rows);
          m.num_states = n;
          m.head_dim = cfg.head_dim;
          m.o_dtype = qt;
          pk::reference::merge_states(m);
          const auto cmp = pk::testing::compare(c, o.data(), lse.data(), ref);
          EXPECT_EQ(cmp.non_finite, 0u) << n << " parts";
          // Each part's output is rounded to q's type before the merge: up to twice the rounding.
          EXPECT_LE(cmp.rel_error, 2 * pk::testing::tolerance(qt)) << n << " parts";
          EXPECT_LE(cmp.max_lse_error, 1e-3) << n << " parts";
        }
      }
}

TEST(ReferenceMerge, ErrorsNameTheBadValue) {
  float lse = 0.0f;
  unsigned char o[8] = {};
  const auto message = [](const pk::merge_states_params& p) {
    try {
      pk::reference::merge_states(p);
    } catch (const pagedkv::error& e) {
      EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  pk::merge_states_params p;
  p.o_in = o;
  p.lse_in = &lse;
  p.o = o;
  p.num_rows = 1;
  p.num_states = 1;
  p.head_dim = 2;
  p.o_dtype = pk::dtype::f16;
  EXPECT_EQ(message(p), "no error");
  // Each case breaks one field of the good params; the error must name it.
  const auto expect_named = [&](auto&& breaks, const std::string& name) {
    auto bad = p;
    breaks(bad);
    EXPECT_NE(message(bad).find(name), std::string::npos) << message(bad);
  };
  expect_named([](auto& q) { q.num_states = 0; }, "num_states 0");
  expect_named([](auto& q) { q.head_dim = 0; }, "head_dim 0");
  expect_named([](auto& q) { q.num_rows = -1; }, "num_rows -1");
  expect_named([](auto& q) { q.o_dtype = pk::dtype::fp8_e4m3; }, "fp8_e4m3");
  expect_named([](auto& q) { q.state_stride = 1; }, "state_stride 1");
  expect_named([](auto& q) { q.lse_state_stride = -1; }, "lse_state_stride -1");
  expect_named([](auto& q) { q.lse_in = nullptr; }, "must be set");
  // Two states of 2 rows: o may be state 0 exactly, never a row into the states.
  unsigned char states_bytes[2 * 2 * 2 * 2] = {};
  float lses[4] = {};
  auto bad = p;
  bad.o_in = states_bytes;
  bad.lse_in = lses;
  bad.num_rows = 2;
  bad.num_states = 2;
  bad.o = states_bytes;
  bad.lse = lses;
  EXPECT_EQ(message(bad), "no error");
  bad.o = states_bytes + 4;
  EXPECT_NE(message(bad).find("o overlaps o_in"), std::string::npos) << message(bad);
  bad.o = states_bytes;
  bad.lse = lses + 1;
  EXPECT_NE(message(bad).find("lse overlaps lse_in"), std::string::npos) << message(bad);
}
