// Request traces from files: the user's own traffic, in JSONL or CSV, for the simulator's sweeps
// (docs/simulation.md, "Your own trace"). One record per request:
//
//   field          type             meaning
//   arrival_step   integer >= 0     the first step the request may be admitted, or instead
//   arrival_s      number >= 0      seconds, converted with step_seconds (floor)
//   prompt         token ids        the prompt itself (ids in [0, 2^30)), or instead
//   prompt_len     integer >= 1     a prompt of this many tokens, shared with no other request
//                                   except through
//   prefix_group   string           requests of one group share their first prefix_len tokens
//   prefix_len     integer >= 1     (<= prompt_len; both or neither, only with prompt_len)
//   output_len     integer >= 1     tokens each sequence generates
//   n              integer >= 1     parallel samples (default 1)
//   beam_width     integer >= 1     beams (default 1; not with n > 1)
//   priority       integer          cache priority of the request's blocks (priority_eviction)
//   session        string           multi-turn traffic: a turn of this session. Its prompt is the
//                                   session's previous prompt + previous output + this record's
//                                   prompt or prompt_len tokens (the new user message); it is
//                                   admitted after the previous turn finished
//   branch_of      string           a session's first turn may continue another session's
//                                   history instead (an agent's branches share their root's)
//
// JSONL: one object per line, blank lines skipped. CSV: a header line naming the columns, then a
// row per request; an empty cell is an absent field; `prompt` holds ids separated by spaces; a
// cell may be double-quoted ("" inside quotes is a quote). Arrivals must not decrease. Any other
// field, a wrong type, a value out of range or a missing field is a trace_error naming the line
// (1-based, the CSV header is line 1) and the field; nothing is returned then.
//
// Tokens for prompt_len and prefix_group prompts, and the outputs of session turns, are drawn in
// file order from ids >= 2^30, each once, so two requests share a block exactly when the trace
// says they share tokens: a group's i-th prefix token is the same id for all its requests, and a
// turn's prompt holds its session's earlier prompts and outputs.
#pragma once

#include "sim/workload.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagedkv::sim {

enum class trace_format { jsonl, csv };

struct trace_file_options {
  /// Seconds per simulated step, for arrival_s: a decode step of a mid-sized model (25 ms).
  double step_seconds = 0.025;
};

/// A trace record that cannot be read. what() reads "[FILE: ]trace line L, field F: problem".
class trace_error : public std::runtime_error {
 public:
  trace_error(std::size_t line, std::string field, std::string problem, const std::string& file = {})
      : std::runtime_error((file.empty() ? "" : file + ": ") + "trace line " + std::to_string(line) +
                           (field.empty() ? "" : ", field " + field) + ": " + problem),
        line_(line),
        field_(std::move(field)),
        problem_(std::move(problem)) {}
  [[nodiscard]] std::size_t line() const noexcept { return line_; }
  [[nodiscard]] const std::string& field() const noexcept { return field_; }  ///< empty: the line as a whole
  [[nodiscard]] const std::string& problem() const noexcept { return problem_; }

 private:
  std::size_t line_;
  std::string field_;
  std::string problem_;
};

/// The first token id the reader draws for prompt_len and prefix_group prompts; ids in a
/// trace's own prompts must be below it.
inline constexpr token_id first_drawn_token = token_id{1} << 30;

namespace detail {

/// One record's fields as text or JSON, before checking: what both formats reduce to.
using raw_record = std::map<std::string, nlohmann::json>;

inline const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields{"arrival_step", "arrival_s", "prompt",   "prompt_len", "prefix_group",
                                            "prefix_len",   "output_len", "n",       "beam_width", "priority",
                                            "session",      "branch_of"};
  return fields;
}

/// Builds requests from records in file order: checks each field and draws the tokens.
class trace_builder {
 public:
  explicit trace_builder(const trace_file_options& options) : options_(options) {
    if (!(options.step_seconds > 0)) {
      throw std::invalid_argument("trace_file_options: step_seconds must be > 0");
    }
  }

  void add(std::size_t line, const raw_record& record) {
    line_ = line;
    for (const auto& [name, value] : record) {
      if (!known_fields().contains(name)) fail(name, "unknown field");
    }
    request r;
    r.id = requests_.size();
    r.arrival_step = arrival(record);
    if (!requests_.empty() && r.arrival_step < requests_.back().arrival_step) {
      fail(record.contains("arrival_s") ? "arrival_s" : "arrival_step",
           "arrives at step " + std::to_string(r.arrival_step) + ", before the previous request (step " +
               std::to_string(requests_.back().arrival_step) + "): arrivals must not decrease");
    }
    r.output_len = integer(record, "output_len", 1).value_or(0);
    if (!record.contains("output_len")) fail("output_len", "missing");
    r.max_output_len = r.output_len;
    r.num_samples = integer(record, "n", 1).value_or(1);
    r.beam_width = integer(record, "beam_width", 1).value_or(1);
    if (r.num_samples > 1 && r.beam_width > 1) fail("beam_width", "n and beam_width cannot both be above 1");
    r.cache_priority = integer(record, "priority", std::numeric_limits<std::int32_t>::min()).value_or(0);
    if (record.contains("session")) {
      session_turn(record, r);
    } else {
      if (record.contains("branch_of")) fail("branch_of", "only with session: the branch is a session's first turn");
      r.prompt = prompt(record);
    }
    requests_.push_back(std::move(r));
  }

  trace take() && { return std::move(requests_); }

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw trace_error(line_, field, problem);
  }

  std::optional<std::int32_t> integer(const raw_record& record, const std::string& field, std::int64_t least) const {
    const auto it = record.find(field);
    if (it == record.end()) return std::nullopt;
    const nlohmann::json& v = it->second;
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + v.dump());
    const auto value = v.get<std::int64_t>();
    if (value < least || value > std::numeric_limits<std::int32_t>::max()) {
      fail(field, std::to_string(value) + " is out of range [" + std::to_string(least) + ", 2^31)");
    }
    return static_cast<std::int32_t>(value);
  }

  std::int64_t arrival(const raw_record& record) const {
    const bool step = record.contains("arrival_step");
    const bool seconds = record.contains("arrival_s");
    if (step == seconds) fail("arrival_step", step ? "give arrival_step or arrival_s, not both" : "missing (or arrival_s)");
    if (step) {
      const nlohmann::json& v = record.at("arrival_step");
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0) fail("arrival_step", "expected an integer >= 0, got " + v.dump());
      return v.get<std::int64_t>();
    }
    const nlohmann::json& v = record.at("arrival_s");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
      fail("arrival_s", "expected a number >= 0, got " + v.dump());
    }
    return static_cast<std::int64_t>(std::floor(v.get<double>() / options_.step_seconds));
  }

  std::vector<token_id> prompt(const raw_record& record) {
    const bool ids = record.contains("prompt");
    const auto length = integer(record, "prompt_len", 1);
    const bool grouped = record.contains("prefix_group");
    const auto prefix = integer(record, "prefix_len", 1);
    if (ids == length.has_value()) fail("prompt", ids ? "give prompt or prompt_len, not both" : "missing (or prompt_len)");
    if (grouped != prefix.has_value()) fail(grouped ? "prefix_len" : "prefix_group", "prefix_group and prefix_len go together");
    if (ids) {
      if (grouped) fail("prefix_group", "only with prompt_len: a prompt of token ids shares what its ids share");
      return token_ids(record.at("prompt"));
    }
    std::vector<token_id> tokens;
    if (grouped) {
      const nlohmann::json& key = record.at("prefix_group");
      if (!key.is_string() && !key.is_number_integer()) fail("prefix_group", "expected a string, got " + key.dump());
      if (*prefix > *length) {
        fail("prefix_len", std::to_string(*prefix) + " is longer than prompt_len " + std::to_string(*length));
      }
      std::vector<token_id>& group = groups_[key.is_string() ? key.get<std::string>() : key.dump()];
      while (std::ssize(group) < *prefix) group.push_back(draw());
      tokens.assign(group.begin(), group.begin() + *prefix);
    }
    while (std::ssize(tokens) < *length) tokens.push_back(draw());
    return tokens;
  }

  /// A session's prompt so far and the turn that made it.
  struct session_state {
    std::vector<token_id> history;  // the last turn's prompt + output
    std::uint64_t last_turn = 0;
  };

  std::string key_of(const raw_record& record, const std::string& field) const {
    const nlohmann::json& key = record.at(field);
    if (key.is_string()) return key.get<std::string>();
    if (key.is_number_integer()) return key.dump();
    fail(field, "expected a string, got " + key.dump());
  }

  /// A session turn: its prompt continues the session's (or, for a first turn with branch_of, the
  /// other session's) history, and its output tokens are drawn, for the next turn to continue.
  void session_turn(const raw_record& record, request& r) {
    const std::string session = key_of(record, "session");
    if (r.num_samples > 1 || r.beam_width > 1) {
      fail(r.num_samples > 1 ? "n" : "beam_width", "a session turn has one sequence: the next turn continues one output");
    }
    const auto own = sessions_.find(session);
    const session_state* base = own == sessions_.end() ? nullptr : &own->second;
    if (record.contains("branch_of")) {
      const std::string root = key_of(record, "branch_of");
      if (base) fail("branch_of", "only on a session's first turn: session " + session + " has turns already");
      const auto it = sessions_.find(root);
      if (it == sessions_.end()) fail("branch_of", "session " + root + " has no earlier turn");
      base = &it->second;
    }
    if (base && record.contains("prefix_group")) {
      fail("prefix_group", "only on a session's first turn: a later turn starts with its session's history");
    }
    std::vector<token_id> tokens = base ? base->history : std::vector<token_id>{};
    const std::vector<token_id> added = prompt(record);
    tokens.insert(tokens.end(), added.begin(), added.end());
    if (base) r.after = base->last_turn;
    r.output_tokens.reserve(static_cast<std::size_t>(r.output_len));
    while (std::ssize(r.output_tokens) < r.output_len) r.output_tokens.push_back(draw("output_len"));
    r.prompt = std::move(tokens);
    session_state& state = sessions_[session];
    state.history = r.prompt;
    state.history.insert(state.history.end(), r.output_tokens.begin(), r.output_tokens.end());
    state.last_turn = r.id;
  }

  std::vector<token_id> token_ids(const nlohmann::json& v) const {
    if (!v.is_array() || v.empty()) fail("prompt", "expected a non-empty list of token ids");
    std::vector<token_id> tokens;
    tokens.reserve(v.size());
    for (const nlohmann::json& t : v) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= first_drawn_token) {
        fail("prompt", "token " + std::to_string(tokens.size()) + " is " + t.dump() + ", not an id in [0, 2^30)");
      }
      tokens.push_back(static_cast<token_id>(t.get<std::int64_t>()));
    }
    return tokens;
  }

  token_id draw(const char* field = "prompt_len") {
    if (next_token_ == std::numeric_limits<token_id>::max()) fail(field, "the trace draws more than 2^30 tokens");
    return next_token_++;
  }

  trace_file_options options_;
  std::size_t line_ = 0;
  trace requests_;
  std::map<std::string, std::vector<token_id>> groups_;
  std::map<std::string, session_state> sessions_;
  token_id next_token_ = first_drawn_token;
};

/// Splits one CSV line into cells: commas separate, double quotes quote ("" is a quote).
inline std::vector<std::string> split_csv(std::string_view line, std::size_t line_number) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"' && cells.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else if (c != '\r') {
      cells.back() += c;
    }
  }
  if (quoted) throw trace_error(line_number, "", "a quoted cell is not closed");
  return cells;
}

/// A CSV cell as the JSON value it stands for: integers, numbers, id lists (prompt) or strings.
inline nlohmann::json csv_value(const std::string& field, const std::string& cell, std::size_t line) {
  if (field == "prefix_group" || field == "session" || field == "branch_of") return cell;
  if (field == "prompt") {
    nlohmann::json ids = nlohmann::json::array();
    std::size_t i = 0;
    while (i < cell.size()) {
      if (cell[i] == ' ') {
        ++i;
        continue;
      }
      std::size_t end = cell.find(' ', i);
      if (end == std::string::npos) end = cell.size();
      const std::string id = cell.substr(i, end - i);
      const nlohmann::json value = nlohmann::json::parse(id, nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded() || !value.is_number_integer()) {
        throw trace_error(line, field, "token " + std::to_string(ids.size()) + " is \"" + id + "\", not an integer");
      }
      ids.push_back(value);
      i = end;
    }
    return ids;
  }
  const nlohmann::json value = nlohmann::json::parse(cell, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || !value.is_number()) {
    throw trace_error(line, field, "expected a number, got \"" + cell + "\"");
  }
  return value;
}

}  // namespace detail

/// Reads a whole trace. Errors: trace_error naming the first bad line and field; nothing is
/// returned then. An empty trace (no records) is an error too.
inline trace read_trace(std::istream& in, trace_format format, const trace_file_options& options = {}) {
  detail::trace_builder builder(options);
  std::string line;
  std::size_t number = 0;
  std::vector<std::string> columns;
  std::size_t records = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    detail::raw_record record;
    if (format == trace_format::jsonl) {
      nlohmann::json object;
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        throw trace_error(number, "", std::string("not JSON: ") + e.what());
      }
      if (!object.is_object()) throw trace_error(number, "", "expected a JSON object, got " + object.dump());
      for (auto& [name, value] : object.items()) record.emplace(name, value);
    } else if (columns.empty()) {
      columns = detail::split_csv(line, number);
      std::set<std::string> seen;
      for (const std::string& c : columns) {
        if (!detail::known_fields().contains(c)) throw trace_error(number, c, "unknown column");
        if (!seen.insert(c).second) throw trace_error(number, c, "column named twice");
      }
      continue;
    } else {
      const std::vector<std::string> cells = detail::split_csv(line, number);
      if (cells.size() != columns.size()) {
        throw trace_error(number, "", std::to_string(cells.size()) + " cells for " + std::to_string(columns.size()) +
                                          " columns");
      }
      for (std::size_t i = 0; i < cells.size(); ++i) {
        if (!cells[i].empty()) record.emplace(columns[i], detail::csv_value(columns[i], cells[i], number));
      }
    }
    builder.add(number, record);
    ++records;
  }
  if (in.bad()) throw trace_error(number, "", "read error");
  if (records == 0) throw trace_error(number, "", "the trace holds no request");
  return std::move(builder).take();
}

/// The format a file name implies: .csv is CSV, .jsonl and .json are JSONL.
/// Errors: std::invalid_argument for another extension.
inline trace_format format_of(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".csv") return trace_format::csv;
  if (ext == ".jsonl" || ext == ".json") return trace_format::jsonl;
  throw std::invalid_argument("trace file " + path.string() + ": expected a .jsonl or .csv extension");
}

/// read_trace on a file, its format from its extension. Errors: as read_trace, with the path in
/// the message; std::invalid_argument when the file cannot be opened.
inline trace read_trace_file(const std::filesystem::path& path, const trace_file_options& options = {}) {
  const trace_format format = format_of(path);
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open trace file " + path.string());
  try {
    return read_trace(in, format, options);
  } catch (const trace_error& e) {
    throw trace_error(e.line(), e.field(), e.problem(), path.string());
  }
}

/// Writes a trace in the format read_trace reads, every prompt as its token ids, arrivals in
/// steps: a synthetic workload written out goes through the same reader as a user's trace.
/// max_output_len and the beam seed are not written (a read trace sets max_output_len to
/// output_len).
/// Errors: invalid_argument, before writing anything, for a session turn (its prompt holds drawn
/// ids, which a trace cannot give: write its records with write_records instead).
inline void write_trace(std::ostream& out, const trace& requests, trace_format format) {
  for (const request& r : requests) {
    if (r.after || !r.output_tokens.empty()) {
      throw std::invalid_argument("write_trace: request " + std::to_string(r.id) +
                                  " is a session turn; write the records that made it (write_records)");
    }
  }
  if (format == trace_format::csv) out << "arrival_step,prompt,output_len,n,beam_width,priority\n";
  for (const request& r : requests) {
    if (format == trace_format::jsonl) {
      nlohmann::json record{{"arrival_step", r.arrival_step}, {"prompt", r.prompt},       {"output_len", r.output_len},
                            {"n", r.num_samples},             {"beam_width", r.beam_width}, {"priority", r.cache_priority}};
      out << record.dump() << '\n';
    } else {
      out << r.arrival_step << ',';
      for (std::size_t i = 0; i < r.prompt.size(); ++i) out << (i ? " " : "") << r.prompt[i];
      out << ',' << r.output_len << ',' << r.num_samples << ',' << r.beam_width << ',' << r.cache_priority << '\n';
    }
  }
}

/// A trace as records (JSON objects with the fields above), as a generator makes them: what
/// write_records writes and trace_from_records reads, as read_trace would read the file.
using trace_records = std::vector<nlohmann::json>;

/// Writes records as a trace file: JSONL, one object a line, or CSV with a column for every field
/// any record has (in the order of the table above) and an empty cell where a record has none.
/// Errors: invalid_argument, before writing anything, for a record that is not an object or names
/// an unknown field.
inline void write_records(std::ostream& out, const trace_records& records, trace_format format) {
  static const std::vector<std::string> order{"arrival_step", "arrival_s", "session",    "branch_of", "prefix_group",
                                              "prefix_len",   "prompt_len", "prompt",    "output_len", "n",
                                              "beam_width",   "priority"};
  std::set<std::string> present;
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (!records[i].is_object()) throw std::invalid_argument("write_records: record " + std::to_string(i) + " is not an object");
    for (const auto& [name, value] : records[i].items()) {
      if (!detail::known_fields().contains(name)) {
        throw std::invalid_argument("write_records: record " + std::to_string(i) + " has the unknown field " + name);
      }
      present.insert(name);
    }
  }
  if (format == trace_format::jsonl) {
    for (const nlohmann::json& r : records) out << r.dump() << '\n';
    return;
  }
  std::vector<std::string> columns;
  for (const std::string& c : order) {
    if (present.contains(c)) columns.push_back(c);
  }
  for (std::size_t i = 0; i < columns.size(); ++i) out << (i ? "," : "") << columns[i];
  out << '\n';
  for (const nlohmann::json& r : records) {
    for (std::size_t i = 0; i < columns.size(); ++i) {
      if (i) out << ',';
      const auto it = r.find(columns[i]);
      if (it == r.end()) continue;
      if (it->is_string()) {
        std::string cell = it->get<std::string>();
        if (cell.find_first_of(",\"") != std::string::npos || cell.empty()) {
          std::string quoted = "\"";
          for (char c : cell) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
          cell = quoted + '"';
        }
        out << cell;
      } else if (it->is_array()) {
        for (std::size_t t = 0; t < it->size(); ++t) out << (t ? " " : "") << (*it)[t].dump();
      } else {
        out << it->dump();
      }
    }
    out << '\n';
  }
}

/// The requests that reading `records` written as a file gives (record i is line i + 1).
/// Errors: trace_error as read_trace.
inline trace trace_from_records(const trace_records& records, const trace_file_options& options = {}) {
  detail::trace_builder builder(options);
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (!records[i].is_object()) throw trace_error(i + 1, "", "expected a JSON object, got " + records[i].dump());
    detail::raw_record record;
    for (const auto& [name, value] : records[i].items()) record.emplace(name, value);
    builder.add(i + 1, record);
  }
  if (records.empty()) throw trace_error(0, "", "the trace holds no request");
  return std::move(builder).take();
}

}  // namespace pagedkv::sim
