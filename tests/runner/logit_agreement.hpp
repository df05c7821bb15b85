// What the GPU engine's tests (test_cuda_backend, test_tp_backend) call agreeing logits: every
// logit within abs + rel * the row's largest |logit| of the reference's, and the argmax the same
// unless the reference's top two are within twice that (a near-tie, counted). Also where the
// goldens are.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

namespace pagedkv::llama::test_support {

struct tolerance {
  double abs, rel;
};

/// Logits of a bf16 GPU forward against a reference of the same bf16 weights. What differs is the
/// arithmetic: activations rounded to bf16 between products (2^-9 relative each, about ten
/// roundings a layer) and K/V stored in bf16, which attention's softmax amplifies where it is
/// sharp. A one-token prompt (no softmax to amplify) agrees within 1% of the largest logit
/// (test_cuda_backend's OneTokenPromptThroughEachPart), as a numpy emulation of the same roundings
/// predicts; prompts of up to 70 tokens reached 5.1% with bf16 K/V on the H100 (2026-11-25).
/// Bounds: 1.4 times that.
inline constexpr tolerance bf16_tolerance{0.05, 0.07};

/// The largest gaps seen so far and the rows compared.
struct logit_agreement {
  double max_abs = 0.0, max_rel = 0.0;
  std::int64_t rows = 0, near_ties = 0;
};

/// Compares rows [rows, vocab] of `got` with `expected` within tol, adding to a. `where` names
/// the step in failure messages. A void function: callers check HasFatalFailure().
inline void expect_logits_agree(std::span<const float> expected, std::span<const float> got, std::int64_t vocab,
                                tolerance tol, logit_agreement& a, const std::string& where) {
  ASSERT_EQ(expected.size(), got.size()) << where;
  for (std::int64_t r = 0; r < std::int64_t(expected.size()) / vocab; ++r) {
    const float* x = expected.data() + r * vocab;
    const float* y = got.data() + r * vocab;
    double scale = 0.0;
    for (std::int64_t i = 0; i < vocab; ++i) scale = std::max(scale, double(std::abs(x[i])));
    const double bound = tol.abs + tol.rel * scale;
    for (std::int64_t i = 0; i < vocab; ++i) {
      const double err = std::abs(double(x[i]) - double(y[i]));
      a.max_abs = std::max(a.max_abs, err);
      a.max_rel = std::max(a.max_rel, err / std::max(scale, 1e-6));
      ASSERT_LE(err, bound) << where << " row " << r << " logit " << i;
    }
    const auto best_x = std::max_element(x, x + vocab) - x, best_y = std::max_element(y, y + vocab) - y;
    if (best_x != best_y) {
      ASSERT_LE(double(x[best_x]) - double(x[best_y]), 2 * bound)
          << where << " row " << r << ": the argmax differs beyond a near-tie";
      ++a.near_ties;
    }
    ++a.rows;
  }
}

/// The goldens' folder: PAGEDKV_GOLDEN_DIR from the environment where set (a copy of the tree on
/// another machine), else the build's.
inline std::filesystem::path golden_dir() {
  const char* env = std::getenv("PAGEDKV_GOLDEN_DIR");
  return env ? env : PAGEDKV_GOLDEN_DIR;
}

}  // namespace pagedkv::llama::test_support
