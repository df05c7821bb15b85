// Multi-turn traffic for the simulator, written as trace records (trace_file.hpp) so that it goes
// through the same reader as a user's trace: a chat trace (sessions that come back after a user
// read the answer, while other sessions push their prefixes out of the device cache) and an agentic
// fan-out trace (one tool-definition system prompt, tasks that fan out into branches on tool
// outputs and merge). docs/simulation.md, "Generated traces", gives the parameters and why.
//
// Draws come from one seeded std::mt19937_64 through random.hpp's portable transforms, so a
// (config, seed) pair names the same records on every platform. Prompt tokens are not written:
// records give lengths (prompt_len, prefix_group), which the reader draws.
#pragma once

#include "sim/random.hpp"
#include "sim/trace_file.hpp"
#include "sim/workload.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pagedkv::sim {

/// A log-normal length, rounded and clamped to [1, max_tokens]: exp(mu + sigma z) with mu set so
/// that the unclamped mean is mean_tokens.
struct length_draw {
  double mean_tokens;
  double sigma;
  std::int32_t max_tokens;
};

namespace detail {

inline std::int32_t draw_length(std::mt19937_64& rng, const length_draw& d) {
  const double mu = std::log(d.mean_tokens) - d.sigma * d.sigma / 2;
  const double x = std::round(std::exp(mu + d.sigma * standard_normal(rng)));
  return static_cast<std::int32_t>(std::clamp<double>(x, 1, d.max_tokens));
}

inline void check_length(const length_draw& d, const char* what) {
  if (!(d.mean_tokens >= 1) || !(d.sigma >= 0) || d.max_tokens < 1) {
    throw std::invalid_argument(std::string("session trace: bad ") + what + " length (mean " +
                                std::to_string(d.mean_tokens) + ", sigma " + std::to_string(d.sigma) + ", max " +
                                std::to_string(d.max_tokens) + ")");
  }
}

/// Orders records by arrival, keeping file order among equals: a session's turns arrive in order,
/// so each still follows the turn it continues.
inline trace_records by_arrival(std::vector<std::pair<std::int64_t, nlohmann::json>> timed) {
  std::stable_sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  trace_records records;
  records.reserve(timed.size());
  for (auto& [arrival, record] : timed) {
    record["arrival_step"] = arrival;
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace detail

/// Chat: sessions start as a Poisson process; each opens with one of a few system prompts and a
/// first message, and returns after the user read the answer and thought, with a shorter message.
struct chat_config {
  std::size_t num_sessions = 150;
  double sessions_per_step = 0.02;       ///< new sessions per step (one every 50 steps)
  double mean_turns = 5;                 ///< turns per session: 1 + geometric, capped at max_turns
  std::int32_t max_turns = 12;
  std::int32_t num_system_prompts = 4;   ///< each session takes one, uniformly
  std::int32_t system_prompt_len = 256;
  length_draw first_message{120, 0.8, 1024};
  length_draw followup_message{50, 0.9, 512};
  length_draw output{220, 0.7, 1024};
  double mean_think_steps = 600;         ///< after the answer is generated: 15 s at 25 ms a step
  std::int32_t max_context_len = 8192;   ///< a session ends before its prompt would pass this
  std::uint64_t seed = 1;
};

/// The chat trace's records, in arrival order. A turn's arrival is the previous turn's, plus its
/// prefill (one step per 2048 tokens) and output steps, plus the think time: the simulator's own
/// queueing can only delay it further (a turn waits for the one it continues).
/// Errors: invalid_argument for a config out of range.
inline trace_records chat_records(const chat_config& c) {
  if (c.num_sessions < 1 || !(c.sessions_per_step > 0) || !(c.mean_turns >= 1) || c.max_turns < 1 ||
      c.num_system_prompts < 1 || c.system_prompt_len < 1 || !(c.mean_think_steps >= 0) ||
      c.max_context_len <= c.system_prompt_len) {
    throw std::invalid_argument("chat_records: config out of range");
  }
  detail::check_length(c.first_message, "first message");
  detail::check_length(c.followup_message, "follow-up message");
  detail::check_length(c.output, "output");
  std::mt19937_64 rng(c.seed);
  std::vector<std::pair<std::int64_t, nlohmann::json>> timed;
  double start = 0;
  for (std::size_t s = 0; s < c.num_sessions; ++s) {
    start += exponential(rng, c.sessions_per_step);
    const std::string session = "chat-" + std::to_string(s);
    const auto system = static_cast<std::int32_t>(uniform_below(rng, static_cast<std::uint64_t>(c.num_system_prompts)));
    // 1 + geometric(p) turns with mean mean_turns: p = 1 / mean_turns.
    std::int32_t turns = 1;
    while (turns < c.max_turns && uniform01(rng) >= 1 / c.mean_turns) ++turns;
    double arrival = start;
    std::int64_t context = 0;
    for (std::int32_t t = 0; t < turns; ++t) {
      const std::int32_t message = detail::draw_length(rng, t == 0 ? c.first_message : c.followup_message);
      const std::int32_t output = detail::draw_length(rng, c.output);
      const double think = c.mean_think_steps > 0 ? exponential(rng, 1 / c.mean_think_steps) : 0.0;
      const std::int64_t prompt = context + (t == 0 ? c.system_prompt_len : 0) + message;
      if (prompt + output > c.max_context_len) break;
      nlohmann::json record{{"session", session}, {"output_len", output}};
      if (t == 0) {
        record["prefix_group"] = "system-" + std::to_string(system);
        record["prefix_len"] = c.system_prompt_len;
        record["prompt_len"] = c.system_prompt_len + message;
      } else {
        record["prompt_len"] = message;
      }
      timed.emplace_back(static_cast<std::int64_t>(arrival), std::move(record));
      context = prompt + output;
      arrival += std::ceil(static_cast<double>(prompt) / 2048) + output + think;
    }
  }
  return detail::by_arrival(std::move(timed));
}

/// Agentic fan-out: every task shares one long system prompt (the tool definitions). A task's
/// root turn plans; then its branches, each a session started from the root's history
/// (branch_of), call tools whose outputs they read, one or two rounds; then the root reads the
/// branches' results and answers.
struct agentic_config {
  std::size_t num_tasks = 40;
  double tasks_per_step = 0.01;
  std::int32_t system_prompt_len = 2048;
  length_draw task{200, 0.6, 2048};
  length_draw plan_output{120, 0.5, 512};
  std::int32_t min_branches = 2;
  std::int32_t max_branches = 8;          ///< branches per task, uniform in [min, max]
  length_draw tool_output{500, 0.9, 4096};
  length_draw branch_output{100, 0.6, 512};
  double second_call_probability = 0.5;   ///< a branch calls a second tool
  length_draw results{200, 0.5, 2048};    ///< what the root reads back from its branches
  length_draw answer{250, 0.6, 1024};
  double mean_tool_steps = 40;            ///< a tool's latency: 1 s at 25 ms a step
  std::uint64_t seed = 1;
};

/// The agentic trace's records, in arrival order. Errors: invalid_argument for a config out of
/// range.
inline trace_records agentic_records(const agentic_config& c) {
  if (c.num_tasks < 1 || !(c.tasks_per_step > 0) || c.system_prompt_len < 1 || c.min_branches < 1 ||
      c.max_branches < c.min_branches || !(c.second_call_probability >= 0 && c.second_call_probability <= 1) ||
      !(c.mean_tool_steps > 0)) {
    throw std::invalid_argument("agentic_records: config out of range");
  }
  for (const auto& [d, what] : {std::pair{&c.task, "task"}, std::pair{&c.plan_output, "plan"},
                                std::pair{&c.tool_output, "tool output"}, std::pair{&c.branch_output, "branch output"},
                                std::pair{&c.results, "results"}, std::pair{&c.answer, "answer"}}) {
    detail::check_length(*d, what);
  }
  std::mt19937_64 rng(c.seed);
  std::vector<std::pair<std::int64_t, nlohmann::json>> timed;
  auto steps = [](std::int64_t prompt, std::int32_t output) {
    return std::ceil(static_cast<double>(prompt) / 2048) + output;
  };
  double start = 0;
  for (std::size_t k = 0; k < c.num_tasks; ++k) {
    start += exponential(rng, c.tasks_per_step);
    const std::string root = "task-" + std::to_string(k);
    const std::int32_t task = detail::draw_length(rng, c.task);
    const std::int32_t plan = detail::draw_length(rng, c.plan_output);
    timed.emplace_back(static_cast<std::int64_t>(start),
                       nlohmann::json{{"session", root}, {"prefix_group", "tools"}, {"prefix_len", c.system_prompt_len},
                                      {"prompt_len", c.system_prompt_len + task}, {"output_len", plan}});
    const std::int64_t root_context = c.system_prompt_len + task + plan;
    const double planned = start + steps(c.system_prompt_len + task, plan);
    const auto branches = c.min_branches + static_cast<std::int32_t>(uniform_below(
                                               rng, static_cast<std::uint64_t>(c.max_branches - c.min_branches + 1)));
    double merged = planned;
    for (std::int32_t b = 0; b < branches; ++b) {
      const std::string branch = root + "/" + std::to_string(b);
      double arrival = planned + exponential(rng, 1 / c.mean_tool_steps);
      std::int64_t context = root_context;
      const std::int32_t calls = 1 + (uniform01(rng) < c.second_call_probability);
      for (std::int32_t call = 0; call < calls; ++call) {
        const std::int32_t tool = detail::draw_length(rng, c.tool_output);
        const std::int32_t output = detail::draw_length(rng, c.branch_output);
        nlohmann::json record{{"session", branch}, {"prompt_len", tool}, {"output_len", output}};
        if (call == 0) record["branch_of"] = root;
        timed.emplace_back(static_cast<std::int64_t>(arrival), std::move(record));
        context += tool;
        arrival += steps(context, output) + exponential(rng, 1 / c.mean_tool_steps);
        context += output;
      }
      merged = std::max(merged, arrival);
    }
    timed.emplace_back(static_cast<std::int64_t>(merged),
                       nlohmann::json{{"session", root},
                                      {"prompt_len", detail::draw_length(rng, c.results)},
                                      {"output_len", detail::draw_length(rng, c.answer)}});
  }
  return detail::by_arrival(std::move(timed));
}

}  // namespace pagedkv::sim
