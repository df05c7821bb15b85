// A one-line progress bar on stderr for long simulator runs. Redrawn at most ten times a second
// with a carriage return when stderr is a terminal; otherwise one line per finished task, so logs
// stay readable.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace pagedkv::sim {

class progress_bar {
 public:
  /// `total_units` of work in all (e.g. requests times runs).
  explicit progress_bar(std::size_t total_units, bool enabled = true)
      : total_(total_units == 0 ? 1 : total_units), enabled_(enabled),
        terminal_(isatty(fileno(stderr)) != 0) {}

  /// Shows `done_units` of the total and what is running now.
  void update(std::size_t done_units, const std::string& label) {
    if (!enabled_ || !terminal_) return;
    auto now = std::chrono::steady_clock::now();
    if (done_units < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int width = 40;
    const double fraction = double(std::min(done_units, total_)) / double(total_);
    const int filled = static_cast<int>(fraction * width);
    std::fprintf(stderr, "\r[%s%s] %5.1f%% %-40.40s", std::string(std::size_t(filled), '#').c_str(),
                 std::string(std::size_t(width - filled), '.').c_str(), 100 * fraction,
                 label.c_str());
    std::fflush(stderr);
  }

  /// Marks a task as finished (a line of its own when stderr is not a terminal).
  void finish_task(const std::string& label, double seconds) {
    if (!enabled_) return;
    if (terminal_) {
      std::fprintf(stderr, "\r%-100s\r", "");
    }
    std::fprintf(stderr, "done %-40s %6.2f s\n", label.c_str(), seconds);
  }

 private:
  std::size_t total_;
  bool enabled_;
  bool terminal_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace pagedkv::sim
