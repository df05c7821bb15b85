// User traces (trace_file.hpp) and the block-size sweep over them (trace_sweep.hpp): the reader
// refuses bad lines by line and field, both formats read the same trace, written traces read
// back, and the shipped example sweeps to figures worked out by hand.
#include "sim/trace_file.hpp"
#include "sim/paged.hpp"
#include "sim/sessions.hpp"
#include "sim/trace_sweep.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <map>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace pagedkv::sim {
namespace {

const std::string example_dir = PAGEDKV_SIM_TRACES;

void expect_same_requests(const trace& a, const trace& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(a[i].id, b[i].id);
    EXPECT_EQ(a[i].arrival_step, b[i].arrival_step);
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].output_len, b[i].output_len);
    EXPECT_EQ(a[i].num_samples, b[i].num_samples);
    EXPECT_EQ(a[i].beam_width, b[i].beam_width);
    EXPECT_EQ(a[i].cache_priority, b[i].cache_priority);
  }
}

TEST(TraceFile, ExampleReadsTheSameInBothFormats) {
  const trace jsonl = read_trace_file(example_dir + "/example.jsonl");
  const trace csv = read_trace_file(example_dir + "/example.csv");
  expect_same_requests(jsonl, csv);
  ASSERT_EQ(jsonl.size(), 4u);
  // Requests 0 and 3 share the group's 8 tokens and nothing else; 1 and 2 share nothing.
  const std::vector<token_id> system(jsonl[0].prompt.begin(), jsonl[0].prompt.begin() + 8);
  EXPECT_TRUE(std::equal(system.begin(), system.end(), jsonl[3].prompt.begin()));
  EXPECT_EQ(jsonl[0].prompt.size(), 10u);
  EXPECT_EQ(jsonl[3].prompt.size(), 12u);
  std::set<token_id> seen;
  for (const request& r : jsonl) seen.insert(r.prompt.begin(), r.prompt.end());
  EXPECT_EQ(seen.size(), 10u + 8 + 8 + 4);  // 8 shared tokens counted once
  EXPECT_EQ(jsonl[0].cache_priority, 10);
  EXPECT_EQ(jsonl[1].cache_priority, 0);
  EXPECT_EQ(jsonl[3].arrival_step, 15);
  EXPECT_EQ(jsonl[3].max_output_len, 3);
}

struct bad_line {
  const char* text;
  trace_format format;
  std::size_t line;
  const char* field;
  const char* problem;  // a part of the message
};

/// Reads c.text and expects it refused on c.line, naming c.field, with c.problem in the problem:
/// the error's message ("" when it was read).
std::string expect_refused(const bad_line& c) {
  SCOPED_TRACE(c.text);
  std::istringstream in(c.text);
  try {
    read_trace(in, c.format);
    ADD_FAILURE() << "read without an error";
  } catch (const trace_error& e) {
    EXPECT_EQ(e.line(), c.line) << e.what();
    EXPECT_EQ(e.field(), c.field) << e.what();
    EXPECT_NE(e.problem().find(c.problem), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

TEST(TraceFile, BadLinesNameTheLineAndField) {
  const char* ok = R"({"arrival_step": 0, "prompt_len": 4, "output_len": 2})"
                   "\n";
  const std::vector<bad_line> cases{
      {R"({"arrival_step": 0, "prompt_len": 4})", trace_format::jsonl, 1, "output_len", "missing"},
      {R"({"arrival_step": 0, "prompt_len": 4, "output_len": 0})", trace_format::jsonl, 1, "output_len", "out of range"},
      {R"({"arrival_step": 0, "prompt_len": "ten", "output_len": 1})", trace_format::jsonl, 1, "prompt_len", "integer"},
      {R"({"arrival_step": 0, "prompt_len": 4, "outptu_len": 1})", trace_format::jsonl, 1, "outptu_len", "unknown field"},
      {R"({"arrival_step": 0, "prompt": [1, 2], "prompt_len": 2, "output_len": 1})", trace_format::jsonl, 1, "prompt",
       "not both"},
      {R"({"arrival_step": 0, "prompt": [1, 1073741824], "output_len": 1})", trace_format::jsonl, 1, "prompt", "token 1"},
      {R"({"arrival_step": 0, "prompt": [], "output_len": 1})", trace_format::jsonl, 1, "prompt", "non-empty"},
      {R"({"arrival_step": 0, "prompt_len": 4, "prefix_group": "a", "prefix_len": 5, "output_len": 1})",
       trace_format::jsonl, 1, "prefix_len", "longer than prompt_len"},
      {R"({"arrival_step": 0, "prompt_len": 4, "prefix_group": "a", "output_len": 1})", trace_format::jsonl, 1,
       "prefix_len", "go together"},
      {R"({"arrival_step": 0, "prompt_len": 4, "output_len": 1, "n": 2, "beam_width": 2})", trace_format::jsonl, 1,
       "beam_width", "both"},
      {R"({"arrival_s": -1, "prompt_len": 4, "output_len": 1})", trace_format::jsonl, 1, "arrival_s", ">= 0"},
      {R"({"prompt_len": 4, "output_len": 1})", trace_format::jsonl, 1, "arrival_step", "missing"},
      {R"({"arrival_step": 0, "prompt_len": 4, "output_len": 1)", trace_format::jsonl, 1, "", "not JSON"},
      {R"([1, 2])", trace_format::jsonl, 1, "", "JSON object"},
      {"arrival_step,prompt_len,output_len\n0,4\n", trace_format::csv, 2, "", "2 cells for 3 columns"},
      {"arrival_step,prompt_len,output_lenn\n", trace_format::csv, 1, "output_lenn", "unknown column"},
      {"arrival_step,prompt_len,output_len\n0,4,x\n", trace_format::csv, 2, "output_len", "expected a number"},
      {"arrival_step,prompt,output_len\n0,1 2 a,1\n", trace_format::csv, 2, "prompt", "token 2"},
      {"arrival_step,prefix_group,prefix_len,prompt_len,output_len\n0,\"a,b,8,10,1\n", trace_format::csv, 2, "",
       "not closed"},
      {"arrival_step,prompt_len,output_len\n", trace_format::csv, 1, "", "no request"},
  };
  for (const bad_line& c : cases) expect_refused(c);
  // The line number counts every line: a bad third line after two good ones (and a blank one).
  const std::string later = std::string(ok) + "\n" + ok + R"({"arrival_step": 0, "prompt_len": 4, "output_len": 1.5})";
  EXPECT_EQ(expect_refused({later.c_str(), trace_format::jsonl, 4, "output_len", "1.5"}),
            "trace line 4, field output_len: expected an integer, got 1.5");
  // Session fields: named on their line.
  const std::vector<bad_line> session_cases{
      {R"({"arrival_step": 0, "session": "a", "prompt_len": 4, "output_len": 2, "n": 2})", trace_format::jsonl, 1, "n",
       "one sequence"},
      {R"({"arrival_step": 0, "session": [1], "prompt_len": 4, "output_len": 2})", trace_format::jsonl, 1, "session",
       "expected a string"},
      {R"({"arrival_step": 0, "branch_of": "a", "prompt_len": 4, "output_len": 2})", trace_format::jsonl, 1, "branch_of",
       "only with session"},
      {"arrival_step,session,branch_of,prompt_len,output_len\n0,a,,4,2\n1,b,c,4,2\n", trace_format::csv, 3, "branch_of",
       "session c has no earlier turn"},
      {"arrival_step,session,branch_of,prompt_len,output_len\n0,a,,4,2\n1,b,a,4,2\n2,b,a,4,2\n", trace_format::csv, 4,
       "branch_of", "first turn"},
      {"arrival_step,session,prefix_group,prefix_len,prompt_len,output_len\n0,a,s,2,4,2\n1,a,s,2,4,2\n",
       trace_format::csv, 3, "prefix_group", "first turn"},
      {R"({"arrival_step": 0, "session": "a", "output_len": 2})", trace_format::jsonl, 1, "prompt", "missing"},
  };
  for (const bad_line& c : session_cases) expect_refused(c);
  // Arrivals must not decrease: named on the later line.
  expect_refused({R"({"arrival_step": 3, "prompt_len": 4, "output_len": 1})"
                  "\n"
                  R"({"arrival_step": 2, "prompt_len": 4, "output_len": 1})",
                  trace_format::jsonl, 2, "arrival_step", "decrease"});
}

TEST(TraceFile, SecondsBecomeSteps) {
  std::istringstream in(R"({"arrival_s": 0.0, "prompt_len": 1, "output_len": 1})"
                        "\n"
                        R"({"arrival_s": 0.26, "prompt_len": 1, "output_len": 1})");
  const trace t = read_trace(in, trace_format::jsonl, {.step_seconds = 0.1});
  EXPECT_EQ(t[0].arrival_step, 0);
  EXPECT_EQ(t[1].arrival_step, 2);
}

// A synthetic workload written out reads back as the same requests, in either format.
TEST(TraceFile, WrittenTracesReadBack) {
  trace generated = generate({.profile = alpaca_profile, .num_requests = 60, .arrival_rate_per_step = 0.5,
                              .shared_prefix_len = 12, .num_samples = 3, .seed = 7});
  generated[5].cache_priority = -4;
  for (request& r : generated) r.max_output_len = r.output_len;
  for (trace_format format : {trace_format::jsonl, trace_format::csv}) {
    std::stringstream file;
    write_trace(file, generated, format);
    expect_same_requests(read_trace(file, format), generated);
  }
}

std::vector<token_id> concat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A turn's prompt is its session's previous prompt + output + its own new tokens; a branch starts
// from the history of the session it branches; other sessions' tokens never mix in.
TEST(TraceFile, SessionTurnsContinueTheirHistory) {
  const char* jsonl = R"({"arrival_step": 0, "session": "a", "prefix_group": "sys", "prefix_len": 3, "prompt_len": 5, "output_len": 4}
{"arrival_step": 1, "session": 7, "prefix_group": "sys", "prefix_len": 3, "prompt_len": 4, "output_len": 2}
{"arrival_step": 9, "session": "a", "prompt": [11, 12], "output_len": 3}
{"arrival_step": 9, "prompt_len": 6, "output_len": 1}
{"arrival_step": 12, "session": "a/tool", "branch_of": "a", "prompt_len": 2, "output_len": 1}
{"arrival_step": 20, "session": "7", "prompt_len": 1, "output_len": 1})";
  std::istringstream in(jsonl);
  const trace t = read_trace(in, trace_format::jsonl);
  ASSERT_EQ(t.size(), 6u);
  // Turn outputs are drawn (output_len ids >= 2^30, after the prompt's own draws).
  for (std::size_t i : {0u, 1u, 2u, 4u, 5u}) {
    ASSERT_EQ(std::ssize(t[i].output_tokens), t[i].output_len) << i;
    for (token_id tok : t[i].output_tokens) EXPECT_GE(tok, first_drawn_token);
  }
  EXPECT_TRUE(t[3].output_tokens.empty());
  EXPECT_FALSE(t[3].after.has_value());
  EXPECT_FALSE(t[0].after.has_value());
  EXPECT_FALSE(t[1].after.has_value());
  // Sessions a and 7 share the group's 3 system tokens and nothing else.
  EXPECT_TRUE(std::equal(t[0].prompt.begin(), t[0].prompt.begin() + 3, t[1].prompt.begin()));
  EXPECT_NE(t[0].prompt[3], t[1].prompt[3]);
  // Turn 2 of a: turn 1's prompt and output, then the given ids.
  EXPECT_EQ(t[2].prompt, concat(concat(t[0].prompt, t[0].output_tokens), {11, 12}));
  EXPECT_EQ(t[2].after, std::optional<std::uint64_t>(0));
  // The branch starts from a's history after turn 2, and waits for turn 2.
  ASSERT_EQ(t[4].prompt.size(), t[2].prompt.size() + 3 + 2);
  EXPECT_TRUE(std::equal(t[2].prompt.begin(), t[2].prompt.end(), t[4].prompt.begin()));
  EXPECT_TRUE(std::equal(t[2].output_tokens.begin(), t[2].output_tokens.end(), t[4].prompt.begin() + std::ssize(t[2].prompt)));
  EXPECT_EQ(t[4].after, std::optional<std::uint64_t>(2));
  // Session 7 (an integer in JSON, a string in the last line: the same session) continues turn 1.
  EXPECT_EQ(t[5].prompt.size(), 4u + 2 + 1);
  EXPECT_EQ(t[5].after, std::optional<std::uint64_t>(1));
  // The same trace as CSV reads the same.
  std::stringstream csv;
  write_records(csv, {nlohmann::json::parse(R"({"arrival_step": 0, "session": "a", "prefix_group": "sys", "prefix_len": 3, "prompt_len": 5, "output_len": 4})"),
                      nlohmann::json::parse(R"({"arrival_step": 1, "session": "7", "prefix_group": "sys", "prefix_len": 3, "prompt_len": 4, "output_len": 2})"),
                      nlohmann::json::parse(R"({"arrival_step": 9, "session": "a", "prompt": [11, 12], "output_len": 3})"),
                      nlohmann::json::parse(R"({"arrival_step": 9, "prompt_len": 6, "output_len": 1})"),
                      nlohmann::json::parse(R"({"arrival_step": 12, "session": "a/tool", "branch_of": "a", "prompt_len": 2, "output_len": 1})"),
                      nlohmann::json::parse(R"({"arrival_step": 20, "session": "7", "prompt_len": 1, "output_len": 1})")},
                trace_format::csv);
  const trace from_csv = read_trace(csv, trace_format::csv);
  expect_same_requests(from_csv, t);
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(from_csv[i].output_tokens, t[i].output_tokens);
    EXPECT_EQ(from_csv[i].after, t[i].after);
  }
  // A session trace cannot be written back as token ids (its drawn ids are not a trace's).
  std::ostringstream out;
  EXPECT_THROW(write_trace(out, t, trace_format::jsonl), std::invalid_argument);
  EXPECT_TRUE(out.str().empty());
}

// The simulator: a returning turn waits for the turn it continues and hits its prompt and output.
// Block size 4. Turn 1: 8 prompt tokens, 5 output tokens; its KV covers 8 + 4 = 12 tokens (the
// last output has no slot), 3 full blocks, cached when it finishes. Turn 2 arrives at step 1,
// before turn 1 is done; held until then, it finds 12 of its 13 + 3 = 16 prompt tokens (the last
// block holds only the 13th token and the new ones). Hit rate 12 / (8 + 16).
TEST(TraceSweep, SessionTurnsHitWhatTheirPreviousTurnLeft) {
  std::istringstream in(R"({"arrival_step": 0, "session": "a", "prompt_len": 8, "output_len": 5}
{"arrival_step": 1, "session": "a", "prompt_len": 3, "output_len": 2})");
  trace t = read_trace(in, trace_format::jsonl);
  const paged_config config{.block_size = 4, .limits = {.capacity_slots = 64, .max_running_sequences = 4,
                                                        .max_tokens_per_step = 64}};
  const summary s = run_paged(t, config);
  EXPECT_EQ(s.finished_requests, 2);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 12.0 / 24);
  EXPECT_EQ(s.total_steps, 5 + 2);  // turn 2 starts the step after turn 1 finished
  // Without the wait, turn 2 runs beside turn 1 and finds only turn 1's prompt cached.
  t[1].after.reset();
  const summary eager = run_paged(t, config);
  EXPECT_DOUBLE_EQ(eager.prefix_hit_rate, 8.0 / 24);
  EXPECT_EQ(eager.total_steps, 5);
}

void expect_same_turns(const trace& a, const trace& b) {
  expect_same_requests(a, b);
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].output_tokens, b[i].output_tokens) << i;
    EXPECT_EQ(a[i].after, b[i].after) << i;
  }
}

// Generated records written as either format read back as the requests they stand for; the same
// seed gives the same records, another seed others.
TEST(SessionTraces, WrittenRecordsReadBack) {
  chat_config chat;
  chat.num_sessions = 30;
  chat.seed = 5;
  agentic_config agentic;
  agentic.num_tasks = 6;
  agentic.seed = 5;
  for (const trace_records& records : {chat_records(chat), agentic_records(agentic)}) {
    const trace expected = trace_from_records(records);
    for (trace_format format : {trace_format::jsonl, trace_format::csv}) {
      std::stringstream file;
      write_records(file, records, format);
      expect_same_turns(read_trace(file, format), expected);
    }
  }
  EXPECT_EQ(chat_records(chat), chat_records(chat));
  chat_config other = chat;
  other.seed = 6;
  EXPECT_NE(chat_records(chat), chat_records(other));
}

// The chat trace's structure: every later turn continues its session (prompt = previous prompt +
// output + at least one new token) and arrives after its previous turn could have finished; the
// sessions interleave, so most come back after other sessions' turns ran in between.
TEST(SessionTraces, ChatTurnsComeBackAfterOtherSessions) {
  chat_config config;
  config.num_sessions = 40;
  config.seed = 3;
  const trace_records records = chat_records(config);
  const trace t = trace_from_records(records);
  std::map<std::string, std::size_t> last;  // session -> index of its last turn
  std::size_t returns = 0, returns_after_others = 0;
  std::set<std::string> systems;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::string session = records[i].at("session");
    const auto it = last.find(session);
    if (it == last.end()) {
      EXPECT_FALSE(t[i].after.has_value());
      systems.insert(records[i].at("prefix_group").get<std::string>());
      EXPECT_EQ(records[i].at("prefix_len"), config.system_prompt_len);
    } else {
      const request& previous = t[it->second];
      ASSERT_EQ(t[i].after, std::optional<std::uint64_t>(previous.id));
      const std::vector<token_id> history = concat(previous.prompt, previous.output_tokens);
      ASSERT_GT(t[i].prompt.size(), history.size());
      EXPECT_TRUE(std::equal(history.begin(), history.end(), t[i].prompt.begin()));
      EXPECT_GE(t[i].arrival_step, previous.arrival_step + previous.output_len);
      ++returns;
      returns_after_others += i - it->second > 1;
    }
    EXPECT_LE(t[i].prompt_len() + t[i].output_len, config.max_context_len);
    last[session] = i;
  }
  EXPECT_EQ(last.size(), config.num_sessions);
  EXPECT_GT(returns, 2 * config.num_sessions);  // about 4 returns a session
  EXPECT_GT(returns_after_others, returns * 9 / 10);
  EXPECT_EQ(systems.size(), 4u);
}

// The agentic trace's structure: each task's root plans over the one tool prompt, 2 to 8 branches
// start from the root's prompt and plan, and the root's last turn continues its plan.
TEST(SessionTraces, AgenticTasksFanOutFromTheirRoot) {
  agentic_config config;
  config.num_tasks = 12;
  config.seed = 9;
  const trace_records records = agentic_records(config);
  const trace t = trace_from_records(records);
  std::map<std::string, std::size_t> roots;        // task -> its first turn
  std::map<std::string, std::int32_t> branches;    // task -> branches
  std::vector<token_id> tools;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::string session = records[i].at("session");
    if (records[i].contains("prefix_group")) {
      EXPECT_EQ(records[i].at("prefix_group"), "tools");
      const std::vector<token_id> prefix(t[i].prompt.begin(), t[i].prompt.begin() + config.system_prompt_len);
      if (tools.empty()) tools = prefix;
      EXPECT_EQ(prefix, tools);  // one system prompt for every task
      roots[session] = i;
    } else if (records[i].contains("branch_of")) {
      const request& root = t[roots.at(records[i].at("branch_of"))];
      const std::vector<token_id> history = concat(root.prompt, root.output_tokens);
      EXPECT_TRUE(std::equal(history.begin(), history.end(), t[i].prompt.begin()));
      EXPECT_EQ(t[i].after, std::optional<std::uint64_t>(root.id));
      ++branches[records[i].at("branch_of")];
    }
  }
  EXPECT_EQ(roots.size(), config.num_tasks);
  for (const auto& [task, count] : branches) {
    EXPECT_GE(count, config.min_branches) << task;
    EXPECT_LE(count, config.max_branches) << task;
  }
  EXPECT_EQ(branches.size(), config.num_tasks);
}

// The shipped chat trace replays through the scheduler: the sessions that return hit what their
// previous turns computed when the pool holds them, less when other sessions have pushed them out.
// Its first 100 turns (each continues an earlier one), to keep the test short.
TEST(SessionTraces, ShippedChatTraceHitsMoreInALargerPool) {
  trace t = read_trace_file(example_dir + "/chat.jsonl");
  t.resize(100);
  const paged_config small{.block_size = 16, .limits = {.capacity_slots = 4096}};
  const paged_config large{.block_size = 16, .limits = {.capacity_slots = 16384}};
  const summary a = run_paged(t, small);
  const summary b = run_paged(t, large);
  EXPECT_EQ(a.finished_requests, std::ssize(t));
  EXPECT_EQ(b.finished_requests, std::ssize(t));
  EXPECT_GT(b.prefix_hit_rate, 0.65);  // 72.6% when written
  EXPECT_GT(b.prefix_hit_rate - a.prefix_hit_rate, 0.15);  // 49.8% in the small pool
}

summary expect_ran(const sweep_row& row);

// A host tier under the device cache (the library's host_prefix_tier attached to the scheduler):
// the returning sessions of the shipped chat trace's first 100 turns load what the small device
// pool evicted. Every prompt token is cached, loaded or recomputed; a larger tier recomputes less.
TEST(SessionTraces, AHostTierServesWhatTheDeviceEvicted) {
  trace t = read_trace_file(example_dir + "/chat.jsonl");
  t.resize(100);
  const std::vector<sweep_row> rows = run_trace_sweep(
      t, {.block_sizes = {16}, .capacities_slots = {4096}, .evictions = {eviction_choice::lru}, .host_tier_ratios = {0, 4}});
  ASSERT_EQ(rows.size(), 2u);
  for (const sweep_row& row : rows) {
    SCOPED_TRACE(std::string(to_string(row.eviction)) + ", host tier " + std::to_string(row.host_tier_blocks));
    const summary s = expect_ran(row);
    EXPECT_EQ(s.finished_requests, 100);
    EXPECT_EQ(row.host_tier_blocks, row.host_tier_ratio == 0 ? 0 : 4 * 256);
    EXPECT_GT(s.cached_prompt_tokens, 0);
    EXPECT_GE(s.recomputed_prompt_tokens(), 0);
    EXPECT_DOUBLE_EQ(s.prefix_hit_rate, static_cast<double>(s.cached_prompt_tokens) / static_cast<double>(s.prompt_tokens));
    EXPECT_EQ(s.loaded_prompt_tokens > 0, row.host_tier_blocks > 0);
  }
  // 39,098 recomputed without a tier, 16,257 with 4x when written.
  EXPECT_LT(rows[1].result->recomputed_prompt_tokens(), rows[0].result->recomputed_prompt_tokens() * 6 / 10);
}

summary expect_ran(const sweep_row& row) {
  EXPECT_TRUE(row.result.has_value()) << row.note;
  return row.result.value_or(summary{});
}

// The example by hand. Block size 4, requests (prompt + output tokens): 0 = 8 system tokens + 2
// own + 2 at step 0, 1 = 8 + 1 at step 5, 2 = 8 + 1 at step 10, 3 = the 8 system tokens + 4 own +
// 3 at step 15. They never overlap, so each step holds one request's tokens (the last sampled
// token has no slot): 10, 11 | 8 | 8 | 12, 13, 14 tokens in 12, 12 | 8 | 8 | 12, 16, 16 slots of
// blocks. Waste = 1 - 76 / 84 over 18 steps, 4 requests finish.
// Cache: request 0 leaves its two system blocks cached (priority 10), 1 and 2 their two blocks
// each (priority 0). In 16 slots (4 blocks) request 2 must evict two idle blocks: LRU takes the
// system blocks (idle longest), priority eviction request 1's. So request 3 hits 8 of its 12
// prompt tokens under priority eviction, none under LRU; with 64 slots nothing is evicted. Hit
// rate = hits / the 38 prompt tokens looked up.
TEST(TraceSweep, ExampleByHand) {
  const trace requests = read_trace_file(example_dir + "/example.jsonl");
  const std::vector<sweep_row> rows =
      run_trace_sweep(requests, {.block_sizes = {4},
                                 .capacities_slots = {16, 64},
                                 .evictions = {eviction_choice::lru, eviction_choice::priority},
                                 .max_running_sequences = {4},
                                 .max_tokens_per_step = {16}});
  ASSERT_EQ(rows.size(), 4u);
  const double hit_with_system = 8.0 / 38;
  const double expected_hits[] = {0.0, hit_with_system, hit_with_system, hit_with_system};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(std::to_string(rows[i].capacity_slots) + " slots, " + to_string(rows[i].eviction));
    const summary s = expect_ran(rows[i]);
    EXPECT_EQ(s.finished_requests, 4);
    EXPECT_EQ(s.total_steps, 18);
    EXPECT_EQ(s.preemptions, 0);
    EXPECT_DOUBLE_EQ(s.throughput_requests_per_step, 4.0 / 18);
    EXPECT_DOUBLE_EQ(waste(s), 1.0 - 76.0 / 84);
    EXPECT_DOUBLE_EQ(s.prefix_hit_rate, expected_hits[i]);
  }
  EXPECT_EQ(rows[0].capacity_slots, 16);
  EXPECT_EQ(rows[0].eviction, eviction_choice::lru);
  EXPECT_EQ(rows[1].eviction, eviction_choice::priority);
}

// Block size 8 on the same trace: slots 16, 16 | 8 | 8 | 16, 16, 16; the system prompt is one
// block, so the hits are the same 8 tokens.
TEST(TraceSweep, ExampleAtBlockSizeEight) {
  const trace requests = read_trace_file(example_dir + "/example.csv");
  const std::vector<sweep_row> rows = run_trace_sweep(
      requests, {.block_sizes = {8}, .capacities_slots = {16}, .evictions = {eviction_choice::lru, eviction_choice::priority},
                 .max_running_sequences = {4}, .max_tokens_per_step = {16}});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(waste(expect_ran(rows[0])), 1.0 - 76.0 / 96);
  EXPECT_DOUBLE_EQ(expect_ran(rows[0]).prefix_hit_rate, 0.0);
  EXPECT_DOUBLE_EQ(expect_ran(rows[1]).prefix_hit_rate, 8.0 / 38);
}

// A pool too small for a request gives a row that says so; the other rows still run.
TEST(TraceSweep, PointsTooSmallForARequestAreNoted) {
  const trace requests = read_trace_file(example_dir + "/example.jsonl");
  const std::vector<sweep_row> rows =
      run_trace_sweep(requests, {.block_sizes = {4}, .capacities_slots = {8, 64}, .evictions = {eviction_choice::lru},
                                 .max_running_sequences = {4}, .max_tokens_per_step = {16}});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_FALSE(rows[0].result.has_value());
  EXPECT_NE(rows[0].note.find("request 0 was rejected"), std::string::npos) << rows[0].note;
  EXPECT_TRUE(rows[1].result.has_value());
  std::ostringstream csv;
  write_sweep_csv(csv, rows, requests.size());
  EXPECT_NE(csv.str().find("4,8,2,lifo,on,lru,4,,,"), std::string::npos) << csv.str();
}

// Partial reuse on and off are two rows of one setting each; off, no prompt token is a partial hit.
TEST(TraceSweep, PartialReuseIsSweptOnAndOff) {
  const trace requests = read_trace_file(example_dir + "/example.jsonl");
  const std::vector<sweep_row> rows =
      run_trace_sweep(requests, {.block_sizes = {4}, .capacities_slots = {64}, .evictions = {eviction_choice::lru},
                                 .partial_reuse = {true, false}, .max_running_sequences = {4},
                                 .max_tokens_per_step = {16}});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0].partial_reuse);
  EXPECT_FALSE(rows[1].partial_reuse);
  EXPECT_NE(setting_of(rows[0]), setting_of(rows[1]));
  EXPECT_EQ(expect_ran(rows[1]).partial_hit_rate, 0.0);
  EXPECT_GE(expect_ran(rows[0]).prefix_hit_rate, expect_ran(rows[1]).prefix_hit_rate);
  std::ostringstream csv;
  write_sweep_csv(csv, rows, requests.size());
  EXPECT_NE(csv.str().find("4,64,16,lifo,on,lru,"), std::string::npos) << csv.str();
  EXPECT_NE(csv.str().find("4,64,16,lifo,off,lru,"), std::string::npos) << csv.str();
}

// A model of two KV cache groups (hybrid_kv_cache_manager: full attention and a window of 8) on
// the shipped chat trace's first 60 turns, at block 64: partial hits copy every group's block and
// lift the hit rate; off, none. Other policies or a host tier are refused.
TEST(TraceSweep, KvCacheGroupsSweepPartialReuse) {
  trace t = read_trace_file(example_dir + "/chat.jsonl");
  t.resize(60);
  const sweep_config config{.block_sizes = {64}, .capacities_slots = {65536}, .evictions = {eviction_choice::lru},
                            .partial_reuse = {true, false},
                            .groups = {kv_cache_spec::full_attention(), kv_cache_spec::sliding_window(8)}};
  const std::vector<sweep_row> rows = run_trace_sweep(t, config);
  ASSERT_EQ(rows.size(), 2u);
  const summary on = expect_ran(rows[0]);
  const summary off = expect_ran(rows[1]);
  EXPECT_EQ(on.finished_requests, 60);
  EXPECT_GT(on.partial_hit_rate, 0.0);
  EXPECT_EQ(off.partial_hit_rate, 0.0);
  EXPECT_GT(on.prefix_hit_rate, off.prefix_hit_rate);
  sweep_config tiered = config;
  tiered.host_tier_ratios = {1};
  EXPECT_THROW(run_trace_sweep(t, tiered), error);
}

TEST(TraceSweep, RefusesABadSweepBeforeRunning) {
  const trace requests = read_trace_file(example_dir + "/example.jsonl");
  EXPECT_THROW(run_trace_sweep(requests, {.block_sizes = {3}, .capacities_slots = {16}}), error);
  EXPECT_THROW(run_trace_sweep(requests, {.block_sizes = {}, .capacities_slots = {16}}), error);
  EXPECT_THROW(run_trace_sweep(requests, {.block_sizes = {4}, .capacities_slots = {16}, .max_running_sequences = {0}}),
               error);
}

// The simulator runs the shipped allocator deterministically: the same seed gives the same trace,
// and the same trace the same CSV, KV events and hit rates, bit for bit, at every point, on one
// thread or two.
TEST(TraceSweep, ReplayIsExact) {
  const workload_config workload{.profile = alpaca_profile, .num_requests = 150, .arrival_rate_per_step = 2,
                                 .shared_prefix_len = 20, .seed = 11};
  std::stringstream file, again;
  write_trace(file, generate(workload), trace_format::jsonl);
  write_trace(again, generate(workload), trace_format::jsonl);
  ASSERT_EQ(file.str(), again.str());
  const trace requests = read_trace(file, trace_format::jsonl);
  const sweep_config config{.block_sizes = {1, 7, 16},
                            .capacities_slots = {1792, 3584},
                            .evictions = {eviction_choice::lru, eviction_choice::priority},
                            .max_running_sequences = {32},
                            .max_tokens_per_step = {256}};
  const std::vector<sweep_row> first = run_trace_sweep(requests, config);
  sweep_config two_threads = config;  // the runs share nothing: the thread count changes no byte
  two_threads.threads = 2;
  const std::vector<sweep_row> second = run_trace_sweep(requests, two_threads);
  std::ostringstream first_csv, second_csv;
  write_sweep_csv(first_csv, first, requests.size());
  write_sweep_csv(second_csv, second, requests.size());
  EXPECT_EQ(first_csv.str(), second_csv.str());
  ASSERT_EQ(first.size(), 12u);
  ASSERT_EQ(second.size(), first.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    const summary a = expect_ran(first[i]);
    const summary b = expect_ran(second[i]);
    EXPECT_EQ(a.kv_events, b.kv_events);
    EXPECT_EQ(a.kv_event_digest, b.kv_event_digest);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(a.prefix_hit_rate), std::bit_cast<std::uint64_t>(b.prefix_hit_rate));
    // And the sweep measured something: every run finished every request, with prefix hits and events.
    EXPECT_EQ(a.finished_requests, 150);
    EXPECT_GT(a.prefix_hit_rate, 0.0);
    EXPECT_GT(a.kv_events, 0);
  }
}

// The free list picks which free block an allocation takes, not how many are free: on a trace
// with preemptions and evictions every figure of the CSV is the same for each shipped free list
// but the event digest (the events name blocks), which differs where the ids do. Partial reuse
// off: on, a finished sequence leaves every block cached (its last, partly filled one too), so
// allocations take evicted blocks in the eviction order, whatever the free list.
TEST(TraceSweep, SweepsFreeListsThatPickIdsNotCounts) {
  const trace requests = generate({.profile = alpaca_profile, .num_requests = 80, .arrival_rate_per_step = 2,
                                   .shared_prefix_len = 20, .seed = 7});
  const std::vector<free_list_choice> free_lists{free_list_choice::lifo, free_list_choice::fifo,
                                                 free_list_choice::extent};
  const std::vector<sweep_row> rows = run_trace_sweep(requests, {.block_sizes = {5},
                                                                 .capacities_slots = {640},
                                                                 .evictions = {eviction_choice::lru},
                                                                 .free_lists = free_lists,
                                                                 .partial_reuse = {false},
                                                                 .max_running_sequences = {16},
                                                                 .max_tokens_per_step = {128}});
  ASSERT_EQ(rows.size(), 3u);
  std::ostringstream csv;
  write_sweep_csv(csv, rows, requests.size());
  std::istringstream lines(csv.str());
  std::string line;
  std::getline(lines, line);
  const auto column = [&](const std::string& name) {
    std::istringstream header(line);
    std::string cell;
    for (std::size_t i = 0; std::getline(header, cell, ','); ++i) {
      if (cell == name) return i;
    }
    ADD_FAILURE() << "no column " << name;
    return std::size_t{0};
  };
  const std::size_t free_list_column = column("free_list"), digest_column = column("kv_event_digest");
  std::vector<std::string> rest;  // each row without its free list and digest
  std::set<std::string> digests;
  for (std::size_t i = 0; std::getline(lines, line); ++i) {
    std::istringstream cells(line);
    std::string cell, others;
    for (std::size_t c = 0; std::getline(cells, cell, ','); ++c) {
      if (c == free_list_column) {
        EXPECT_EQ(cell, to_string(free_lists[i]));
      } else if (c == digest_column) {
        digests.insert(cell);
      } else {
        others += cell + ',';
      }
    }
    rest.push_back(others);
  }
  ASSERT_EQ(rest.size(), 3u);
  for (std::size_t i = 1; i < rest.size(); ++i) EXPECT_EQ(rest[i], rest[0]) << to_string(free_lists[i]);
  const summary s = expect_ran(rows[0]);
  EXPECT_EQ(s.finished_requests, 80);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_hit_rate, 0.0);
  EXPECT_EQ(digests.size(), 3u);  // the free lists did hand out different ids
  std::ostringstream printed;
  print_recommendations(printed, rows);
  EXPECT_NE(printed.str().find("recommended for 640 slots, extent free list, lru: block size 5"), std::string::npos)
      << printed.str();
}

// The scheduler's limits are swept too, innermost: one running sequence at a time takes more
// steps than sixteen, and the recommendation names the limits that vary.
TEST(TraceSweep, SweepsSchedulerLimits) {
  const trace requests = generate({.profile = alpaca_profile, .num_requests = 60, .arrival_rate_per_step = 1,
                                   .shared_prefix_len = 20, .seed = 5});
  const std::vector<sweep_row> rows = run_trace_sweep(requests, {.block_sizes = {4, 8},
                                                                 .capacities_slots = {2048},
                                                                 .evictions = {eviction_choice::lru},
                                                                 .max_running_sequences = {1, 16},
                                                                 .max_tokens_per_step = {64, 512}});
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows[0].max_running_sequences, 1);
  EXPECT_EQ(rows[0].max_tokens_per_step, 64);
  EXPECT_EQ(rows[1].max_tokens_per_step, 512);
  EXPECT_EQ(rows[2].max_running_sequences, 16);
  EXPECT_EQ(rows[4].block_size, 8);
  EXPECT_GT(expect_ran(rows[1]).total_steps, expect_ran(rows[3]).total_steps);  // 1 running sequence vs 16
  std::ostringstream printed;
  print_recommendations(printed, rows);
  EXPECT_NE(printed.str().find("recommended for 2048 slots, lru, 16 seqs, 512 tokens/step: block size"),
            std::string::npos)
      << printed.str();
  std::ostringstream csv;
  write_sweep_csv(csv, rows, requests.size());
  EXPECT_NE(csv.str().find(",16,512,"), std::string::npos) << csv.str();
}

sweep_row made_row(std::int32_t block_size, double throughput, double hit_rate, double utilization,
                   eviction_choice eviction = eviction_choice::lru) {
  summary s;
  s.throughput_requests_per_step = throughput;
  s.prefix_hit_rate = hit_rate;
  s.all.kv_utilization = utilization;
  return {.block_size = block_size, .capacity_slots = 4096, .eviction = eviction, .result = s, .note = {}};
}

// The largest block size within 1% of the best throughput and 1 point of its hit rate.
TEST(TraceSweep, RecommendsTheLargestBlockSizeWithinTolerance) {
  std::vector<sweep_row> rows{made_row(1, 1.000, 0.50, 1.0), made_row(8, 0.995, 0.495, 0.97),
                              made_row(16, 0.991, 0.49, 0.95), made_row(32, 0.999, 0.47, 0.9),
                              made_row(64, 0.95, 0.50, 0.8),
                              made_row(16, 2.0, 0.1, 0.5, eviction_choice::priority)};
  rows.push_back({.block_size = 32, .capacity_slots = 4096, .eviction = eviction_choice::priority, .result = {},
                  .note = "rejected"});
  const std::vector<recommendation> r = recommend_block_sizes(rows);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].setting.eviction, eviction_choice::lru);
  EXPECT_EQ(r[0].best_block_size, 1);
  EXPECT_EQ(r[0].block_size, 16);  // 32 loses 3 points of hits, 64 5% of throughput
  EXPECT_DOUBLE_EQ(r[0].throughput_ratio, 0.991);
  EXPECT_NEAR(r[0].hit_rate_loss, 0.01, 1e-12);
  EXPECT_NEAR(r[0].waste, 0.05, 1e-12);
  EXPECT_EQ(r[1].setting.eviction, eviction_choice::priority);
  EXPECT_EQ(r[1].block_size, 16);  // the only block size that ran
}

}  // namespace
}  // namespace pagedkv::sim
