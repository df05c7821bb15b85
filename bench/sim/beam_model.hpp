// A small stochastic model of beam search, so that the paged simulation can fork and free beams
// the way a real engine does without running a model.
//
// Each beam carries a cumulative log-probability. At every step each live beam proposes its k best
// next tokens; their log-probabilities are drawn as
//   best    = -Exp(mean_top_nats)                      (how sure the model is of its best token)
//   j-th    = (j-1)-th - Exp(mean_gap_nats)             (gaps to the runners-up)
// and the k candidates with the highest cumulative score survive, exactly as in beam search. A beam
// whose candidates are all beaten dies; a beam with several survivors forks. Confident beams
// (small top log-prob, wide gaps) take several slots, which is what makes beams share long
// histories and what paged memory saves. The defaults are a judgement, not a measurement:
// docs/simulation.md reports the fork and death rates they give.
#pragma once

#include "sim/random.hpp"

#include <pagedkv/error.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace pagedkv::sim {

struct beam_model_params {
  double mean_top_nats = 0.7;  ///< mean of -log p(best next token)
  double mean_gap_nats = 1.0;  ///< mean log-prob gap between consecutive candidates
};

class beam_model {
 public:
  /// A search of `width` beams that starts from one sequence (the prompt).
  /// Errors: invalid_argument when width < 1 or a mean is not positive.
  beam_model(std::int32_t width, std::uint64_t seed, beam_model_params params = {})
      : width_(width), params_(params), rng_(seed), scores_(1, 0.0) {
    if (width < 1 || !(params.mean_top_nats > 0) || !(params.mean_gap_nats > 0)) {
      pagedkv::detail::fail(errc::invalid_argument, "beam_model: width ", width, ", mean_top_nats ",
                   params.mean_top_nats, ", mean_gap_nats ", params.mean_gap_nats);
    }
  }

  /// Advances one decoding step. Returns, for each beam alive after the step, the index of its
  /// parent among the beams alive before it, in ascending order: parents[j] == i means new beam j
  /// extends old beam i by one token. An old beam that appears c times forks into c beams (c - 1
  /// copies); one that does not appear dies. The first step starts from the single prompt beam, so
  /// it returns `width` zeros. The span is valid until the next call.
  std::span<const std::int32_t> step() {
    const auto live = static_cast<std::int32_t>(scores_.size());
    candidates_.clear();
    for (std::int32_t beam = 0; beam < live; ++beam) {
      double logprob = -exponential(rng_, 1 / params_.mean_top_nats);
      for (std::int32_t rank = 0; rank < width_; ++rank) {
        if (rank > 0) logprob -= exponential(rng_, 1 / params_.mean_gap_nats);
        candidates_.push_back({scores_[static_cast<std::size_t>(beam)] + logprob, beam, rank});
      }
    }
    // The best `width` candidates, ties broken by (parent, rank) so that the result is a function
    // of the seed alone.
    auto better = [](const candidate& a, const candidate& b) {
      if (a.score != b.score) return a.score > b.score;
      if (a.parent != b.parent) return a.parent < b.parent;
      return a.rank < b.rank;
    };
    auto keep = candidates_.begin() + width_;
    std::partial_sort(candidates_.begin(), keep, candidates_.end(), better);
    std::sort(candidates_.begin(), keep, [&](const candidate& a, const candidate& b) {
      return a.parent != b.parent ? a.parent < b.parent : better(a, b);
    });
    parents_.clear();
    scores_.clear();
    for (auto it = candidates_.begin(); it != keep; ++it) {
      parents_.push_back(it->parent);
      scores_.push_back(it->score);
    }
    return parents_;
  }

  [[nodiscard]] std::int32_t width() const noexcept { return width_; }
  /// Beams alive now: 1 before the first step, width() after it.
  [[nodiscard]] std::int32_t num_beams() const noexcept {
    return static_cast<std::int32_t>(scores_.size());
  }

 private:
  struct candidate {
    double score;
    std::int32_t parent;
    std::int32_t rank;
  };

  std::int32_t width_;
  beam_model_params params_;
  std::mt19937_64 rng_;
  std::vector<double> scores_;  // cumulative log-prob of each live beam
  std::vector<candidate> candidates_;
  std::vector<std::int32_t> parents_;
};

/// What an engine does with one step's parents, in the order it must do it: free the beams that
/// died (their blocks go back first), fork the extra children of beams that got several (a fork
/// shares the parent's blocks as they were before this step's token), then append this step's token
/// to every surviving beam (copy-on-write where a last block is now shared).
struct beam_step_plan {
  /// new beam j continues old beam continued_from[j]'s sequence in place, or is a fork (-1).
  std::vector<std::int32_t> continued_from;
  /// (old beam, new beam): new beam is a fork of old beam's sequence.
  std::vector<std::pair<std::int32_t, std::int32_t>> forks;
  /// old beams with no children: free their sequences.
  std::vector<std::int32_t> freed;
};

/// Turns a step()'s parents (sorted, each in [0, num_old_beams)) into a plan: the first child of
/// each parent keeps the parent's sequence, the other children fork it.
/// Errors: invalid_argument when parents are unsorted or out of range.
inline beam_step_plan plan_beam_step(std::span<const std::int32_t> parents,
                                     std::int32_t num_old_beams) {
  beam_step_plan plan;
  plan.continued_from.assign(parents.size(), -1);
  std::vector<bool> has_child(static_cast<std::size_t>(std::max(num_old_beams, 0)), false);
  for (std::size_t j = 0; j < parents.size(); ++j) {
    const std::int32_t parent = parents[j];
    if (parent < 0 || parent >= num_old_beams || (j > 0 && parent < parents[j - 1])) {
      pagedkv::detail::fail(errc::invalid_argument, "plan_beam_step: parent ", parent,
                            " at position ", j, " (", num_old_beams,
                            " old beams; parents must be sorted)");
    }
    if (!has_child[static_cast<std::size_t>(parent)]) {
      has_child[static_cast<std::size_t>(parent)] = true;
      plan.continued_from[j] = parent;
    } else {
      plan.forks.emplace_back(parent, static_cast<std::int32_t>(j));
    }
  }
  for (std::int32_t old = 0; old < num_old_beams; ++old) {
    if (!has_child[static_cast<std::size_t>(old)]) plan.freed.push_back(old);
  }
  return plan;
}

}  // namespace pagedkv::sim
