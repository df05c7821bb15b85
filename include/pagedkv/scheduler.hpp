// scheduler: iteration-level (continuous) batching over a kv_cache_manager.
//
// Every sequence has a token history (prompt, generated tokens, and the newest sampled token whose
// KV is not written yet) and a count of computed tokens. A step schedules uncomputed tokens under a
// token budget: a decode is one token, a prefill chunk is as many as the budget leaves, and both mix
// in one batch. After the engine runs the batch, complete() marks the tokens computed and asks the
// engine's sampler, once per request whose sequences produced logits, how each sequence continues.
//
// A request with n samples or beam width k is one group: its prompt is prefilled once, then forked.
// When blocks run out, whole groups are preempted, newest (by the admission policy) first.
//
// The manager is a kv_cache_manager or a hybrid_kv_cache_manager (KV cache groups: full attention,
// sliding windows, chunked local attention). One code path serves both: admission, growth, swap
// and copy-on-write count blocks over every group's table, and a plan carries each group's slots
// and table rows (num_groups rows, 1 for kv_cache_manager). Where a group frees blocks outside its
// window, prompts are allocated chunk by chunk and admission reserves what each prefill will take
// (per_chunk(); docs/design.md, "The scheduler").
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/host_tier.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/kv_cache_spec.hpp>
#include <pagedkv/prefix_lookup.hpp>
#include <pagedkv/retention.hpp>
#include <pagedkv/scheduler_policy.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

using request_id = std::uint64_t;

struct request_params {
  std::vector<token_id> prompt{};
  std::int32_t max_new_tokens = 16;  ///< per sequence (sample or beam)
  std::int32_t num_samples = 1;      ///< parallel sampling: n sequences share the prompt
  std::int32_t beam_width = 0;       ///< beam search when > 0 (then num_samples is ignored)
  std::int32_t priority = 0;         ///< for priority_admission; higher first
  std::int64_t adapter_id = 0;       ///< prefix-cache key
  std::string cache_salt{};          ///< prefix-cache key
  std::int32_t cache_priority = 0;   ///< for priority_eviction
};

struct scheduler_options {
  std::int32_t max_tokens_per_step = 2048;  ///< token budget of one batch
  std::int32_t max_num_seqs = 256;          ///< sequences running at once
  /// How long a waiting request waits for its prefix tier's store fetch (attach_prefix_tier over
  /// a tier with a store): once it has waited this many steps (schedule() calls), or this many
  /// seconds of the time source (set_time_source), whichever comes first, the fetch counts as a
  /// miss for it and it is admitted, computing the blocks still in flight. 0 turns a limit off;
  /// both 0 waits for the store however long it takes.
  std::int32_t fetch_timeout_steps = 0;
  double fetch_timeout_seconds = 10.0;
};

/// One sequence's share of a step: tokens [first_position, first_position + num_tokens) of its
/// history, which are step_plan::input_tokens[slot_offset, slot_offset + num_tokens) and whose
/// slots are slot_mapping[slot_offset, slot_offset + num_tokens) (group g's: group_slots(g)).
struct scheduled_sequence {
  request_id request = 0;
  seq_id seq = 0;
  std::int32_t first_position = 0;
  std::int32_t num_tokens = 0;
  std::size_t slot_offset = 0;
  bool produces_logits = false;  ///< the chunk reaches the end of the known history
  /// Tokens of the sequence whose K/V the step's attention reads, this chunk's included.
  [[nodiscard]] std::int32_t kv_len() const noexcept { return first_position + num_tokens; }
};

/// What the engine executes for one step, in this order: offload copies (to a prefix tier),
/// swap_out copies, swap_in copies, load copies (from a prefix tier), copy-on-write copies, then
/// the forward pass over `batch` writing K/V at `slot_mapping`. merge_copies turns a list into
/// runs of consecutive blocks.
/// The forward's inputs are all here: tokens, slots and each sequence's block-table row up to its
/// kv_len (export_dense of the tables' prefixes), valid until the next schedule(). A manager with
/// KV cache groups gives every group its own slots and rows, group after group: the layers of
/// group g write at group_slots(g) and read group_block_tables(g), where a windowed group's row
/// holds null_block before its window. With one group (kv_cache_manager) these are the whole
/// slot_mapping and block_tables.
struct step_plan {
  std::vector<scheduled_sequence> batch{};
  std::vector<slot_id> slot_mapping{};  ///< [num_groups, num_tokens] where each token's K/V goes
  std::vector<token_id> input_tokens{}; ///< [num_tokens] the tokens the forward computes
  std::vector<block_id> block_tables{}; ///< [num_groups, batch.size(), max_blocks_per_seq] row i
                                        ///< of a group: batch[i]'s blocks up to its kv_len,
                                        ///< null_block padded
  std::vector<std::int32_t> kv_lens{};  ///< [batch.size()] batch[i].kv_len()
  std::int32_t max_blocks_per_seq = 0;
  std::int32_t num_groups = 1;          ///< KV cache groups (the manager's)
  std::vector<block_copy> copies{};    ///< device -> device (copy-on-write)
  std::vector<block_copy> swap_out{};  ///< device -> host
  std::vector<block_copy> swap_in{};   ///< host -> device
  std::vector<block_copy> offload{};   ///< device -> prefix tier host blocks (attach_prefix_tier)
  std::vector<block_copy> load{};      ///< prefix tier host blocks -> device, before the prefill
  std::vector<request_id> preempted{};
  std::vector<request_id> rejected{};  ///< requests this step found can never fit: they are over
  std::int32_t num_tokens = 0;
  [[nodiscard]] bool empty() const noexcept { return batch.empty(); }
  /// Group `group`'s slots: [num_tokens], indexed like input_tokens.
  [[nodiscard]] std::span<const slot_id> group_slots(std::int32_t group) const {
    const auto n = static_cast<std::size_t>(num_tokens);
    return std::span<const slot_id>(slot_mapping).subspan(static_cast<std::size_t>(group) * n, n);
  }
  /// Group `group`'s table rows: [batch.size(), max_blocks_per_seq].
  [[nodiscard]] std::span<const block_id> group_block_tables(std::int32_t group) const {
    const std::size_t n = batch.size() * static_cast<std::size_t>(max_blocks_per_seq);
    return std::span<const block_id>(block_tables).subspan(static_cast<std::size_t>(group) * n, n);
  }
};

namespace detail {
/// A manager with KV cache groups (hybrid_kv_cache_manager): a block table per group per sequence.
template <class Manager>
concept grouped_kv_manager = requires(const Manager& m, seq_id seq, std::int32_t group) {
  { m.num_groups() } -> std::convertible_to<std::int32_t>;
  { m.table(seq, group) } -> std::same_as<const block_table&>;
};
}  // namespace detail

/// How one sequence continues after a step: `parent` gets `token` appended. A parent listed twice
/// is forked; a parent that produced logits but is not listed is dropped (a pruned beam). `stop`
/// ends the sequence with this token (EOS, stop string).
struct continuation {
  seq_id parent = 0;
  token_id token = 0;
  bool stop = false;
};

/// What the sampler sees of one request: the sequences that produced logits this step, which are
/// all its live sequences, listed in the order of the continuations that made them last time (so a
/// beam search's beam j is seqs[j]).
struct sampling_request {
  request_id request = 0;
  const request_params* params = nullptr;
  std::span<const seq_id> seqs{};
  bool first = false;  ///< the prompt just finished: fork into num_samples / beam_width sequences
};

enum class request_state { waiting, running, swapped, finished, aborted, rejected };

/// What the scheduler has done since it was made, for metrics and for tests that must show a path ran.
struct scheduler_stats {
  std::int64_t preempted_by_swap = 0;
  std::int64_t preempted_by_recompute = 0;  ///< with preempt_by_swap: the host pool was short
  std::int64_t rejected_at_admission = 0;   ///< the request cannot fit even an empty pool
  std::int64_t rejected_running = 0;        ///< running alone, it outgrew the pool
  std::int64_t loaded_tokens = 0;           ///< prompt tokens loaded from the prefix tier
  std::int64_t fetch_waits = 0;             ///< admissions put off while the tier fetched from its store
  std::int64_t fetch_timeouts = 0;          ///< requests that stopped waiting for a fetch (a miss)
  std::int64_t retention_waits = 0;         ///< steps a request (running alone, or first in line)
                                            ///< waited for idle blocks within a TTL to expire
  std::int64_t shared_tokens = 0;           ///< prompt tokens shared with a request still computing them
  std::int64_t waiters_released = 0;        ///< sequences whose source left before computing their prefix
};

struct request_output {
  request_state state = request_state::waiting;
  std::vector<std::vector<token_id>> sequences{};  ///< generated tokens of each finished sequence
  std::vector<seq_id> sequence_ids{};              ///< the id of each of `sequences`
  std::int32_t num_prompt_tokens = 0;
  std::int32_t num_preemptions = 0;
  std::int32_t num_cached_prompt_tokens = 0;     ///< at first admission
  std::int32_t num_loaded_prompt_tokens = 0;     ///< at first admission, from the prefix tier
  prefix_lookup cache_lookup{};  ///< at first admission: the device cache's hit and why the rest missed
                                 ///< (before the prefix tier's load, whose tokens count as missed here)
};

template <admission_policy Admission = fcfs_admission, preemption_policy Preemption = preempt_by_recompute,
          class Manager = kv_cache_manager<>>
class scheduler {
 public:
  using manager_type = Manager;
  using manager_options = typename Manager::options_type;

  /// Errors: invalid_argument for a budget or sequence limit below 1, or a negative fetch timeout;
  /// the manager's.
  scheduler(const scheduler_options& options, const manager_options& kv_options)
      : options_(options), kv_(kv_options), frees_window_(frees_window(kv_)) {
    if (options.max_tokens_per_step < 1 || options.max_num_seqs < 1) {
      detail::fail(errc::invalid_argument, "scheduler needs max_tokens_per_step and max_num_seqs >= 1, got ",
                   options.max_tokens_per_step, " and ", options.max_num_seqs);
    }
    if (options.fetch_timeout_steps < 0 || !(options.fetch_timeout_seconds >= 0.0)) {
      detail::fail(errc::invalid_argument, "scheduler fetch timeouts must be >= 0, got ", options.fetch_timeout_steps,
                   " steps and ", options.fetch_timeout_seconds, " seconds");
    }
  }

  [[nodiscard]] const Manager& kv() const noexcept { return kv_; }
  [[nodiscard]] Manager& kv() noexcept { return kv_; }
  [[nodiscard]] const scheduler_options& options() const noexcept { return options_; }
  /// The manager's KV cache groups: 1 for kv_cache_manager.
  [[nodiscard]] std::int32_t num_groups() const noexcept {
    if constexpr (grouped) {
      return kv_.num_groups();
    } else {
      return 1;
    }
  }
  /// Group `group`'s block table of sequence `seq` (kv_cache_manager: its one table).
  [[nodiscard]] const block_table& table(seq_id seq, std::int32_t group = 0) const {
    if constexpr (grouped) {
      return kv_.table(seq, group);
    } else {
      return kv_.table(seq);
    }
  }
  /// The prefix cache lookups of every allocation so far, by miss reason (the manager's totals: a
  /// group's later samples and re-admissions after a preemption count too).
  [[nodiscard]] const prefix_lookup& miss_totals() const noexcept { return kv_.miss_totals(); }

  /// Puts a second-level prefix tier (host_prefix_tier) under the manager's cache: it listens to
  /// the cache's events (replacing any callback; chain your own in a lambda that calls
  /// tier.observe), every admission loads the blocks it holds after the device hit (plan.load,
  /// accounted like a swap-in: the blocks are the allocation's, the tokens are not computed), every
  /// plan carries the offloads planned since the last one (plan.offload), and complete() tells the
  /// tier the plan's copies ran. With a store under the tier (attach_store), a waiting request
  /// first fetches its blocks from the store into the tier and is admitted once none is in flight
  /// (until then it waits, and the requests behind it with it, as when blocks are short), or once
  /// it has waited scheduler_options' fetch timeout, computing what has not arrived; each
  /// schedule() polls the store. The tier must outlive the scheduler or a detach_prefix_tier().
  template <class Tier>
  void attach_prefix_tier(Tier& tier) {
    kv_.cache().set_event_callback([&tier](const cache_event& e) { tier.observe(e); });
    tier_ = {.load = [&tier](Manager& kv, seq_id seq, const prefix_key& key) { return tier.load(kv, seq, key); },
             .fetch = [&tier](const Manager& kv, std::span<const token_id> tokens,
                              const prefix_key& key) { return tier.fetch(kv.cache(), tokens, key); },
             .poll = [&tier] { tier.poll(); },
             .take_offloads = [&tier] { return tier.take_offloads(); },
             .complete = [&tier] { tier.complete(); }};
  }
  /// Where a TTL in seconds (ttl_eviction with manual_clock) gets its time: each schedule() sets
  /// the clock to `seconds()`. The default counts seconds of std::chrono::steady_clock since the
  /// scheduler was made; a simulator or a test injects its own. A TTL in steps (step_clock) needs
  /// nothing: each schedule() is one step.
  void set_time_source(std::function<double()> seconds) { time_source_ = std::move(seconds); }

  void detach_prefix_tier() {
    kv_.cache().set_event_callback({});
    tier_ = {};
  }

  /// Queues a request. Errors: duplicate_sequence if the id is in use; invalid_argument for an
  /// empty prompt or a count below 1.
  void add_request(request_id id, request_params params) {
    if (groups_.contains(id) || outputs_.contains(id)) {
      detail::fail(errc::duplicate_sequence, "add_request of request ", id, " which already exists");
    }
    if (params.prompt.empty() || params.max_new_tokens < 1 || params.num_samples < 1 || params.beam_width < 0) {
      detail::fail(errc::invalid_argument, "request ", id, ": prompt of ", params.prompt.size(),
                   " tokens, max_new_tokens ", params.max_new_tokens, ", num_samples ", params.num_samples,
                   ", beam_width ", params.beam_width);
    }
    group g{.id = id, .key = {params.priority, next_arrival_++}, .params = std::move(params)};
    g.seqs.push_back({.id = next_seq_++, .tokens = g.params.prompt});
    groups_.emplace(id, std::move(g));
    outputs_[id].state = request_state::waiting;
    outputs_[id].num_prompt_tokens = static_cast<std::int32_t>(groups_.at(id).params.prompt.size());
    insert_sorted(waiting_, id);
  }

  /// Removes a request wherever it is; its blocks are freed at once. Returns false for an id that
  /// is unknown or already over.
  bool abort(request_id id) {
    const auto it = groups_.find(id);
    if (it == groups_.end()) return false;
    stop_reserving(it->second);
    release(it->second);
    std::erase(waiting_, id);
    std::erase(running_, id);
    std::erase(swapped_, id);
    outputs_[id].state = request_state::aborted;
    groups_.erase(it);
    recount_reserved();  // its blocks may have been shared with a running prefill's window
    return true;
  }

  [[nodiscard]] bool has_unfinished() const noexcept { return !groups_.empty(); }
  /// Whether the last schedule() left a request waiting for idle blocks that a retention policy
  /// holds (ttl_eviction): not a deadlock, as the next steps move the policy's clock. An engine
  /// that sees an empty plan with this false has requests that cannot run.
  [[nodiscard]] bool waiting_for_retention() const noexcept { return retention_wait_; }
  [[nodiscard]] std::size_t num_waiting() const noexcept { return waiting_.size(); }
  [[nodiscard]] std::size_t num_running() const noexcept { return running_.size(); }
  [[nodiscard]] std::size_t num_swapped() const noexcept { return swapped_.size(); }
  [[nodiscard]] std::int32_t num_running_seqs() const {
    std::int32_t n = 0;
    for (request_id id : running_) n += static_cast<std::int32_t>(groups_.at(id).seqs.size());
    return n;
  }
  [[nodiscard]] std::int64_t num_preemptions() const noexcept {
    return stats_.preempted_by_swap + stats_.preempted_by_recompute;
  }
  [[nodiscard]] const scheduler_stats& stats() const noexcept { return stats_; }
  /// Device blocks set aside for the rest of the running prefills. With a KV cache group that
  /// frees blocks outside its window, a prompt is allocated chunk by chunk and admission reserves
  /// what the rest of its prefill will take (at most a window and a chunk in a windowed group); 0
  /// otherwise. After schedule(), num_free_blocks() of the manager is at least this. Kept as the
  /// requests move, over the running prefills only; count_reserved_blocks() counts it afresh.
  [[nodiscard]] std::int32_t num_reserved_blocks() const noexcept { return reserved_; }
  /// num_reserved_blocks() counted afresh over every running request's tables, for checks (the
  /// testing kit's): equal to it whenever no call is in progress.
  [[nodiscard]] std::int32_t count_reserved_blocks() const {
    std::int32_t n = 0;
    for (request_id id : running_) n += blocks_reserved(groups_.at(id));
    return n;
  }
  /// The request's state and outputs; kept after it ends until forget(). Errors: unknown_sequence.
  [[nodiscard]] const request_output& output(request_id id) const {
    const auto it = outputs_.find(id);
    if (it == outputs_.end()) detail::fail(errc::unknown_sequence, "output of unknown request ", id);
    return it->second;
  }
  void forget(request_id id) {
    if (!groups_.contains(id)) outputs_.erase(id);
  }
  /// The live sequences of a request that has not ended, in continuation order: what its next
  /// sampling_request lists (before the first sampling, the prompt's one sequence). A sampler that
  /// acts when a row is computed, before complete(), finds a sequence's sample here.
  /// Errors: unknown_sequence for a request never added, or finished, aborted or rejected.
  [[nodiscard]] std::vector<seq_id> sequences(request_id id) const {
    const auto it = groups_.find(id);
    if (it == groups_.end()) detail::fail(errc::unknown_sequence, "sequences of request ", id, " which is not live");
    return seq_ids(it->second);
  }

  /// Sets a sampled token that complete() was given as a stand-in: an engine that schedules step
  /// t+1 before step t's tokens reach the host (asynchronous scheduling) completes t with
  /// stand-ins, and sets each real token once it arrives, before the step that computes it is
  /// completed. `position` indexes the sequence's whole history (prompt first). Where the sequence
  /// still runs, its history and the manager's are set (kv_cache_manager::set_token: the token's
  /// KV must not be computed yet); where it was preempted, its history; where it has finished, its
  /// output in output(request).sequences.
  /// Errors: unknown_sequence for a request or sequence that is not there; invalid_argument for a
  /// position outside the history or a computed one. Nothing changes then.
  void set_token(request_id request, seq_id seq, std::int32_t position, token_id token) {
    const auto prompt_size = [&](const request_params& p) { return static_cast<std::int32_t>(p.prompt.size()); };
    if (const auto it = groups_.find(request); it != groups_.end()) {
      group& g = it->second;
      const auto s = std::find_if(g.seqs.begin(), g.seqs.end(), [&](const sequence& x) { return x.id == seq; });
      if (s != g.seqs.end()) {
        if (position < prompt_size(g.params) || position >= static_cast<std::int32_t>(s->tokens.size())) {
          detail::fail(errc::invalid_argument, "set_token at position ", position, " of sequence ", seq, ": it holds ",
                       s->tokens.size(), " tokens, ", prompt_size(g.params), " of them the prompt");
        }
        if (kv_.contains(seq) && position < kv_.num_tokens(seq)) kv_.set_token(seq, position, token);  // checks first
        s->tokens[static_cast<std::size_t>(position)] = token;
        return;
      }
    }
    const auto out = outputs_.find(request);
    if (out != outputs_.end()) {
      request_output& o = out->second;
      const auto at = std::find(o.sequence_ids.begin(), o.sequence_ids.end(), seq);
      if (at != o.sequence_ids.end()) {
        std::vector<token_id>& generated = o.sequences[static_cast<std::size_t>(at - o.sequence_ids.begin())];
        const std::int32_t prompt = o.num_prompt_tokens;
        const std::int32_t index = position - prompt;
        if (index < 0 || index >= static_cast<std::int32_t>(generated.size())) {
          detail::fail(errc::invalid_argument, "set_token at position ", position, " of finished sequence ", seq,
                       ": it generated ", generated.size(), " tokens after a prompt of ", prompt);
        }
        generated[static_cast<std::size_t>(index)] = token;
        return;
      }
    }
    detail::fail(errc::unknown_sequence, "set_token of sequence ", seq, " of request ", request, " which is not there");
  }

  /// Plans the next step. An empty plan means nothing can run now: no request, none fits, or
  /// waiting_for_retention() (time will free the blocks a request needs).
  /// Running decodes come first, then prefill chunks of running requests with the budget left, so
  /// a long prompt never starves decodes; then swapped and waiting requests are admitted. Each
  /// call is one step of the cache's retention clocks (ttl_eviction's step_clock or manual_clock).
  step_plan schedule() {
    ++step_;
    now_seconds_ = time_source_ ? time_source_() : 0.0;
    if constexpr (requires { kv_.cache().eviction_queue(); }) {
      detail::tick_retention_clocks(kv_.cache().eviction_queue(), now_seconds_);
    }
    if (tier_.poll) tier_.poll();
    step_plan plan;
    retention_wait_ = false;
    std::int32_t budget = options_.max_tokens_per_step;
    for (const bool decodes : {true, false}) {
      for (std::size_t i = 0; i < running_.size() && budget > 0;) {
        if (is_decoding(groups_.at(running_[i])) != decodes || schedule_group(i, plan, budget)) ++i;
        // else running_[i] left running_ and the next group took its index
      }
    }
    if (plan.preempted.empty() && !retention_wait_) {  // a request short of blocks goes first
      admit_swapped(plan, budget);
      admit_waiting(plan, budget);
    }
    plan.num_tokens = options_.max_tokens_per_step - budget;
    export_forward_inputs(plan);
    plan.rejected = std::exchange(rejected_, {});
    if (tier_.take_offloads) plan.offload = tier_.take_offloads();
    return plan;
  }

  /// Marks the plan's tokens computed, then calls `sample(const sampling_request&)`, which returns
  /// a std::vector<continuation>, for every request whose sequences produced logits. Returns the
  /// requests that finished.
  /// Errors: invalid_argument if a continuation names a sequence that did not produce logits, or a
  /// first sampling returns a count other than n (or 1..k beams). That request is aborted, every
  /// other request of the step is completed, and then the error is thrown (output() still tells
  /// which requests finished).
  template <class Sampler>
  std::vector<request_id> complete(const step_plan& plan, Sampler&& sample) {
    if (tier_.complete) tier_.complete();  // the plan's copies ran
    std::vector<request_id> with_logits;
    for (const scheduled_sequence& s : plan.batch) {
      if (!kv_.contains(s.seq)) continue;  // aborted in between
      kv_.mark_computed(s.seq, s.first_position + s.num_tokens);
      if (s.produces_logits && std::find(with_logits.begin(), with_logits.end(), s.request) == with_logits.end()) {
        with_logits.push_back(s.request);
      }
    }
    std::vector<request_id> finished;
    std::optional<error> failure;
    for (request_id id : with_logits) {
      const auto it = groups_.find(id);
      if (it == groups_.end()) continue;  // aborted in between
      group& g = it->second;
      // A group samples when all its sequences are computed (beams re-prefilled after a recompute
      // preemption wait for each other).
      std::vector<seq_id> ready;
      for (const sequence& s : g.seqs) {
        if (!kv_.contains(s.id) || kv_.num_computed_tokens(s.id) != static_cast<std::int32_t>(s.tokens.size())) break;
        ready.push_back(s.id);
      }
      if (ready.size() != g.seqs.size()) continue;
      const sampling_request request{id, &g.params, ready, !g.sampled};
      try {
        apply(g, ready, sample(request));
      } catch (const error& e) {
        if (!failure) failure = e;
        abort(id);
        continue;
      }
      if (g.seqs.empty()) {
        stop_reserving(g);
        outputs_[id].state = request_state::finished;
        std::erase(running_, id);
        groups_.erase(it);
        finished.push_back(id);
      }
    }
    recount_reserved();  // the windows moved, prefills took their chunks, requests left
    if (failure) throw *failure;
    return finished;
  }

 private:
  struct sequence {
    seq_id id = 0;
    std::vector<token_id> tokens{};  // the whole history, including a sampled token not yet computed
    // After a recompute preemption, the first shared_tokens tokens sit in blocks of `lead`, which
    // computes them; this sequence waits for that instead of computing them again.
    seq_id lead = 0;
    std::int32_t shared_tokens = 0;
  };

  struct group {
    request_id id = 0;
    admission_key key{};
    request_params params{};
    std::vector<sequence> seqs{};  // live sequences
    bool sampled = false;        // the prompt's logits were sampled (forks done)
    bool admitted_once = false;
    std::int64_t fetch_since_step = 0;  // when it began waiting for a store fetch; 0: not waiting
    double fetch_since_seconds = 0.0;
    bool fetch_timed_out = false;  // it waited its fetch_timeout: it does not wait for fetches again
    bool reserving = false;        // in reserving_
    std::int32_t reserved = 0;     // its blocks_reserved when last counted, while reserving
  };

  static constexpr bool grouped = detail::grouped_kv_manager<Manager>;

  /// Appends `tokens` to `seq` in every group; the copy-on-write copies go to `copies`.
  void append_tokens(seq_id seq, std::span<const token_id> tokens, std::vector<block_copy>& copies) {
    append_slots_.resize(tokens.size() * static_cast<std::size_t>(num_groups()));
    const auto made = kv_.append(seq, tokens, append_slots_);
    if constexpr (grouped) {
      copies.insert(copies.end(), made.begin(), made.end());
    } else if (made) {
      copies.push_back(*made);
    }
  }

  [[nodiscard]] std::int32_t max_seqs(const group& g) const {
    return g.params.beam_width > 0 ? g.params.beam_width : g.params.num_samples;
  }
  /// Sequences the group may run at once from now on: n before its prompt is sampled and forked,
  /// the live samples after; always k for beams, whose sampler may fork pruned beams back to k.
  [[nodiscard]] std::int32_t group_seq_budget(const group& g) const {
    return g.sampled && g.params.beam_width == 0 ? static_cast<std::int32_t>(g.seqs.size()) : max_seqs(g);
  }
  /// Sequence slots that running groups hold, counted by group_seq_budget.
  [[nodiscard]] std::int32_t reserved_seqs() const {
    std::int32_t n = 0;
    for (request_id id : running_) n += group_seq_budget(groups_.at(id));
    return n;
  }
  [[nodiscard]] sequence_options seq_options(const group& g) const {
    return {.key = {g.params.adapter_id, g.params.cache_salt}, .cache_priority = g.params.cache_priority};
  }

  /// Inserts `id` in admission order; returns its index.
  std::size_t insert_sorted(std::vector<request_id>& queue, request_id id) {
    const admission_key key = groups_.at(id).key;
    const auto pos = std::find_if(queue.begin(), queue.end(),
                                  [&](request_id other) { return Admission::before(key, groups_.at(other).key); });
    const auto inserted = queue.insert(pos, id);  // may reallocate: take begin() after it
    return static_cast<std::size_t>(inserted - queue.begin());
  }

  [[nodiscard]] std::int32_t swap_in_blocks(std::span<const seq_id> seqs) const {
    std::vector<block_id> blocks;
    for (seq_id seq : seqs) {
      for (std::int32_t k = 0; k < num_groups(); ++k) {
        for (block_id b : table(seq, k).blocks()) {
          if (b != null_block) blocks.push_back(b);  // released outside a window
        }
      }
    }
    std::sort(blocks.begin(), blocks.end());
    return static_cast<std::int32_t>(std::unique(blocks.begin(), blocks.end()) - blocks.begin());
  }

  /// Whether every sequence of the group has exactly one token to compute: its sampled token.
  [[nodiscard]] bool is_decoding(const group& g) const {
    return std::all_of(g.seqs.begin(), g.seqs.end(), [&](const sequence& s) {
      return static_cast<std::int32_t>(s.tokens.size()) - kv_.num_computed_tokens(s.id) == 1;
    });
  }
  /// The fewest tokens the group can run in a step: beams and samples decode together, one token
  /// each, all or none; a prefill can run a chunk of one token.
  [[nodiscard]] std::int32_t min_step_tokens(const group& g) const {
    return is_decoding(g) ? static_cast<std::int32_t>(g.seqs.size()) : 1;
  }

  /// Device blocks the group's appends of sampled tokens take, over every KV cache group's table.
  /// Sequences that share a partly filled last block copy it on write in turn until one holds it
  /// alone: m of them sharing a block that r tables reference make min(m, r - 1) copies.
  /// Allocating chunk by chunk (per_chunk()), a prefill counts only the tokens `budget` lets it
  /// compute this step.
  [[nodiscard]] std::int32_t blocks_to_append(const group& g, std::int32_t budget) const {
    std::int32_t n = 0;
    std::unordered_map<block_id, std::int32_t> copy_on_write;  // shared last block -> appenders
    const auto& pool = kv_.where(g.seqs.front().id) == location::device ? kv_.device_pool() : kv_.host_pool();
    for (const sequence& s : g.seqs) {
      const std::int32_t missing = to_allocate(s, budget);
      if (missing <= 0) continue;
      for (std::int32_t k = 0; k < num_groups(); ++k) {
        const block_table& t = table(s.id, k);
        n += t.blocks_needed(missing);
        // A partly filled last block that another table or the cache holds (the managers' rule).
        if (const std::int32_t fill = t.last_block_len(); fill > 0 && fill < kv_.block_size()) {
          if (const block_id last = t.block(t.num_blocks() - 1); pool.ref_count(last) > 1) ++copy_on_write[last];
        }
      }
    }
    for (const auto& [block, appenders] : copy_on_write) n += std::min(appenders, pool.ref_count(block) - 1);
    return n;
  }
  /// Whether `g`, whose fetch is in flight, has waited its fetch timeout (starting the wait's clock
  /// on its first call).
  bool fetch_waited_out(group& g) const {
    if (g.fetch_since_step == 0) {
      g.fetch_since_step = step_;
      g.fetch_since_seconds = now_seconds_;
    }
    const std::int32_t steps = options_.fetch_timeout_steps;
    const double seconds = options_.fetch_timeout_seconds;
    return (steps > 0 && step_ - g.fetch_since_step >= steps) ||
           (seconds > 0.0 && now_seconds_ - g.fetch_since_seconds >= seconds);
  }
  /// An admission that waits for `needed` free blocks waits for a TTL when held blocks would make
  /// up the shortfall.
  void note_retention_wait(std::int32_t needed) {
    const std::int32_t free = kv_.num_free_blocks();
    if (needed > free && needed <= free + num_held_blocks()) {
      retention_wait_ = true;
      ++stats_.retention_waits;
    }
  }
  /// Idle device blocks a retention policy holds and time releases (the manager's, where it tells).
  [[nodiscard]] std::int32_t num_held_blocks() const {
    if constexpr (requires { kv_.num_held_blocks(); }) {
      return kv_.num_held_blocks();
    } else {
      return 0;
    }
  }
  [[nodiscard]] std::int32_t unallocated(const sequence& s) const {
    return static_cast<std::int32_t>(s.tokens.size()) - kv_.num_tokens(s.id);
  }
  /// The tokens of `s` to allocate before it computes up to `chunk` tokens: all it has not
  /// allocated, or, chunk by chunk (per_chunk()), those up to the chunk's end.
  [[nodiscard]] std::int32_t to_allocate(const sequence& s, std::int32_t chunk) const {
    const std::int32_t missing = unallocated(s);
    if (!per_chunk() || missing <= 0) return missing;
    return std::min(missing, kv_.num_computed_tokens(s.id) + chunk - kv_.num_tokens(s.id));
  }

  /// Per-chunk allocation (a KV cache group frees blocks outside its window): a sequence holds only
  /// the blocks up to the chunk it computes, so a windowed group never holds a whole long prompt
  /// through its prefill. What the rest of a prefill will take is reserved instead: admission
  /// counts every running prefill's reservation as taken, and a step's appends leave the others'
  /// reservations alone, so a prefill once admitted always finds its next chunk's blocks.
  [[nodiscard]] bool per_chunk() const noexcept {
    if constexpr (grouped) {
      return frees_window_;
    } else {
      return false;
    }
  }
  /// Device blocks `s` may still take to allocate the rest of its history chunk by chunk: 0
  /// without per_chunk(), or with one token left to compute (a decode's block is not reserved).
  /// A full group takes every block left; a windowed group at most max_window_blocks at once, of
  /// which it already holds those that no other table holds (it gives them back as the window
  /// moves; a block it shares stays taken when it lets go).
  [[nodiscard]] std::int32_t blocks_reserved(const sequence& s) const {
    if constexpr (grouped) {
      if (!may_reserve(s)) return 0;
      const auto target = static_cast<std::int32_t>(s.tokens.size());
      const std::int32_t held = kv_.num_tokens(s.id);
      const bool on_device = kv_.where(s.id) == location::device;
      const auto& pool = on_device ? kv_.device_pool() : kv_.host_pool();
      std::int32_t n = 0;
      for (std::int32_t k = 0; k < num_groups(); ++k) {
        const block_table& t = kv_.table(s.id, k);
        std::int32_t need = t.blocks_needed(target - held);
        if (const std::int32_t span = kv_.max_window_blocks(k, options_.max_tokens_per_step);
            need > 0 && span < std::numeric_limits<std::int32_t>::max()) {
          std::int32_t alone = 0;
          for (block_id b : t.blocks()) {
            alone += b != null_block && pool.ref_count(b) - (on_device && kv_.cache().contains(b) ? 1 : 0) == 1 ? 1 : 0;
          }
          need = std::min(need, std::max(0, span - alone));
        }
        n += need;
      }
      return n;
    } else {
      return 0;
    }
  }
  [[nodiscard]] std::int32_t blocks_reserved(const group& g) const {
    std::int32_t n = 0;
    if (per_chunk()) {
      for (const sequence& s : g.seqs) n += blocks_reserved(s);
    }
    return n;
  }
  /// Whether `s` may reserve blocks (blocks_reserved): chunk by chunk, it has more than one token
  /// left to compute and does not hold its whole history. Once false, it stays so while its group
  /// runs: computed and held tokens only grow, and a sampled token (or a fork) leaves one to compute.
  [[nodiscard]] bool may_reserve(const sequence& s) const {
    if (!per_chunk() || !kv_.contains(s.id)) return false;
    const auto target = static_cast<std::int32_t>(s.tokens.size());
    return target - kv_.num_computed_tokens(s.id) > 1 && kv_.num_tokens(s.id) < target;
  }

  // The running prefills' reservations (per_chunk()). reserving_ lists the running groups that may
  // reserve: a group joins when admitted or swapped in with a sequence that may_reserve, and leaves
  // when it stops running or, at a recount, when none of its sequences may any more. A group's
  // reservation cannot be kept by its own moves alone: a windowed block counts as the prefill's
  // own only while no other table or partial hit holds it, so another request's admission, window
  // release or end changes it. reserved_ is the sum of the members' counts: a step's chunk updates
  // its group's (schedule_group: its appends take fresh blocks, which nobody else holds), and the
  // calls where holders change recount the members (recount_reserved), never the decodes.

  /// Adds a group that starts running to reserving_ if it may reserve.
  void start_reserving(group& g) {
    if (!std::any_of(g.seqs.begin(), g.seqs.end(), [&](const sequence& s) { return may_reserve(s); })) return;
    g.reserving = true;
    g.reserved = blocks_reserved(g);
    reserved_ += g.reserved;
    reserving_.push_back(g.id);
  }
  /// Takes a group that stops running (preempted, rejected, aborted, finished) out of reserving_.
  void stop_reserving(group& g) {
    if (!g.reserving) return;
    reserved_ -= g.reserved;
    g.reserving = false;
    g.reserved = 0;
    std::erase(reserving_, g.id);
  }
  /// Updates `g`'s count after its own allocation.
  void update_reserved(group& g) {
    if (!g.reserving) return;
    const std::int32_t now = blocks_reserved(g);
    reserved_ += now - g.reserved;
    g.reserved = now;
  }
  /// Recounts the members of reserving_, after calls that may change who holds a prefill's blocks,
  /// and drops those that can no longer reserve.
  void recount_reserved() {
    reserved_ = 0;
    std::erase_if(reserving_, [&](request_id id) {
      group& g = groups_.at(id);
      g.reserved = blocks_reserved(g);
      reserved_ += g.reserved;
      g.reserving = std::any_of(g.seqs.begin(), g.seqs.end(), [&](const sequence& s) { return may_reserve(s); });
      return !g.reserving;  // then g.reserved is 0
    });
  }
  /// Free device blocks that `g` may take: those the other running prefills have not reserved.
  [[nodiscard]] std::int32_t free_blocks_for(const group& g) const {
    return per_chunk() ? kv_.num_free_blocks() - (reserved_ - g.reserved) : kv_.num_free_blocks();
  }

  /// Schedules the running group at running_[index]. Preemption happens before the group appends
  /// anything, so a preempted group never leaves copies or slots in the plan; victims are newer
  /// groups, which this step has not scheduled yet. Returns false if the group left running_.
  bool schedule_group(std::size_t index, step_plan& plan, std::int32_t& budget) {
    const request_id id = running_[index];
    group& g = groups_.at(id);
    if (min_step_tokens(g) > budget) return true;
    while (blocks_to_append(g, budget) > free_blocks_for(g)) {
      if (running_.back() != id) {
        preempt(running_.size() - 1, plan);
      } else if (running_.size() == 1) {
        if (blocks_to_append(g, budget) <= free_blocks_for(g) + num_held_blocks()) {
          // Short only of idle blocks a TTL holds: each schedule() moves the clock, and they expire.
          ++stats_.retention_waits;
          retention_wait_ = true;
          return true;
        }
        reject(id);  // alone and still short: it can never finish in this pool
        ++stats_.rejected_running;
        return false;
      } else {
        preempt(index, plan);
        return false;
      }
    }
    for (sequence& s : g.seqs) {
      if (!lead_has_computed(s)) continue;  // its shared blocks are being prefilled by the lead
      const std::int32_t computed = kv_.num_computed_tokens(s.id);
      const std::int32_t chunk = std::min(static_cast<std::int32_t>(s.tokens.size()) - computed, budget);
      if (const std::int32_t missing = to_allocate(s, chunk); missing > 0) {
        const std::span<const token_id> fresh(s.tokens.data() + kv_.num_tokens(s.id), static_cast<std::size_t>(missing));
        append_tokens(s.id, fresh, plan.copies);
      }
      if (chunk <= 0) continue;
      const std::size_t offset = plan.slot_mapping.size();
      // Group 0's slots; export_forward_inputs adds the other groups' rows once the batch is final.
      const block_table& first = table(s.id, 0);
      for (std::int32_t p = computed; p < computed + chunk; ++p) plan.slot_mapping.push_back(first.slot(p));
      plan.batch.push_back({.request = id,
                            .seq = s.id,
                            .first_position = computed,
                            .num_tokens = chunk,
                            .slot_offset = offset,
                            .produces_logits = computed + chunk == static_cast<std::int32_t>(s.tokens.size())});
      budget -= chunk;
    }
    update_reserved(g);
    return true;
  }

  /// Takes running_[index]'s blocks: swapped out, or freed for recompute.
  void preempt(std::size_t index, step_plan& plan) {
    const request_id id = running_[index];
    group& g = groups_.at(id);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
    stop_reserving(g);
    plan.preempted.push_back(id);
    ++outputs_[id].num_preemptions;
    if constexpr (Preemption::mode == preemption_mode::swap) {
      const std::vector<seq_id> seqs = seq_ids(g);
      if (kv_.can_swap_out(seqs)) {
        for (sequence& s : g.seqs) {
          release_waiters(s.id);  // its device blocks stay with them, as far as it computed them
          if (s.shared_tokens > 0) kv_.mark_computed(s.id, std::min(kv_.num_computed_tokens(s.lead), s.shared_tokens));
          forget_lead(s);
        }
        const std::vector<block_copy> out = kv_.swap_out(seqs);
        plan.swap_out.insert(plan.swap_out.end(), out.begin(), out.end());
        insert_sorted(swapped_, id);
        outputs_[id].state = request_state::swapped;
        ++stats_.preempted_by_swap;
        recount_reserved();
        return;
      }
    }
    ++stats_.preempted_by_recompute;
    release(g);
    insert_sorted(waiting_, id);
    outputs_[id].state = request_state::waiting;
    recount_reserved();
  }

  [[nodiscard]] std::vector<seq_id> seq_ids(const group& g) const {
    std::vector<seq_id> ids;
    for (const sequence& s : g.seqs) ids.push_back(s.id);
    return ids;
  }

  void release(group& g) {
    for (sequence& s : g.seqs) {
      release_waiters(s.id);
      forget_lead(s);
      if (kv_.contains(s.id)) kv_.free(s.id);
    }
  }
  /// `s` leaves the device (freed or swapped out): it no longer waits for a lead.
  void forget_lead(sequence& s) {
    if (s.shared_tokens == 0) return;
    s.lead = 0;
    s.shared_tokens = 0;
    --num_waiting_seqs_;
  }

  void admit_swapped(step_plan& plan, std::int32_t& budget) {
    while (!swapped_.empty() && budget > 0) {
      const request_id id = swapped_.front();
      group& g = groups_.at(id);
      const std::vector<seq_id> seqs = seq_ids(g);
      const std::int32_t appended = blocks_to_append(g, budget);
      const std::int32_t needed = swap_in_blocks(seqs) + appended;
      // Chunk by chunk, the rest of its prefill is reserved too (this step's chunk is in both).
      const std::int32_t reserve = per_chunk() ? reserved_ + std::max(0, blocks_reserved(g) - appended) : 0;
      if (needed > kv_.options().num_device_blocks) {
        reject(id);  // it outgrew the pool while others ran: waiting would block the queue forever
        ++stats_.rejected_running;
        continue;
      }
      // Room to swap in and to append the sampled tokens, so that admission never preempts a group
      // this step has already scheduled.
      if (reserved_seqs() + group_seq_budget(g) > options_.max_num_seqs || needed + reserve > kv_.num_free_blocks() ||
          min_step_tokens(g) > budget) {
        note_retention_wait(needed + reserve);
        return;
      }
      const std::vector<block_copy> in = kv_.swap_in(seqs);
      plan.swap_in.insert(plan.swap_in.end(), in.begin(), in.end());
      swapped_.erase(swapped_.begin());
      outputs_[id].state = request_state::running;
      start_reserving(g);
      schedule_group(insert_sorted(running_, id), plan, budget);
    }
  }

  void admit_waiting(step_plan& plan, std::int32_t& budget) {
    while (!waiting_.empty() && budget > 0) {
      const request_id id = waiting_.front();
      group& g = groups_.at(id);
      if (reserved_seqs() + group_seq_budget(g) > options_.max_num_seqs) return;
      const sequence_options opts = seq_options(g);
      if (tier_.fetch && !g.fetch_timed_out && tier_.fetch(kv_, g.seqs.front().tokens, opts.key) > 0) {
        if (!fetch_waited_out(g)) {
          ++stats_.fetch_waits;
          return;  // its blocks are on their way from the store into the tier
        }
        // The store is late: what has not arrived is a miss, computed. The blocks stay in flight
        // in the tier; a later prompt finds them once they arrive.
        g.fetch_timed_out = true;
        ++stats_.fetch_timeouts;
      }
      const in_flight_prefix burst = find_in_flight_prefix(g, opts);
      // The others take no partial hit: they would count the same idle block each. The first's
      // partial hit may hold one more (idle) block: the group is admitted without it when only that fits.
      sequence_options beside = opts;
      beside.partial_reuse = false;
      sequence_options front_opts = opts;
      std::int32_t needed = blocks_to_admit(g, burst, opts, beside);
      // Chunk by chunk, the running prefills' reservations are taken too.
      const std::int32_t watermark = kv_.options().watermark_blocks + (per_chunk() ? reserved_ : 0);
      if (needed + watermark > kv_.num_free_blocks()) {
        front_opts = beside;
        needed = blocks_to_admit(g, burst, beside, beside);
      }
      if (needed + watermark > kv_.num_free_blocks()) {
        if (needed + kv_.options().watermark_blocks > kv_.options().num_device_blocks) {
          reject(id);  // would not fit even in an empty pool: waiting would block the queue forever
          ++stats_.rejected_at_admission;
          continue;
        }
        note_retention_wait(needed + kv_.options().watermark_blocks);
        return;  // head-of-line: later requests wait too, so that admission stays fair
      }
      sequence& front = g.seqs.front();
      const auto a = allocate_front(front, burst, front_opts, budget);
      if (burst.num_tokens > 0) {
        wait_for(front, burst.source, burst.num_tokens);
        stats_.shared_tokens += burst.num_tokens;
      }
      // A partial hit's copies run before the step's forward.
      if constexpr (grouped) {
        plan.copies.insert(plan.copies.end(), a.partial_copies.begin(), a.partial_copies.end());
      } else if (a.partial_copy) {
        plan.copies.push_back(*a.partial_copy);
      }
      if (!g.admitted_once) {
        outputs_[id].num_cached_prompt_tokens = a.num_cached_tokens;
        outputs_[id].cache_lookup = a.lookup;
      }
      if (tier_.load && burst.num_tokens == 0) {  // shared blocks in flight: nothing to load
        const tier_load loaded = tier_.load(kv_, g.seqs.front().id, opts.key);
        plan.load.insert(plan.load.end(), loaded.copies.begin(), loaded.copies.end());
        stats_.loaded_tokens += loaded.num_loaded_tokens;
        if (!g.admitted_once) outputs_[id].num_loaded_prompt_tokens = loaded.num_loaded_tokens;
      }
      for (std::size_t i = 1; i < g.seqs.size(); ++i) allocate_beside_lead(g, g.seqs[i], beside);
      g.admitted_once = true;
      g.fetch_since_step = 0;  // a re-admission's fetch wait starts afresh
      waiting_.erase(waiting_.begin());
      outputs_[id].state = request_state::running;
      start_reserving(g);
      schedule_group(insert_sorted(running_, id), plan, budget);  // its blocks were counted: no preemption
      recount_reserved();  // its hits may be blocks of a running prefill's window
    }
  }

  struct in_flight_prefix {
    seq_id source = 0;
    std::int32_t num_tokens = 0;
  };
  /// Device blocks the admission of waiting group g takes: its first sequence's (under `opts`, or
  /// sharing `burst`) and the others' beside it (under `beside`).
  [[nodiscard]] std::int32_t blocks_to_admit(const group& g, const in_flight_prefix& burst, const sequence_options& opts,
                                             const sequence_options& beside) const {
    std::int32_t needed = 0;
    if constexpr (grouped) {
      if (per_chunk()) needed = kv_.num_blocks_to_prefill(g.seqs.front().tokens, options_.max_tokens_per_step, opts);
    }
    if (!per_chunk()) needed = kv_.num_blocks_to_allocate(g.seqs.front().tokens, opts);
    if (burst.num_tokens > 0) needed = kv_.num_blocks_to_allocate_shared(g.seqs.front().tokens, burst.num_tokens);
    for (std::size_t i = 1; i < g.seqs.size(); ++i) needed += blocks_beside_lead(g, g.seqs[i], beside);
    return needed;
  }
  /// Allocates the first sequence of an admitted group; chunk by chunk (per_chunk()), its cached
  /// prefix and the `budget` tokens it can compute in this step.
  auto allocate_front(const sequence& front, const in_flight_prefix& burst, const sequence_options& opts,
                      std::int32_t budget) {
    if (burst.num_tokens > 0) return kv_.allocate_shared(front.id, burst.source, burst.num_tokens, front.tokens, opts);
    if constexpr (grouped) {
      if (per_chunk()) return kv_.allocate(front.id, front.tokens, opts, budget);
    }
    return kv_.allocate(front.id, front.tokens, opts);
  }

  /// Prefix sharing inside a burst: the running sequence whose prompt is still being computed and
  /// whose blocks hold the longest prefix of g's prompt (whole blocks, short of its last token)
  /// past what that sequence has computed, which the prefix cache therefore cannot serve yet, and
  /// longer than what it does serve. Only the first sequence of each running group on the device
  /// is a source: a request's prompt.
  [[nodiscard]] in_flight_prefix find_in_flight_prefix(const group& g, const sequence_options& opts) const {
    in_flight_prefix best;
    const sequence& s = g.seqs.front();
    if (!kv_.options().enable_prefix_caching) return best;  // off: every prompt is computed
    // Chunk by chunk (per_chunk()) a source holds only its first chunks, and a sharer would hold
    // the source's windowed blocks of the whole shared prefix until the source computed it all:
    // the memory per-chunk allocation exists to save. Later prompts hit the cache instead.
    if (per_chunk()) return best;
    const std::int32_t bs = kv_.block_size();
    for (request_id id : running_) {
      const group& other = groups_.at(id);
      const seq_id source = other.seqs.front().id;
      if (other.sampled || other.params.adapter_id != g.params.adapter_id || other.params.cache_salt != g.params.cache_salt ||
          !kv_.contains(source) || kv_.where(source) != location::device) {
        continue;
      }
      // The most it can share: whole blocks of what it holds, short of g's last token. A source
      // that cannot beat the best so far, or has computed that much already, is not compared
      // (the whole histories of long prompts otherwise, for every running request).
      const std::span<const token_id> held = kv_.tokens(source);
      const std::int32_t cap = static_cast<std::int32_t>(std::min(held.size(), s.tokens.size() - 1)) / bs * bs;
      if (cap <= best.num_tokens || cap <= kv_.num_computed_tokens(source)) continue;
      const auto cap_end = held.begin() + cap;
      const std::int32_t shared = static_cast<std::int32_t>(std::mismatch(held.begin(), cap_end, s.tokens.begin()).first -
                                                            held.begin()) / bs * bs;
      if (shared > best.num_tokens && shared > kv_.num_computed_tokens(source)) best = {source, shared};
    }
    if (best.num_tokens > 0) {
      const prefix_lookup cached = kv_.lookup(s.tokens, opts);
      if (cached.num_hit_tokens + cached.num_partial_hit_tokens >= best.num_tokens) best = {};
    }
    return best;
  }
  /// Makes `s` wait for `source` to compute its first `num_tokens`, which they share.
  void wait_for(sequence& s, seq_id source, std::int32_t num_tokens) {
    s.lead = source;
    s.shared_tokens = num_tokens;
    ++num_waiting_seqs_;
  }
  /// `source` stops computing (freed, preempted, swapped out): the sequences waiting for it mark
  /// what it computed of their shared prefix and compute the rest themselves.
  void release_waiters(seq_id source) {
    if (num_waiting_seqs_ == 0) return;
    const std::int32_t computed = kv_.contains(source) ? kv_.num_computed_tokens(source) : 0;
    for (auto& [id, g] : groups_) {
      for (sequence& s : g.seqs) {
        if (s.lead != source || s.shared_tokens == 0) continue;
        if (kv_.contains(s.id)) kv_.mark_computed(s.id, std::min(computed, s.shared_tokens));
        stats_.waiters_released += computed < s.shared_tokens ? 1 : 0;
        s.lead = 0;
        s.shared_tokens = 0;
        --num_waiting_seqs_;
      }
    }
  }

  /// The tokens a sequence re-admitted after a recompute preemption shares with its group's first
  /// sequence (the lead): whole blocks of their common prefix, short of its last token, whose
  /// logits it must compute itself. The lead's fresh blocks are not cached before they are
  /// computed, so sharing them is what keeps a group from needing each sample's prompt anew.
  /// 0 (allocate on its own, from the prefix cache) chunk by chunk (per_chunk()): the lead holds
  /// only its first chunk, and null before its windows.
  [[nodiscard]] std::int32_t shareable_with_lead(const group& g, const sequence& s) const {
    if (per_chunk()) return 0;
    const std::vector<token_id>& lead = g.seqs.front().tokens;
    const auto common = static_cast<std::int32_t>(
        std::mismatch(lead.begin(), lead.end(), s.tokens.begin(), s.tokens.end()).first - lead.begin());
    const std::int32_t bs = kv_.block_size();
    return std::min(common, static_cast<std::int32_t>(s.tokens.size()) - 1) / bs * bs;
  }
  /// Whether a KV cache group of `kv` frees blocks outside its window (per_chunk()).
  static bool frees_window(const Manager& kv) {
    if constexpr (grouped) {
      if (!kv.options().free_outside_window) return false;
      for (std::int32_t k = 0; k < kv.num_groups(); ++k) {
        if (kv.spec(k).kind != attention_kind::full) return true;
      }
    }
    return false;
  }
  /// Device blocks allocate_beside_lead takes for `s` (at most). Its own allocation comes after
  /// the lead's, which may evict idle cached blocks that `s` would hit: that costs nothing, as a
  /// hit block counts what a fresh one does. Chunk by chunk, the lead takes the cached blocks of
  /// its windows that `s` would hit too, which then are no longer the lead's alone: each counts
  /// once more (blocks_reserved).
  [[nodiscard]] std::int32_t blocks_beside_lead(const group& g, const sequence& s, const sequence_options& opts) const {
    if constexpr (grouped) {
      if (per_chunk()) {
        std::int32_t needed = kv_.num_blocks_to_prefill(s.tokens, options_.max_tokens_per_step, opts);
        const std::int32_t hit = kv_.lookup(s.tokens, opts).num_hit_tokens;
        for (std::int32_t k = 0; k < num_groups(); ++k) {
          if (kv_.spec(k).kind != attention_kind::full) {
            needed += (hit - kv_.spec(k).first_needed_position(hit) / kv_.block_size() * kv_.block_size()) / kv_.block_size();
          }
        }
        return needed;
      }
    }
    const std::int32_t shared = shareable_with_lead(g, s);
    const std::int32_t bs = kv_.block_size();
    const std::int32_t blocks = (static_cast<std::int32_t>(s.tokens.size()) + bs - 1) / bs;
    if (shared == 0) return kv_.num_blocks_to_allocate(s.tokens, opts);
    return (blocks - shared / bs) * num_groups();
  }
  /// Gives `s` the lead's blocks of their shared prefix (a fork cut back to it) and fresh blocks
  /// for the rest; it waits for the lead to compute the shared part (lead_has_computed). Chunk by
  /// chunk, `s` allocates on its own, its cached prefix and one token (schedule_group the rest).
  void allocate_beside_lead(group& g, sequence& s, const sequence_options& opts) {
    s.lead = 0;
    s.shared_tokens = 0;
    const std::int32_t shared = shareable_with_lead(g, s);
    if (shared == 0) {
      if constexpr (grouped) {
        if (per_chunk()) {
          kv_.allocate(s.id, s.tokens, opts, 1);
          return;
        }
      }
      kv_.allocate(s.id, s.tokens, opts);  // opts.partial_reuse is off: no copy
      return;
    }
    const seq_id lead = g.seqs.front().id;
    kv_.fork(lead, s.id);
    kv_.truncate(s.id, shared);
    const std::span<const token_id> rest(s.tokens.data() + shared, s.tokens.size() - static_cast<std::size_t>(shared));
    std::vector<block_copy> none;
    append_tokens(s.id, rest, none);  // no copy: the shared blocks are whole
    wait_for(s, lead, shared);
  }
  /// Whether `s` may run: it shares no uncomputed block with its lead. Marks the shared part
  /// computed once the lead has computed it.
  bool lead_has_computed(sequence& s) {
    if (s.shared_tokens == 0) return true;
    if (kv_.num_computed_tokens(s.lead) < s.shared_tokens) return false;
    if (kv_.num_computed_tokens(s.id) < s.shared_tokens) kv_.mark_computed(s.id, s.shared_tokens);
    s.lead = 0;
    s.shared_tokens = 0;
    --num_waiting_seqs_;
    return true;
  }

  void reject(request_id id) {
    stop_reserving(groups_.at(id));
    release(groups_.at(id));
    std::erase(waiting_, id);
    std::erase(running_, id);
    std::erase(swapped_, id);
    outputs_[id].state = request_state::rejected;
    groups_.erase(id);
    rejected_.push_back(id);
    recount_reserved();
  }

  /// Fills the plan's input tokens and table rows from the manager, once the batch is final: a
  /// sequence's table gains no block after it is scheduled, and preemption takes only groups not
  /// scheduled yet.
  void export_forward_inputs(step_plan& plan) const {
    std::vector<std::int32_t> kv_lens;
    for (const scheduled_sequence& q : plan.batch) {
      const std::span<const token_id> history = kv_.tokens(q.seq);
      plan.input_tokens.insert(plan.input_tokens.end(), history.begin() + q.first_position,
                               history.begin() + q.kv_len());
      kv_lens.push_back(q.kv_len());
    }
    plan.num_groups = num_groups();
    std::vector<std::vector<const block_table*>> tables(static_cast<std::size_t>(plan.num_groups));
    for (std::int32_t k = 0; k < plan.num_groups; ++k) {
      for (const scheduled_sequence& q : plan.batch) tables[static_cast<std::size_t>(k)].push_back(&table(q.seq, k));
      plan.max_blocks_per_seq = std::max(plan.max_blocks_per_seq, longest_table_blocks(tables[static_cast<std::size_t>(k)], kv_lens));
    }
    const std::size_t rows = plan.batch.size() * static_cast<std::size_t>(plan.max_blocks_per_seq);
    plan.block_tables.resize(rows * static_cast<std::size_t>(plan.num_groups));
    plan.kv_lens.resize(plan.batch.size());
    for (std::int32_t k = 0; k < plan.num_groups; ++k) {
      export_dense(tables[static_cast<std::size_t>(k)], kv_lens, plan.max_blocks_per_seq,
                   std::span(plan.block_tables).subspan(static_cast<std::size_t>(k) * rows, rows), plan.kv_lens);
    }
    // The other groups' slots, after group 0's (schedule_group's), in the same order.
    for (std::int32_t k = 1; k < plan.num_groups; ++k) {
      for (const scheduled_sequence& q : plan.batch) {
        const block_table& t = table(q.seq, k);
        for (std::int32_t p = q.first_position; p < q.kv_len(); ++p) plan.slot_mapping.push_back(t.slot(p));
      }
    }
  }

  void apply(group& g, std::span<const seq_id> ready, const std::vector<continuation>& next) {
    const bool first = !g.sampled;
    const auto want = static_cast<std::size_t>(max_seqs(g));
    if (first && (g.params.beam_width > 0 ? next.empty() || next.size() > want : next.size() != want)) {
      detail::fail(errc::invalid_argument, "request ", g.id, ": the first sampling returned ", next.size(),
                   " continuations for ", want, " sequences");
    }
    for (const continuation& c : next) {
      if (std::find(ready.begin(), ready.end(), c.parent) == ready.end()) {
        detail::fail(errc::invalid_argument, "request ", g.id, ": continuation of sequence ", c.parent,
                     " which produced no logits this step");
      }
    }
    g.sampled = true;
    // Forks first, from the parents as they are, then the new tokens.
    std::vector<seq_id> targets;
    std::vector<seq_id> used;
    for (const continuation& c : next) {
      if (std::find(used.begin(), used.end(), c.parent) == used.end()) {
        used.push_back(c.parent);
        targets.push_back(c.parent);
        continue;
      }
      const seq_id child = next_seq_++;
      kv_.fork(c.parent, child);
      g.seqs.push_back({.id = child, .tokens = find(g, c.parent).tokens});
      targets.push_back(child);
    }
    for (seq_id parent : ready) {
      if (std::find(used.begin(), used.end(), parent) == used.end()) drop(g, parent, false);  // pruned beam
    }
    // Keep the sequences in continuation order: the next sampling_request lists them so.
    std::stable_sort(g.seqs.begin(), g.seqs.end(), [&](const sequence& a, const sequence& b) {
      return std::find(targets.begin(), targets.end(), a.id) < std::find(targets.begin(), targets.end(), b.id);
    });
    for (std::size_t i = 0; i < next.size(); ++i) {
      sequence& s = find(g, targets[i]);
      s.tokens.push_back(next[i].token);
      const auto generated = static_cast<std::int32_t>(s.tokens.size() - g.params.prompt.size());
      if (next[i].stop || generated >= g.params.max_new_tokens) drop(g, s.id, true);
    }
  }

  sequence& find(group& g, seq_id id) {
    return *std::find_if(g.seqs.begin(), g.seqs.end(), [&](const sequence& s) { return s.id == id; });
  }

  void drop(group& g, seq_id id, bool finished) {
    const auto it = std::find_if(g.seqs.begin(), g.seqs.end(), [&](const sequence& s) { return s.id == id; });
    if (finished) {
      outputs_[g.id].sequences.emplace_back(it->tokens.begin() + static_cast<std::ptrdiff_t>(g.params.prompt.size()),
                                            it->tokens.end());
      outputs_[g.id].sequence_ids.push_back(id);
    }
    release_waiters(id);
    forget_lead(*it);
    kv_.free(id);
    g.seqs.erase(it);
  }

  struct tier_hooks {
    std::function<tier_load(Manager&, seq_id, const prefix_key&)> load;
    std::function<std::int32_t(const Manager&, std::span<const token_id>, const prefix_key&)> fetch;
    std::function<void()> poll;
    std::function<std::vector<block_copy>()> take_offloads;
    std::function<void()> complete;
  };

  scheduler_options options_;
  Manager kv_;
  tier_hooks tier_{};
  std::function<double()> time_source_ = [start = std::chrono::steady_clock::now()] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::unordered_map<request_id, group> groups_;  // unfinished requests
  std::unordered_map<request_id, request_output> outputs_;
  std::vector<request_id> waiting_;  // in admission order
  std::vector<request_id> running_;  // in admission order: the back is preempted first
  std::vector<request_id> swapped_;  // in admission order
  std::uint64_t next_arrival_ = 0;
  seq_id next_seq_ = 1;
  scheduler_stats stats_;
  std::vector<slot_id> append_slots_;  // scratch: the slots of appended tokens are read per chunk
  std::vector<request_id> rejected_;   // since the last schedule(): its plan lists them
  bool retention_wait_ = false;        // this schedule(): a running request waits for a TTL's blocks
  std::int64_t step_ = 0;              // schedule() calls so far
  double now_seconds_ = 0.0;           // the time source at the last schedule()
  std::int32_t num_waiting_seqs_ = 0;  // sequences with a lead (shared_tokens > 0)
  bool frees_window_ = false;          // per_chunk(): a KV cache group frees outside its window
  std::vector<request_id> reserving_;  // per_chunk(): running groups whose prefill may reserve blocks
  std::int32_t reserved_ = 0;          // per_chunk(): their blocks_reserved (num_reserved_blocks)
};

}  // namespace pagedkv
