// pagedkv-sim: replays synthetic request traces through the contiguous baselines (and, once it is
// plugged in, the paged scheduler at every block size) at one KV capacity, and writes CSV for
// bench/sim/plot.sh. docs/simulation.md describes the model and the output.
//
//   pagedkv-sim --out build/sim-results           # the default sweep
//   pagedkv-sim --workloads sharegpt --systems exact --requests 500 --out /tmp/x
//   pagedkv-sim --trace my_traffic.jsonl --out /tmp/x  # block size x capacity x eviction on a user trace
//   pagedkv-sim --workloads alpaca-prefix-80 --write-trace /tmp/alpaca.jsonl  # a workload as a trace
//   pagedkv-sim --workloads chat --sessions 150 --write-trace /tmp/chat.jsonl   # multi-turn (or agentic)
//   pagedkv-sim --hybrid --out /tmp/x  # interleaved sliding windows: window freeing on vs off
#include "sim/beam_model.hpp"
#include "sim/contiguous.hpp"
#include "sim/hybrid.hpp"
#include "sim/paged.hpp"
#include "sim/progress.hpp"
#include "sim/sessions.hpp"
#include "sim/trace_file.hpp"
#include "sim/trace_sweep.hpp"
#include "sim/workload.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace sim = pagedkv::sim;

namespace {

// ---- workloads by name: DATASET[-prefix-K | -parallel-N | -beam-K] ----

struct named_workload {
  std::string name;
  sim::workload_config config;
};

sim::workload_config parse_workload(const std::string& name, const sim::workload_config& base) {
  sim::workload_config config = base;
  auto dash = name.find('-');
  std::string dataset = name.substr(0, dash);
  if (dataset == "sharegpt") {
    config.profile = sim::sharegpt_profile;
  } else if (dataset == "alpaca") {
    config.profile = sim::alpaca_profile;
  } else {
    throw CLI::ValidationError("workload", "unknown dataset '" + dataset + "' in '" + name + "'");
  }
  if (dash == std::string::npos) return config;
  std::string rest = name.substr(dash + 1);
  auto dash2 = rest.find('-');
  if (dash2 == std::string::npos) throw CLI::ValidationError("workload", "bad name '" + name + "'");
  std::string kind = rest.substr(0, dash2);
  std::string number = rest.substr(dash2 + 1);
  int value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc{} || end != number.data() + number.size() || value < 1) {
    throw CLI::ValidationError("workload", "bad number in '" + name + "'");
  }
  if (kind == "prefix") {
    config.shared_prefix_len = value;
  } else if (kind == "parallel") {
    config.num_samples = value;
  } else if (kind == "beam") {
    config.beam_width = value;
  } else {
    throw CLI::ValidationError("workload", "unknown variant '" + kind + "' in '" + name + "'");
  }
  return config;
}

// ---- CSV output ----

void write_summary_header(std::ostream& out) {
  out << "workload,system,allocator,block_size,requests,capacity_slots,total_steps,finished_requests,"
         "throughput_requests_per_step,mean_running_sequences,max_running_sequences,preemptions,"
         "saturated_steps,kv_utilization,live_fraction,future_fraction,internal_fraction,"
         "external_fraction,idle_fraction,kv_utilization_all_steps,mean_reserved_slots,"
         "peak_reserved_slots,mean_unshared_reserved_slots,peak_unshared_reserved_slots,"
         "sharing_saving\n";
}

void write_summary_row(std::ostream& out, const std::string& workload, const std::string& system,
                       const std::string& allocator, int block_size, std::size_t requests,
                       const sim::summary& s) {
  const auto& b = s.saturated;
  out << workload << ',' << system << ',' << allocator << ',' << block_size << ',' << requests
      << ','
      << s.capacity_slots << ',' << s.total_steps << ',' << s.finished_requests << ','
      << s.throughput_requests_per_step << ',' << s.mean_running_sequences << ','
      << s.max_running_sequences << ',' << s.preemptions << ',' << b.steps << ','
      << b.kv_utilization << ',' << b.live_fraction << ',' << b.future_fraction << ','
      << b.internal_fraction << ',' << b.external_fraction << ',' << b.idle_fraction << ','
      << s.all.kv_utilization << ',' << s.mean_reserved_slots << ',' << s.peak_reserved_slots
      << ',' << s.mean_unshared_reserved_slots << ',' << s.peak_unshared_reserved_slots << ','
      << s.sharing_saving << '\n';
}

double percentile(std::vector<std::int32_t> values, double p) {
  std::ranges::sort(values);
  auto index = static_cast<std::size_t>(p * double(values.size() - 1));
  return values[index];
}

void write_workload_stats(std::ostream& out, const std::vector<named_workload>& workloads,
                          const std::map<std::string, sim::trace>& traces) {
  out << "workload,requests,sequences,mean_input,p50_input,p99_input,max_input,mean_output,"
         "p50_output,p99_output,max_output,mean_max_output,target_mean_input,target_mean_output,"
         "mu_input,sigma_input,mu_output,sigma_output,last_arrival_step\n";
  for (const auto& w : workloads) {
    const auto& t = traces.at(w.name);
    std::vector<std::int32_t> in, outl;
    double sum_in = 0, sum_out = 0, sum_max = 0;
    std::int64_t sequences = 0;
    for (const auto& r : t) {
      in.push_back(r.prompt_len());
      outl.push_back(r.output_len);
      sum_in += r.prompt_len();
      sum_out += r.output_len;
      sum_max += r.max_output_len;
      sequences += r.num_sequences();
    }
    auto n = double(t.size());
    auto fit = sim::fit_lengths(w.config.profile, w.config.max_prompt_len, w.config.max_context_len);
    out << w.name << ',' << t.size() << ',' << sequences << ',' << sum_in / n << ','
        << percentile(in, 0.5) << ',' << percentile(in, 0.99) << ',' << *std::ranges::max_element(in)
        << ',' << sum_out / n << ',' << percentile(outl, 0.5) << ',' << percentile(outl, 0.99) << ','
        << *std::ranges::max_element(outl) << ',' << sum_max / n << ','
        << w.config.profile.input.mean_tokens << ',' << w.config.profile.output.mean_tokens << ','
        << fit.mu_input << ',' << fit.sigma_input << ',' << fit.mu_output << ','
        << fit.sigma_output << ',' << t.back().arrival_step << '\n';
  }
}

// Length histograms of a large sample of each dataset, as densities per token, for the
// distribution plot (compare with Fig. 11 of the paper).
void write_length_histograms(const std::filesystem::path& dir, std::uint64_t seed) {
  for (auto [profile, bin] : {std::pair{sim::sharegpt_profile, 16}, std::pair{sim::alpaca_profile, 4}}) {
    auto t = sim::generate({.profile = profile, .num_requests = 100000, .seed = seed});
    const int max_len = profile.name == "sharegpt" ? 2048 : 512;
    std::vector<double> in(std::size_t(max_len / bin), 0), out(in.size(), 0);
    for (const auto& r : t) {
      if (auto i = std::size_t(r.prompt_len() / bin); i < in.size()) in[i] += 1;
      if (auto o = std::size_t(r.output_len / bin); o < out.size()) out[o] += 1;
    }
    std::ofstream file(dir / ("lengths_" + std::string(profile.name) + ".csv"));
    file << "bin_start_tokens,input_density,output_density\n";
    for (std::size_t i = 0; i < in.size(); ++i) {
      file << i * std::size_t(bin) << ',' << in[i] / double(t.size()) / bin << ','
           << out[i] / double(t.size()) / bin << '\n';
    }
  }
}

// How the beam model behaves at each width: how often a beam dies and how much of the beams'
// generated tokens are shared (at block size 1, after `steps` steps). The shared fraction is what
// a paged pool can save on the outputs of a beam group, prompt aside.
void write_beam_stats(std::ostream& out, std::uint64_t seed) {
  out << "beam_width,steps,trials,mean_deaths_per_step,fraction_steps_with_death,"
         "shared_output_fraction\n";
  for (std::int32_t width : {2, 4, 6}) {
    for (int steps : {16, 58, 256}) {
      constexpr int trials = 400;
      double deaths = 0, steps_with_death = 0, shared = 0;
      for (int trial = 0; trial < trials; ++trial) {
        sim::beam_model model(width, seed + std::uint64_t(trial) * 7919 + std::uint64_t(width));
        // Each beam's path as a chain of node ids; parent[node] is the node before it.
        std::vector<std::int64_t> parent;
        std::vector<std::int64_t> tips;  // node id at the end of each live beam
        (void)model.step();
        for (std::int32_t b = 0; b < width; ++b) {
          tips.push_back(std::ssize(parent));
          parent.push_back(-1);
        }
        for (int s = 1; s < steps; ++s) {
          auto parents = model.step();
          std::set<std::int32_t> distinct(parents.begin(), parents.end());
          deaths += double(width - std::ssize(distinct));
          steps_with_death += distinct.size() < std::size_t(width);
          std::vector<std::int64_t> next;
          for (auto p : parents) {
            next.push_back(std::ssize(parent));
            parent.push_back(tips[std::size_t(p)]);
          }
          tips = std::move(next);
        }
        // Distinct nodes reachable from the live tips vs width * steps logical tokens.
        std::vector<bool> live(parent.size(), false);
        std::int64_t physical = 0;
        for (auto tip : tips) {
          for (auto node = tip; node >= 0 && !live[std::size_t(node)]; node = parent[std::size_t(node)]) {
            live[std::size_t(node)] = true;
            ++physical;
          }
        }
        shared += 1.0 - double(physical) / double(std::int64_t(width) * steps);
      }
      out << width << ',' << steps << ',' << trials << ',' << deaths / (trials * (steps - 1.0))
          << ',' << steps_with_death / (trials * (steps - 1.0)) << ',' << shared / trials << '\n';
    }
  }
}

// Memory over time for one workload under the baselines (first-fit): one row per window
// of `window` steps with the window's means. Shows how a run ramps up, saturates and drains.
void write_timeline(std::ostream& out, const sim::trace& requests, const sim::scheduler_limits& limits,
                    std::int64_t window) {
  out << "system,window_start_step,live_fraction,reserved_fraction,running_sequences,"
         "waiting_requests\n";
  for (auto policy : {sim::reservation_policy::max_length, sim::reservation_policy::power_of_two,
                      sim::reservation_policy::exact}) {
    sim::contiguous_simulator simulator(requests, policy, limits);
    double live = 0, reserved = 0, running = 0, waiting = 0;
    std::int64_t in_window = 0;
    auto flush = [&] {
      const double n = double(in_window), capacity = double(limits.capacity_slots);
      out << to_string(policy) << ',' << simulator.current_step() - in_window << ','
          << live / n / capacity << ',' << reserved / n / capacity << ',' << running / n << ','
          << waiting / n << '\n';
      live = reserved = running = waiting = 0;
      in_window = 0;
    };
    while (!simulator.done()) {
      simulator.step();
      const auto& s = simulator.metrics().last_sample();
      live += double(s.live_slots);
      reserved += double(s.reserved_slots);
      running += double(s.running_sequences);
      waiting += double(s.waiting_requests);
      if (++in_window == window) flush();
    }
    if (in_window > 0) flush();
  }
}

/// trace_sweep.png: throughput, prefix hit rate and waste against block size, a line per setting
/// of the other swept values, drawn by gnuplot (Debian's gnuplot-nox) from the script
/// trace_sweep.gp, which holds the data. Written to a temporary name and renamed; without gnuplot
/// the script stays and a note says so.
void write_sweep_plot(const std::filesystem::path& dir, const std::vector<sim::sweep_row>& rows) {
  std::vector<sim::sweep_setting> settings;
  for (const sim::sweep_row& r : rows) {
    if (std::ranges::find(settings, sim::setting_of(r)) == settings.end()) settings.push_back(sim::setting_of(r));
  }
  const std::filesystem::path script = dir / "trace_sweep.gp", png = dir / "trace_sweep.png";
  {
    std::ofstream gp(script.string() + ".tmp");
    for (std::size_t i = 0; i < settings.size(); ++i) {
      gp << "$s" << i << " << EOD\n";
      for (const sim::sweep_row& r : rows) {
        if (!r.result || sim::setting_of(r) != settings[i]) continue;
        gp << r.block_size << ' ' << std::setprecision(17) << r.result->throughput_requests_per_step << ' '
           << 100 * r.result->prefix_hit_rate << ' ' << 100 * sim::waste(*r.result) << '\n';
      }
      gp << "EOD\n";
    }
    gp << "set terminal pngcairo size 1500,480 font \"DejaVu Sans,10\" noenhanced\n"
       << "set output \"" << png.string() << ".tmp\"\n"
       << "set logscale x 2\nset grid\nset key outside bottom center horizontal\nset xlabel \"block size (tokens)\"\n"
       << "set multiplot layout 1,3 title \"pagedkv-sim --trace: " << rows.size() << " runs\"\n";
    const char* panels[][2] = {{"2", "finished requests per step"}, {"3", "prefix hit rate (%)"}, {"4", "waste (%)"}};
    for (const auto& [column, title] : panels) {
      gp << "set title \"" << title << "\"\nplot ";
      for (std::size_t i = 0; i < settings.size(); ++i) {
        const sim::sweep_setting& k = settings[i];
        gp << (i ? ", " : "") << "$s" << i << " using 1:" << column << " with linespoints title \"" << k.capacity_slots
           << " slots free list " << sim::to_string(k.free_list) << (k.partial_reuse ? "" : " partial off") << ' '
           << sim::to_string(k.eviction) << " tier "
           << k.host_tier_ratio << "x "
           << k.max_running_sequences << " seqs " << k.max_tokens_per_step << " tok\"";
      }
      gp << '\n';
    }
    gp << "unset multiplot\n";
    if (!gp.flush()) throw std::runtime_error("cannot write " + script.string());
  }
  std::filesystem::rename(script.string() + ".tmp", script);
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::cerr << "pagedkv-sim: gnuplot not found (apt-get install gnuplot-nox): wrote " << script.string()
              << " only\n";
    return;
  }
  const std::string command = "gnuplot '" + script.string() + "'";
  if (std::system(command.c_str()) != 0 || !std::filesystem::exists(png.string() + ".tmp")) {
    throw std::runtime_error("gnuplot failed on " + script.string());
  }
  std::filesystem::rename(png.string() + ".tmp", png);
  std::cerr << "pagedkv-sim: wrote " << png.string() << '\n';
}

/// `--trace`: the sweep over a user's trace. The trace is read whole first (a bad line ends the
/// run before anything is written); the CSV is written to a temporary name and renamed when done.
int run_trace_mode(const std::string& path, const sim::trace_file_options& options, const sim::sweep_config& config,
                   const std::filesystem::path& dir, bool quiet, bool plot) {
  const sim::trace requests = sim::read_trace_file(path, options);
  std::cerr << "pagedkv-sim: " << path << ": " << requests.size() << " requests\n";
  std::filesystem::create_directories(dir);
  const std::size_t runs = sim::num_sweep_points(config);
  sim::progress_bar bar(requests.size() * runs, !quiet);
  const auto start = std::chrono::steady_clock::now();
  const auto rows = sim::run_trace_sweep(requests, config, [&](std::size_t done, std::size_t) {
    bar.update(done, "trace sweep");
  });
  bar.finish_task("trace sweep", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  const std::filesystem::path csv = dir / "trace_sweep.csv";
  {
    std::ofstream out(csv.string() + ".tmp");
    sim::write_sweep_csv(out, rows, requests.size());
    if (!out.flush()) throw std::runtime_error("cannot write " + csv.string());
  }
  std::filesystem::rename(csv.string() + ".tmp", csv);
  sim::print_sweep_table(std::cout, rows);
  sim::print_recommendations(std::cout, rows);
  std::cerr << "pagedkv-sim: wrote " << csv.string() << '\n';
  if (plot) write_sweep_plot(dir, rows);
  return 0;
}

/// `--hybrid`: a Gemma-2-like model (full attention and a sliding window on as many layers each)
/// over long prompts, window freeing off and on, in two settings: one sequence at a time (what
/// freeing saves per sequence) and a fixed pool (how many sequences it runs at once). Writes
/// hybrid.csv and hybrid_timeline.csv (the fixed pool, 8k-32k prompts, per step) and prints a table.
int run_hybrid_mode(const sim::hybrid_workload& base, const sim::hybrid_config& base_config, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  struct prompts {
    std::int32_t min, max;
  };
  const std::vector<prompts> ranges{{8192, 8192}, {16384, 16384}, {32768, 32768}, {8192, 32768}};
  std::ofstream csv(dir / "hybrid.csv");
  csv << "setting,prompt_min,prompt_max,window_freeing,requests,capacity_blocks,steps,preemptions,peak_window_blocks,"
         "peak_full_blocks,peak_used_blocks,mean_window_blocks,mean_full_blocks,mean_used_blocks,peak_running,mean_running,"
         "prompt_tokens,hit_tokens";
  for (std::size_t i = 0; i < pagedkv::num_miss_reasons; ++i) {
    csv << ",missed_" << pagedkv::to_string(static_cast<pagedkv::miss_reason>(i));
  }
  csv << '\n';
  std::ofstream timeline(dir / "hybrid_timeline.csv");
  timeline << "window_freeing,step,window_blocks,full_blocks,running\n";
  std::cout << "setting      prompts        freeing  steps  peak window  peak full  mean used  peak/mean running  preempt\n";
  for (const bool one_at_a_time : {true, false}) {
    for (const prompts& p : ranges) {
      sim::hybrid_summary off_result;
      for (const bool freeing : {false, true}) {
        sim::hybrid_workload w = base;
        w.min_prompt_tokens = p.min;
        w.max_prompt_tokens = p.max;
        sim::hybrid_config c = base_config;
        c.free_outside_window = freeing;
        if (one_at_a_time) {
          c.max_running_sequences = 1;
          c.capacity_slots = 2 * (std::int64_t{p.max} + w.output_tokens + c.block_size);
          c.capacity_slots += c.block_size - c.capacity_slots % c.block_size;
        }
        const bool traced = !one_at_a_time && p.min != p.max;
        std::vector<sim::hybrid_step> steps;
        const sim::hybrid_summary r = sim::run_hybrid(w, c, traced ? &steps : nullptr);
        const char* setting = one_at_a_time ? "one_at_a_time" : "fixed_pool";
        csv << setting << ',' << p.min << ',' << p.max << ',' << (freeing ? "on" : "off") << ',' << w.num_requests << ','
            << c.capacity_slots / c.block_size << ',' << r.steps << ',' << r.preemptions << ',' << r.peak_window_blocks << ','
            << r.peak_full_blocks << ',' << r.peak_used_blocks << ',' << r.mean_window_blocks << ',' << r.mean_full_blocks << ','
            << r.mean_used_blocks << ',' << r.peak_running << ',' << r.mean_running << ',' << r.misses.num_prompt_tokens << ','
            << r.misses.num_hit_tokens;
        for (std::int64_t n : r.misses.missed_tokens) csv << ',' << n;
        csv << '\n';
        for (std::size_t i = 0; i < steps.size(); ++i) {
          timeline << (freeing ? "on" : "off") << ',' << i << ',' << steps[i].window_blocks << ',' << steps[i].full_blocks
                   << ',' << steps[i].running << '\n';
        }
        std::cout << std::left << std::setw(13) << setting << std::setw(15)
                  << (std::to_string(p.min / 1024) + "k-" + std::to_string(p.max / 1024) + "k") << std::setw(9)
                  << (freeing ? "on" : "off") << std::right << std::setw(6) << r.steps << std::setw(13) << r.peak_window_blocks
                  << std::setw(11) << r.peak_full_blocks << std::setw(11) << std::fixed << std::setprecision(0)
                  << r.mean_used_blocks << std::setw(9) << r.peak_running << " / " << std::setprecision(1) << std::setw(5)
                  << r.mean_running << std::setw(9) << r.preemptions;
        if (freeing) {
          std::cout << "   window peak cut " << std::setprecision(1)
                    << 100.0 * (1.0 - double(r.peak_window_blocks) / double(off_result.peak_window_blocks))
                    << "%, mean running x" << std::setprecision(2) << r.mean_running / off_result.mean_running;
        }
        std::cout << '\n' << std::defaultfloat;
        off_result = r;
      }
    }
  }
  std::cerr << "pagedkv-sim: wrote " << (dir / "hybrid.csv").string() << ", hybrid_timeline.csv\n";
  return 0;
}

/// `--write-trace PATH`: `count` requests of workload `name`, written by `write` in PATH's format
/// (by its extension).
int write_trace_mode(const std::string& path, const std::string& name, std::size_t count,
                     const std::function<void(std::ostream&, sim::trace_format)>& write) {
  const sim::trace_format format = sim::format_of(path);
  std::ofstream out(path);
  write(out, format);
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
  std::cerr << "pagedkv-sim: wrote " << count << " requests of " << name << " to " << path << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pagedkv-sim: KV-cache memory use of paged vs contiguous allocation on synthetic "
               "traces (null model, one token per step)"};
  std::string out_dir = "build/sim-results";
  std::vector<std::string> workload_names{"sharegpt", "alpaca", "alpaca-prefix-80",
                                          "alpaca-prefix-341", "alpaca-parallel-2",
                                          "alpaca-parallel-4", "alpaca-parallel-6",
                                          "alpaca-beam-2", "alpaca-beam-4", "alpaca-beam-6"};
  std::vector<std::string> systems{"max_length", "power_of_two", "exact", "pow2_output", "paged"};
  std::vector<std::string> allocators{"first_fit", "buddy"};
  std::vector<int> block_sizes{1, 2, 4, 8, 16, 32, 64, 128, 256};
  sim::workload_config base;
  base.num_requests = 2000;
  sim::scheduler_limits limits;
  bool quiet = false;
  std::int64_t timeline_window = 500;

  app.add_option("--out", out_dir, "directory for the CSV files (created)")->capture_default_str();
  app.add_option("--workloads", workload_names,
                 "DATASET[-prefix-K|-parallel-N|-beam-K], DATASET sharegpt or alpaca")
      ->delimiter(',')->capture_default_str();
  app.add_option("--systems", systems, "max_length, power_of_two, exact, pow2_output, paged")
      ->delimiter(',')->capture_default_str()
      ->check(CLI::IsMember({"max_length", "power_of_two", "exact", "pow2_output", "paged"}));
  app.add_option("--allocators", allocators, "placement for the contiguous systems")
      ->delimiter(',')->capture_default_str()->check(CLI::IsMember({"first_fit", "buddy"}));
  app.add_option("--block-sizes", block_sizes, "paged block sizes in tokens")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(1, pagedkv::max_block_size));
  app.add_option("--requests", base.num_requests, "requests per trace")->capture_default_str()
      ->check(CLI::Range(1, 10'000'000));
  app.add_option("--rate", base.arrival_rate_per_step,
                 "Poisson arrivals per step; 0 = all at step 0 (saturation)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seed", base.seed, "trace seed")->capture_default_str();
  app.add_option("--max-context", base.max_context_len, "prompt + output limit")
      ->capture_default_str();
  app.add_option("--max-prompt", base.max_prompt_len, "prompt limit")->capture_default_str();
  app.add_option("--max-output-cap", base.max_output_cap,
                 "max output per request (what max_length reserves); 0 = up to the context limit")
      ->capture_default_str();
  app.add_option("--capacity", limits.capacity_slots, "KV capacity in token slots")
      ->capture_default_str()->check(CLI::PositiveNumber);
  std::vector<std::int32_t> max_seqs{limits.max_running_sequences};
  std::vector<std::int32_t> token_budgets{limits.max_tokens_per_step};
  app.add_option("--max-seqs", max_seqs, "max running sequences (--trace: a list to sweep)")
      ->delimiter(',')->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--token-budget", token_budgets, "max batched tokens per step (--trace: a list to sweep)")
      ->delimiter(',')->capture_default_str()->check(CLI::PositiveNumber);
  auto jobs = static_cast<std::int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--jobs", jobs, "--trace: runs at once, one thread each (default: the cores)")
      ->check(CLI::Range(1, 1024));
  bool no_plot = false;
  app.add_flag("--no-plot", no_plot, "--trace: write no trace_sweep.png");
  app.add_flag("--quiet", quiet, "no progress on stderr");
  app.add_option("--timeline-window", timeline_window,
                 "timeline.csv: first workload's memory, mean per window of N steps; 0 = none")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  std::string trace_path;
  std::string write_trace_path;
  sim::trace_file_options trace_options;
  std::vector<std::int64_t> capacities;
  std::vector<std::string> evictions{"lru", "priority"};
  std::vector<std::string> free_lists{"lifo"};
  app.add_option("--trace", trace_path,
                 "a trace file (.jsonl or .csv, docs/simulation.md): sweep --block-sizes x --capacities x "
                 "--free-lists x --evictions over it and write trace_sweep.csv instead of the synthetic comparison");
  app.add_option("--capacities", capacities, "--trace: KV capacities in token slots (default: --capacity)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--evictions", evictions,
                 "--trace: eviction policies of the device cache and host tier: lru, priority, tinylfu, ttl")
      ->delimiter(',')->capture_default_str()->check(CLI::IsMember({"lru", "priority", "tinylfu", "ttl"}));
  app.add_option("--free-lists", free_lists, "--trace: free-list policies of the device pool: lifo, fifo, extent")
      ->delimiter(',')->capture_default_str()->check(CLI::IsMember({"lifo", "fifo", "extent"}));
  std::vector<std::string> partial_reuse{"on"};
  app.add_option("--partial-reuse", partial_reuse,
                 "--trace: partial prefix hits (kv_cache_options::enable_partial_reuse): on, off or on,off")
      ->delimiter(',')->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  std::vector<double> host_tiers{0};
  app.add_option("--host-tiers", host_tiers,
                 "--trace: host tiers of the prefix cache, each a multiple of the device pool (0 = none)")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(0.0, 1024.0));
  bool write_through = false;
  app.add_flag("--write-through", write_through, "--trace: host tiers copy every block the device cache stores");
  std::int64_t ttl_steps = 1000;
  app.add_option("--ttl-steps", ttl_steps, "--trace: the TTL of --evictions ttl, in steps")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--step-seconds", trace_options.step_seconds, "--trace: seconds per step, for arrival_s")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--write-trace", write_trace_path,
                 "write the first of --workloads as a trace file (.jsonl or .csv) and exit; besides the "
                 "synthetic workloads, chat (multi-turn sessions) and agentic (fan-out tasks)");
  std::size_t sessions = 0;
  app.add_option("--sessions", sessions,
                 "--write-trace chat|agentic: sessions or tasks (default 150 chat sessions, 40 agentic tasks); "
                 "--rate, when set, is new sessions or tasks per step")
      ->check(CLI::Range(1, 1'000'000));
  bool hybrid = false;
  sim::hybrid_workload hybrid_workload;
  // 16384 blocks of 16: memory-bound at these prompt lengths (a 32k prompt holds 4128 blocks
  // without window freeing), so the run shows what freeing does to admission.
  sim::hybrid_config hybrid_config{.capacity_slots = 1 << 18};
  app.add_flag("--hybrid", hybrid,
               "interleaved sliding windows (Gemma-2-like): window freeing on vs off over long prompts, "
               "hybrid.csv instead of the synthetic comparison; with --trace, the sweep over a model of "
               "two KV cache groups, full attention and a --hybrid-window sliding window");
  app.add_option("--hybrid-requests", hybrid_workload.num_requests, "--hybrid: requests per run")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hybrid-output", hybrid_workload.output_tokens, "--hybrid: output tokens per request")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hybrid-window", hybrid_config.window_tokens, "--hybrid: sliding window in tokens")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hybrid-capacity", hybrid_config.capacity_slots,
                 "--hybrid: the fixed pool's capacity in token slots (both groups' blocks)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hybrid-block-size", hybrid_config.block_size, "--hybrid: block size")
      ->capture_default_str()->check(CLI::Range(1, pagedkv::max_block_size));
  CLI11_PARSE(app, argc, argv);

  try {
    if (hybrid && trace_path.empty()) {
      hybrid_workload.seed = base.seed;
      hybrid_config.max_running_sequences = limits.max_running_sequences;
      hybrid_config.max_tokens_per_step = limits.max_tokens_per_step;
      return run_hybrid_mode(hybrid_workload, hybrid_config, out_dir);
    }
    if (!trace_path.empty()) {
      sim::sweep_config config{.block_sizes = {block_sizes.begin(), block_sizes.end()},
                               .capacities_slots = capacities.empty() ? std::vector{limits.capacity_slots} : capacities,
                               .evictions = {},
                               .free_lists = {},
                               .host_tier_ratios = host_tiers,
                               .ttl_steps = ttl_steps,
                               .write_through = write_through,
                               .max_running_sequences = max_seqs,
                               .max_tokens_per_step = token_budgets,
                               .threads = jobs};
      for (const std::string& e : evictions) {
        config.evictions.push_back(e == "lru"        ? sim::eviction_choice::lru
                                   : e == "priority" ? sim::eviction_choice::priority
                                   : e == "tinylfu"  ? sim::eviction_choice::tinylfu
                                                     : sim::eviction_choice::ttl);
      }
      config.partial_reuse.clear();
      for (const std::string& p : partial_reuse) config.partial_reuse.push_back(p == "on");
      for (const std::string& f : free_lists) {
        config.free_lists.push_back(f == "lifo"   ? sim::free_list_choice::lifo
                                    : f == "fifo" ? sim::free_list_choice::fifo
                                                  : sim::free_list_choice::extent);
      }
      if (hybrid) {
        config.groups = {pagedkv::kv_cache_spec::full_attention(),
                         pagedkv::kv_cache_spec::sliding_window(hybrid_config.window_tokens)};
      }
      return run_trace_mode(trace_path, trace_options, config, out_dir, quiet, !no_plot);
    }
    if (max_seqs.size() != 1 || token_budgets.size() != 1) {
      throw CLI::ValidationError("--max-seqs/--token-budget", "lists are swept only with --trace");
    }
    limits.max_running_sequences = max_seqs.front();
    limits.max_tokens_per_step = token_budgets.front();
    if (!write_trace_path.empty() && (workload_names.front() == "chat" || workload_names.front() == "agentic")) {
      sim::trace_records records;
      if (workload_names.front() == "chat") {
        sim::chat_config config;
        config.seed = base.seed;
        if (sessions > 0) config.num_sessions = sessions;
        if (base.arrival_rate_per_step > 0) config.sessions_per_step = base.arrival_rate_per_step;
        records = sim::chat_records(config);
      } else {
        sim::agentic_config config;
        config.seed = base.seed;
        if (sessions > 0) config.num_tasks = sessions;
        if (base.arrival_rate_per_step > 0) config.tasks_per_step = base.arrival_rate_per_step;
        records = sim::agentic_records(config);
      }
      const sim::trace requests = sim::trace_from_records(records);  // checks what it writes
      return write_trace_mode(write_trace_path, workload_names.front(), requests.size(),
                              [&](std::ostream& out, sim::trace_format format) {
                                sim::write_records(out, records, format);
                              });
    }
    if (!write_trace_path.empty()) {
      const sim::trace requests = sim::generate(parse_workload(workload_names.front(), base));
      return write_trace_mode(write_trace_path, workload_names.front(), requests.size(),
                              [&](std::ostream& out, sim::trace_format format) {
                                sim::write_trace(out, requests, format);
                              });
    }
    std::vector<named_workload> workloads;
    std::map<std::string, sim::trace> traces;
    for (const auto& name : workload_names) {
      workloads.push_back({name, parse_workload(name, base)});
      traces.emplace(name, sim::generate(workloads.back().config));
    }
    std::filesystem::create_directories(out_dir);
    const std::filesystem::path dir(out_dir);
    {
      std::ofstream stats(dir / "workloads.csv");
      write_workload_stats(stats, workloads, traces);
      std::ofstream beams(dir / "beam_model.csv");
      write_beam_stats(beams, base.seed);
      write_length_histograms(dir, base.seed);
      if (timeline_window > 0) {
        std::ofstream timeline(dir / "timeline.csv");
        write_timeline(timeline, traces.at(workloads.front().name), limits, timeline_window);
      }
    }

    // One task per (workload, system, allocator or block size).
    struct task {
      std::string workload, system, allocator;
      int block_size;
    };
    std::vector<task> tasks;
    for (const auto& w : workloads) {
      for (const auto& system : systems) {
        if (system == "paged") {
          for (int bs : block_sizes) tasks.push_back({w.name, system, "blocks", bs});
        } else {
          for (const auto& allocator : allocators) tasks.push_back({w.name, system, allocator, 0});
        }
      }
    }
    std::size_t total_units = 0;
    for (const auto& t : tasks) total_units += traces.at(t.workload).size();

    std::ofstream summary_csv(dir / "summary.csv");
    write_summary_header(summary_csv);
    sim::progress_bar bar(total_units, !quiet);
    std::size_t units_done = 0;
    for (const auto& t : tasks) {
      const auto& requests = traces.at(t.workload);
      std::string label = t.workload + " " + t.system + " " +
                          (t.block_size > 0 ? "bs=" + std::to_string(t.block_size) : t.allocator);
      auto progress = [&](std::size_t finished, std::size_t) {
        bar.update(units_done + finished, label);
      };
      auto start = std::chrono::steady_clock::now();
      std::optional<sim::summary> result;
      if (t.system == "paged") {
        result = sim::run_paged(requests, {.block_size = t.block_size, .limits = limits}, progress);
      } else {
        auto policy = t.system == "max_length"     ? sim::reservation_policy::max_length
                      : t.system == "exact"        ? sim::reservation_policy::exact
                      : t.system == "power_of_two" ? sim::reservation_policy::power_of_two
                                                   : sim::reservation_policy::pow2_output;
        if (t.allocator == "buddy") {
          result = sim::buddy_contiguous_simulator(requests, policy, limits).run(progress);
        } else {
          result = sim::contiguous_simulator(requests, policy, limits).run(progress);
        }
      }
      units_done += requests.size();
      if (!result) continue;
      write_summary_row(summary_csv, t.workload, t.system, t.allocator, t.block_size,
                        requests.size(), *result);
      summary_csv.flush();
      bar.finish_task(label, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::cerr << "pagedkv-sim: wrote " << (dir / "summary.csv").string() << ", workloads.csv, "
              << "beam_model.csv, lengths_*.csv, timeline.csv\n";
  } catch (const std::exception& e) {
    std::cerr << "pagedkv-sim: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
