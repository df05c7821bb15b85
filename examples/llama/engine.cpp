#include "engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <pagedkv/error.hpp>

namespace pagedkv::llama {

using pagedkv::detail::fail;

std::string_view to_string(finish_reason reason) noexcept {
  switch (reason) {
    case finish_reason::none: return "none";
    case finish_reason::eos: return "eos";
    case finish_reason::length: return "length";
    case finish_reason::stop_string: return "stop_string";
    case finish_reason::aborted: return "aborted";
    case finish_reason::rejected: return "rejected";
  }
  return "unknown";
}

/// One live sample or beam, in the scheduler's continuation order.
struct engine::track {
  std::int32_t index = 0;      // sample index (beams: 0)
  std::vector<token_id> tokens{};
  double logprob = 0.0;
  std::vector<double> token_logprobs{};
  std::vector<std::vector<token_logprob>> top_logprobs{};  // with sampling_params::top_logprobs
  std::string text{};          // visible text: no EOS, cut before a stop string
  std::size_t emitted = 0;     // bytes of text already streamed
  std::size_t released = 0;    // tokens already streamed (stream_event::tokens)
};

struct engine::request {
  request_id id = 0;
  std::int32_t prompt_tokens = 0;
  sampling_params params{};
  bool sampled = false;            // its prompt's row was sampled: the samples or beams forked
  std::vector<track> live{};       // in the order of the scheduler's sampling_request::seqs
  std::vector<completion> done{};  // finished samples (indexed by done_index) or beam hypotheses
  std::vector<std::int32_t> done_index{};
  // What each sequence's row chose, kept until the request samples: after a recompute preemption
  // the sequences of a group finish their prefills in different steps and are sampled together.
  std::unordered_map<seq_id, std::vector<sampled_token>> draws{};       // n for the prompt's row, else 1
  std::unordered_map<seq_id, std::vector<sampled_token>> candidates{};  // beams' 2k or top_logprobs, best first

  const std::vector<sampled_token>& of(const std::unordered_map<seq_id, std::vector<sampled_token>>& chosen,
                                       seq_id seq, std::size_t at_least) const {
    const auto it = chosen.find(seq);
    if (it == chosen.end() || it->second.size() < at_least)
      fail(errc::invalid_argument, "request ", id, ": sequence ", seq, " was sampled without its row's choices");
    return it->second;
  }
  /// The sequence's row's top_logprobs most likely tokens: the head of its candidates.
  std::vector<token_logprob> top_logprobs_of(seq_id seq) const {
    const std::vector<sampled_token>& best = of(candidates, seq, 0);
    std::vector<token_logprob> top;
    for (std::size_t i = 0; i < std::min(best.size(), std::size_t(params.top_logprobs)); ++i)
      top.push_back({best[i].token, best[i].logprob});
    return top;
  }
};

// ---- the sampler ---------------------------------------------------------------------------

namespace {

/// The length of text that ends on a whole UTF-8 character (a character cut by the end waits).
std::size_t complete_utf8_prefix(const std::string& text) {
  const std::size_t n = text.size();
  for (std::size_t back = 1; back <= std::min<std::size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

}  // namespace

// ---- construction and requests ----------------------------------------------------------------

namespace {

/// The options with their defaults resolved: the tokenizer's EOS, the host pool of swap.
engine_options resolved(engine_options options, const tokenizer* tok) {
  if (options.eos_id < 0 && tok) options.eos_id = tok->eos_id();
  if (options.num_host_blocks == 0 && options.preemption == preemption_mode::swap) options.num_host_blocks = options.num_blocks;
  return options;
}

kv_cache_options kv_options_of(const engine_options& o) {
  return {.block_size = o.block_size,
          .num_device_blocks = o.num_blocks,
          .num_host_blocks = o.preemption == preemption_mode::swap ? o.num_host_blocks : 0,
          .enable_prefix_caching = o.enable_prefix_caching,
          .enable_partial_reuse = o.enable_partial_reuse};
}

}  // namespace

/// The plain manager for a model whose layers all attend fully; the hybrid one, a KV cache group
/// per distinct window, for a model with sliding windows.
engine::scheduler_variant engine::make_scheduler(const model_backend* backend, const engine_options& o) {
  if (!backend) fail(errc::invalid_argument, "engine: no model backend");
  const scheduler_options so{.max_tokens_per_step = o.max_tokens_per_step, .max_num_seqs = o.max_num_seqs};
  const kv_cache_options kv = kv_options_of(o);
  std::vector<kv_cache_spec> groups = backend->kv_cache_groups();
  if (groups.size() == 1 && groups.front() == kv_cache_spec::full_attention())
    return scheduler_variant(std::in_place_index<0>, so, kv);
  return scheduler_variant(std::in_place_index<1>, so,
                           hybrid_kv_cache_options{.block_size = kv.block_size,
                                                   .num_device_blocks = kv.num_device_blocks,
                                                   .num_host_blocks = kv.num_host_blocks,
                                                   .groups = std::move(groups),
                                                   .enable_prefix_caching = kv.enable_prefix_caching,
                                                   .free_outside_window = o.free_outside_window});
}

engine::engine(std::unique_ptr<model_backend> backend, const tokenizer* tok, const engine_options& options)
    : backend_(std::move(backend)),
      tok_(tok),
      options_(resolved(options, tok)),
      scheduler_(make_scheduler(backend_.get(), options_)) {
  backend_->allocate_kv_cache(kv_options_of(options_));  // the pools the manager's block ids address
  backend_->reserve_steps(options_.max_tokens_per_step, options_.max_num_seqs);
}

engine::engine(const llama_config& config, const llama_weights& weights, const tokenizer* tok,
               const engine_options& options)
    : engine(make_model_backend(config, weights), tok, options) {}

engine::~engine() = default;

request_id engine::add_request(std::vector<token_id> prompt, const sampling_params& params) {
  if (prompt.empty()) fail(errc::invalid_argument, "add_request: the prompt is empty");
  for (const token_id t : prompt)
    if (t < 0 || t >= backend_->vocab_size())
      fail(errc::invalid_argument, "add_request: prompt token ", t, " outside the vocabulary of ", backend_->vocab_size());
  if (!params.stop.empty() && !tok_) fail(errc::invalid_argument, "add_request: stop strings need a tokenizer");
  if (params.max_tokens < 1 || params.n < 1 || params.beam_width < 0 || params.beam_width > max_sampling_candidates / 2 ||
      params.top_k < 0 || !(params.top_p > 0.0f) || std::isnan(params.temperature) || params.top_logprobs < 0 ||
      params.top_logprobs > max_sampling_candidates)
    fail(errc::invalid_argument, "add_request: max_tokens ", params.max_tokens, ", n ", params.n, ", beam_width ",
         params.beam_width, " (at most ", max_sampling_candidates / 2, "), top_k ", params.top_k, ", top_p ",
         params.top_p, ", temperature ", params.temperature, ", top_logprobs ", params.top_logprobs, " (at most ",
         max_sampling_candidates, ")");
  const request_id id = next_id_++;
  const auto prompt_tokens = std::int32_t(prompt.size());
  request_params rp{.prompt = std::move(prompt),
                    .max_new_tokens = params.max_tokens,
                    .num_samples = params.beam_width > 0 ? 1 : params.n,
                    .beam_width = params.beam_width};
  sched([&](auto& s) { s.add_request(id, std::move(rp)); });
  auto r = std::make_unique<request>();
  r->id = id;
  r->prompt_tokens = prompt_tokens;
  r->params = params;
  requests_.emplace(id, std::move(r));
  results_[id] = {};
  return id;
}

bool engine::has_unfinished() const { return !requests_.empty(); }

const request_result& engine::result(request_id id) const {
  const auto it = results_.find(id);
  if (it == results_.end()) fail(errc::unknown_sequence, "result of unknown request ", id);
  return it->second;
}

bool engine::forget(request_id id) {
  const auto it = results_.find(id);
  if (it == results_.end() || !it->second.finished) return false;
  results_.erase(it);
  return true;
}

std::int64_t engine::num_preemptions() const {
  return sched([](const auto& s) { return s.num_preemptions(); });
}

kv_cache_usage engine::kv_usage() const {
  return sched([](const auto& s) { return s.kv().usage(); });
}

bool engine::abort(request_id id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  sched([&](auto& s) { s.abort(id); });
  request& r = *it->second;
  for (track& t : r.live) finish(r, std::move(t), finish_reason::aborted);
  r.live.clear();
  finalize(id);
  return true;
}

void engine::run() {
  while (step()) {
  }
}

// ---- one step ------------------------------------------------------------------------------

/// A step handed to the backend and not yet collected.
struct engine::launched_step {
  step_plan plan;
  sampling_batch batch;
  bool planned_ahead = false;           // completed in the scheduler with stand-in tokens
  std::vector<request_id> finished{};   // what that completion finished
};

// Synchronously, a step plans, launches, collects and completes. With async_scheduling, while
// the backend runs step t the host completes t in the scheduler with a stand-in token for each
// sequence, plans t+1 and launches it, t+1's inputs taking t's tokens where they were drawn; then
// it collects t, sets the real tokens and applies them (docs/design.md, "Asynchronous scheduling").
bool engine::step() {
  if (!in_flight_) {
    if (requests_.empty()) return false;
    step_plan plan = sched([](auto& s) { return s.schedule(); });
    finish_rejected(plan.rejected);
    if (plan.empty()) {
      if (requests_.empty()) return false;
      fail(errc::out_of_blocks, "no request can run: ", requests_.size(), " wait for a KV pool of ", options_.num_blocks,
           " blocks of ", options_.block_size, " tokens");
    }
    in_flight_ = launch(std::move(plan));
  }
  std::unique_ptr<launched_step> current = std::move(in_flight_);
  std::vector<request_id> rejected;
  if (options_.async_scheduling && can_plan_ahead(*current)) in_flight_ = plan_ahead(*current, rejected);
  collect(*current, in_flight_.get());
  finish_rejected(rejected);  // after t's tokens, as a synchronous step rejects after applying them
  return true;
}

std::unique_ptr<engine::launched_step> engine::launch(step_plan plan) {
  auto s = std::make_unique<launched_step>();
  s->plan = std::move(plan);
  std::unordered_map<seq_id, const pending_token*> pending;
  for (const pending_token& p : pending_) pending.emplace(p.seq, &p);
  s->batch = sampling_of(s->plan, pending);
  // Inputs that are stand-ins for the tokens of the step in flight name where they were drawn.
  std::vector<std::int32_t> sources;
  for (const scheduled_sequence& q : s->plan.batch) {
    const auto it = pending.find(q.seq);
    if (it == pending.end()) continue;
    const pending_token* p = it->second;
    if (p->position != q.kv_len() - 1)
      fail(errc::invalid_argument, "engine: sequence ", q.seq, " runs tokens [", q.first_position, ", ", q.kv_len(),
           ") while its token at ", p->position, " is not known yet");
    sources.resize(s->plan.input_tokens.size(), -1);
    sources[q.slot_offset + std::size_t(q.num_tokens) - 1] = p->draw;
  }
  backend_->launch_sampled(s->plan, s->batch, sources);
  return s;
}

/// Whether the next step can be planned before this one's tokens are known: every request it
/// samples has one sequence (no n > 1, no beams), whose continuation the scheduler needs no token
/// to plan. A request that forks or prunes on its tokens runs its steps synchronously.
bool engine::can_plan_ahead(const launched_step& s) const {
  return std::all_of(s.plan.batch.begin(), s.plan.batch.end(), [&](const scheduled_sequence& q) {
    if (!q.produces_logits) return true;
    const auto it = requests_.find(q.request);
    return it == requests_.end() || (it->second->params.beam_width == 0 && it->second->params.n == 1);
  });
}

/// Completes `s` in the scheduler with stand-in tokens, plans the next step and launches it.
/// Returns it, or null when the plan is empty; `rejected` gets the plan's rejected requests.
std::unique_ptr<engine::launched_step> engine::plan_ahead(launched_step& s, std::vector<request_id>& rejected) {
  pending_.clear();
  std::int32_t draw = 0;
  std::size_t row = 0;
  for (const scheduled_sequence& q : s.plan.batch) {
    if (!q.produces_logits) continue;
    const row_sampling& spec = s.batch.rows[row++];
    if (spec.num_draws == 1) pending_.push_back({q.request, q.seq, q.kv_len(), draw});
    draw += spec.num_draws;
  }
  constexpr token_id stand_in = 0;
  s.finished = sched([&](auto& sc) {
    return sc.complete(s.plan, [&](const sampling_request& req) {
      std::vector<continuation> next;
      for (const seq_id seq : req.seqs) next.push_back({seq, stand_in, false});
      return next;
    });
  });
  s.planned_ahead = true;
  step_plan plan = sched([](auto& sc) { return sc.schedule(); });
  rejected = plan.rejected;
  std::unique_ptr<launched_step> next;
  if (!plan.empty()) {
    next = launch(std::move(plan));
    ++stats_.num_async_steps;
  }
  return next;
}

/// Takes the step's tokens from the backend and applies them: each sequence keeps its row's
/// choices until its request samples. A step planned ahead sets each stand-in to its token, then
/// samples, finishing requests that the tokens end (EOS, a stop string) and discarding what
/// `next` computes for them.
void engine::collect(launched_step& s, const launched_step* next) {
  const step_plan& plan = s.plan;
  const sampling_batch& batch = s.batch;
  const step_samples chosen = backend_->collect_sampled();
  record(plan);
  if (chosen.draws.size() != batch.uniforms.size())
    fail(errc::invalid_argument, "the model backend returned ", chosen.draws.size(), " draws for ", batch.uniforms.size());
  std::size_t row = 0, d = 0, c = 0;
  for (const scheduled_sequence& q : plan.batch) {
    if (!q.produces_logits) continue;
    const row_sampling& spec = batch.rows[row++];
    const auto nd = std::size_t(spec.num_draws), nc = std::size_t(spec.num_candidates);
    if (c + nc > chosen.candidates.size())
      fail(errc::invalid_argument, "the model backend returned ", chosen.candidates.size(), " candidates, too few");
    if (const auto it = requests_.find(q.request); it != requests_.end()) {
      it->second->draws[q.seq].assign(chosen.draws.begin() + std::ptrdiff_t(d), chosen.draws.begin() + std::ptrdiff_t(d + nd));
      it->second->candidates[q.seq].assign(chosen.candidates.begin() + std::ptrdiff_t(c),
                                           chosen.candidates.begin() + std::ptrdiff_t(c + nc));
    }
    d += nd;
    c += nc;
  }
  if (!s.planned_ahead) {
    const std::vector<request_id> finished =
        sched([&](auto& sc) { return sc.complete(plan, [&](const sampling_request& req) { return sample(req); }); });
    for (const request_id id : finished) finalize(id);
    return;
  }
  const std::vector<pending_token> pending = std::exchange(pending_, {});
  for (const pending_token& p : pending) {
    const auto it = requests_.find(p.request);
    if (it == requests_.end()) continue;
    request& r = *it->second;
    const token_id token = chosen.draws[std::size_t(p.draw)].token;
    // A request the next plan rejected is gone from the scheduler; finish_rejected ends it after.
    const bool rejected = sched([&](auto& sc) { return sc.output(p.request).state; }) == request_state::rejected;
    if (!rejected) sched([&](auto& sc) { sc.set_token(p.request, p.seq, p.position, token); });
    const seq_id seqs[] = {p.seq};
    sample({.request = p.request, .params = nullptr, .seqs = seqs, .first = !r.sampled});
    if (!r.live.empty()) continue;
    const bool scheduler_done = std::find(s.finished.begin(), s.finished.end(), p.request) != s.finished.end();
    if (!scheduler_done && !rejected) {
      // Its token ended it (EOS, a stop string) after the scheduler had continued it: what the
      // next step computes for it is discarded.
      if (next && std::any_of(next->plan.batch.begin(), next->plan.batch.end(),
                              [&](const scheduled_sequence& q) { return q.request == p.request; }))
        ++stats_.num_discarded_tokens;
      sched([&](auto& sc) { sc.abort(p.request); });
    }
    finalize(p.request);
  }
}

void engine::finish_rejected(const std::vector<request_id>& rejected) {
  for (const request_id id : rejected) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // its last tokens ended it first
    results_[id].rejected = true;
    request& r = *it->second;  // rejected mid-generation: keep what each sample generated
    for (track& t : r.live) finish(r, std::move(t), finish_reason::rejected);
    r.live.clear();
    finalize(id);
  }
}

/// Each logits row's sampling: beams want 2k candidates; samples draw with their request's
/// temperature, top-k and top-p, n times from the prompt's row, then once per sample, each with
/// the uniform of (seed, sample index, token index), so a request's tokens depend on nothing else.
/// A sequence whose token of the step in flight is pending draws once, its token index one past
/// its track's.
sampling_batch engine::sampling_of(const step_plan& plan,
                                   const std::unordered_map<seq_id, const pending_token*>& pending) const {
  sampling_batch batch;
  const std::int64_t vocab = backend_->vocab_size();
  for (const scheduled_sequence& q : plan.batch) {
    if (!q.produces_logits) continue;
    const auto it = requests_.find(q.request);
    if (it == requests_.end()) {  // nothing will sample this row
      batch.rows.push_back({.num_draws = 0});
      continue;
    }
    const request& r = *it->second;
    const sampling_params& p = r.params;
    if (p.beam_width > 0) {
      const std::int64_t wanted = std::max(2 * p.beam_width, p.top_logprobs);
      batch.rows.push_back({.num_draws = 0, .num_candidates = std::int32_t(std::min(wanted, vocab))});
      continue;
    }
    const bool ahead = pending.contains(q.seq);  // one sequence: can_plan_ahead
    batch.rows.push_back({.temperature = p.temperature, .top_k = p.top_k, .top_p = std::min(p.top_p, 1.0f),
                          .num_draws = r.sampled || ahead ? 1 : p.n,
                          .num_candidates = std::int32_t(std::min<std::int64_t>(p.top_logprobs, vocab))});
    if (ahead) {
      const std::int32_t known = r.live.empty() ? 0 : std::int32_t(r.live[0].tokens.size());
      batch.uniforms.push_back(request_uniform(p.seed, r.live.empty() ? 0 : r.live[0].index, known + 1));
      continue;
    }
    if (!r.sampled) {
      for (std::int32_t i = 0; i < p.n; ++i) batch.uniforms.push_back(request_uniform(p.seed, i, 0));
      continue;
    }
    const std::vector<seq_id> seqs = sched([&](const auto& sc) { return sc.sequences(q.request); });  // as r.live
    const auto j = std::size_t(std::find(seqs.begin(), seqs.end(), q.seq) - seqs.begin());
    if (seqs.size() != r.live.size() || j == seqs.size())
      fail(errc::invalid_argument, "request ", r.id, ": sequence ", q.seq, " is not one of its ", r.live.size(), " samples");
    const track& t = r.live[j];
    batch.uniforms.push_back(request_uniform(p.seed, t.index, std::int32_t(t.tokens.size())));
  }
  return batch;
}

void engine::record(const step_plan& plan) {
  ++stats_.num_steps;
  stats_.max_seqs_per_step = std::max(stats_.max_seqs_per_step, std::int32_t(plan.batch.size()));
  stats_.num_copied_blocks += std::int64_t(plan.copies.size());
  stats_.num_swapped_out_blocks += std::int64_t(plan.swap_out.size());
  stats_.num_swapped_in_blocks += std::int64_t(plan.swap_in.size());
  stats_.last_step_seqs = std::int32_t(plan.batch.size());
  stats_.last_step_tokens = plan.num_tokens;
  stats_.last_step_kv_tokens = 0;
  for (const std::int32_t len : plan.kv_lens) stats_.last_step_kv_tokens += len;
  stats_.last_step_decode_only = std::all_of(plan.batch.begin(), plan.batch.end(),
                                             [](const scheduled_sequence& q) { return q.num_tokens == 1; });
  for (const scheduled_sequence& q : plan.batch) {
    const auto it = requests_.find(q.request);
    if (it == requests_.end() || q.first_position >= it->second->prompt_tokens) continue;
    ++stats_.num_prefill_chunks;
    ++results_[q.request].num_prefill_chunks;
  }
}

void engine::finalize(request_id id) {
  const auto it = requests_.find(id);
  request& r = *it->second;
  request_result& out = results_[id];
  out.finished = true;
  const request_output& so = sched([&](const auto& sc) -> const request_output& { return sc.output(id); });
  out.num_preemptions = so.num_preemptions;
  out.num_cached_prompt_tokens = so.num_cached_prompt_tokens;
  std::vector<std::size_t> order(r.done.size());
  std::iota(order.begin(), order.end(), 0);
  if (r.params.beam_width > 0) {
    // best first by log-probability per token (vLLM's length penalty of 1)
    const auto score = [&](std::size_t i) { return r.done[i].logprob / double(std::max<std::size_t>(1, r.done[i].tokens.size())); };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return score(a) > score(b); });
    if (order.size() > std::size_t(r.params.beam_width)) order.resize(std::size_t(r.params.beam_width));
  } else {
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return r.done_index[a] < r.done_index[b]; });
  }
  for (const std::size_t i : order) out.completions.push_back(std::move(r.done[i]));
  sched([&](auto& sc) { sc.forget(id); });
  requests_.erase(it);
}

// ---- sampling through the scheduler's continuations -------------------------------------------

std::vector<continuation> engine::sample(const sampling_request& req) {
  request& r = *requests_.at(req.request);
  if (r.params.beam_width > 0) return sample_beams(r, req);
  if (req.first) {
    r.live.assign(std::size_t(r.params.n), track{});
    for (std::int32_t i = 0; i < r.params.n; ++i) r.live[std::size_t(i)].index = i;
  }
  if (r.live.size() != (req.first ? std::size_t(r.params.n) : req.seqs.size()))
    fail(errc::invalid_argument, "request ", r.id, ": ", req.seqs.size(), " sequences for ", r.live.size(), " samples");
  std::vector<continuation> next;
  std::vector<track> still_live;
  for (std::size_t j = 0; j < r.live.size(); ++j) {
    const seq_id parent = req.first ? req.seqs[0] : req.seqs[j];
    const sampled_token chosen = r.of(r.draws, parent, req.first ? r.live.size() : 1)[req.first ? j : 0];
    const token_id token = chosen.token;
    const double logprob = chosen.logprob;
    if (r.params.top_logprobs > 0) r.live[j].top_logprobs.push_back(r.top_logprobs_of(parent));
    track& t = r.live[j];
    const std::size_t before = r.done.size();
    extend(r, t, token, logprob);
    next.push_back({parent, token, r.done.size() != before});
    if (r.done.size() == before) still_live.push_back(std::move(t));
  }
  r.live = std::move(still_live);
  r.sampled = true;
  r.draws.clear();
  r.candidates.clear();
  return next;
}

std::vector<continuation> engine::sample_beams(request& r, const sampling_request& req) {
  const auto k = std::size_t(r.params.beam_width);
  if (req.first) r.live.assign(1, track{});
  if (r.live.size() != req.seqs.size())
    fail(errc::invalid_argument, "request ", r.id, ": ", req.seqs.size(), " sequences for ", r.live.size(), " beams");
  struct candidate {
    double score;
    std::size_t beam;
    token_id token;
    double logprob;
  };
  std::vector<candidate> candidates;
  for (std::size_t j = 0; j < r.live.size(); ++j) {
    const std::size_t top = std::min<std::size_t>(2 * k, std::size_t(backend_->vocab_size()));
    const std::vector<sampled_token>& best = r.of(r.candidates, req.seqs[j], top);  // best first
    for (std::size_t i = 0; i < top; ++i)
      candidates.push_back({r.live[j].logprob + best[i].logprob, j, best[i].token, best[i].logprob});
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const candidate& a, const candidate& b) { return a.score > b.score; });
  std::vector<continuation> next;
  std::vector<track> still_live;
  for (const candidate& c : candidates) {
    if (still_live.size() + r.done.size() >= k) break;
    const bool eos = c.token == options_.eos_id && !r.params.ignore_eos;
    track t = r.live[c.beam];
    if (r.params.top_logprobs > 0) t.top_logprobs.push_back(r.top_logprobs_of(req.seqs[c.beam]));
    const std::size_t before = r.done.size();
    extend(r, t, c.token, c.logprob);
    if (eos) continue;  // a finished hypothesis: recorded, no sequence needed
    next.push_back({req.seqs[c.beam], c.token, r.done.size() != before});
    if (r.done.size() == before) still_live.push_back(std::move(t));
  }
  if (next.empty() && req.first) {
    // The scheduler needs at least one beam after the prompt; keep the best non-EOS one, stopped.
    for (const candidate& c : candidates)
      if (c.token != options_.eos_id) {
        next.push_back({req.seqs[c.beam], c.token, true});
        break;
      }
  }
  r.live = std::move(still_live);
  r.sampled = true;
  r.draws.clear();
  r.candidates.clear();
  return next;
}

/// Appends a token to a track, updates its text and ends it on EOS, a stop string or max_tokens.
void engine::extend(request& r, track& t, token_id token, double logprob) {
  t.tokens.push_back(token);
  if (token_) token_(r.id, t.index, token);
  t.logprob += logprob;
  t.token_logprobs.push_back(logprob);
  finish_reason reason = finish_reason::none;
  const bool eos = token == options_.eos_id && !r.params.ignore_eos;
  if (eos) reason = finish_reason::eos;
  if (tok_ && !eos) {
    t.text = tok_->decode(t.tokens);
    for (const std::string& stop : r.params.stop) {
      const std::size_t at = t.text.find(stop);
      if (!stop.empty() && at != std::string::npos) {
        t.text.resize(at);
        reason = finish_reason::stop_string;
      }
    }
  }
  if (reason == finish_reason::none && std::int32_t(t.tokens.size()) >= r.params.max_tokens) reason = finish_reason::length;
  if (reason != finish_reason::none) {
    finish(r, t, reason);
    return;
  }
  emit(r, t, false);
}

void engine::finish(request& r, track t, finish_reason reason) {
  emit(r, t, true);
  stream_event last{.request = r.id, .sample = t.index, .token = -1, .text = {}, .finished = reason};
  if (stream_ && r.params.beam_width == 0) release(r, t, last);
  r.done.push_back({.tokens = std::move(t.tokens),
                    .text = std::move(t.text),
                    .logprob = t.logprob,
                    .reason = reason,
                    .token_logprobs = std::move(t.token_logprobs),
                    .top_logprobs = std::move(t.top_logprobs)});
  r.done_index.push_back(t.index);
  if (stream_ && r.params.beam_width == 0) stream_(last);
}

/// Moves the track's tokens not yet streamed, with their log-probabilities, into the event.
void engine::release(const request& r, track& t, stream_event& ev) {
  const auto from = std::ptrdiff_t(t.released);
  ev.tokens.assign(t.tokens.begin() + from, t.tokens.end());
  ev.token_logprobs.assign(t.token_logprobs.begin() + from, t.token_logprobs.end());
  if (r.params.top_logprobs > 0) ev.top_logprobs.assign(t.top_logprobs.begin() + from, t.top_logprobs.end());
  t.released = t.tokens.size();
}

/// Streams the text of a sample that is complete: whole UTF-8 characters, and, until the end,
/// not the last bytes that could still begin a stop string; with it the tokens not yet streamed.
/// Without a tokenizer (no text), each token as it comes.
void engine::emit(request& r, track& t, bool final_flush) {
  if (!stream_ || r.params.beam_width > 0) return;
  std::size_t end = t.text.size();
  if (!final_flush) {
    end = complete_utf8_prefix(t.text);
    std::size_t hold = 0;
    for (const std::string& stop : r.params.stop) hold = std::max(hold, stop.size() - 1);
    end = end > hold ? end - hold : 0;
  }
  const bool textless_token = !tok_ && !final_flush && t.released < t.tokens.size();
  if (end <= t.emitted && !textless_token) return;
  stream_event ev{.request = r.id, .sample = t.index, .token = t.tokens.empty() ? -1 : t.tokens.back(),
                  .text = end > t.emitted ? t.text.substr(t.emitted, end - t.emitted) : std::string(),
                  .finished = finish_reason::none};
  release(r, t, ev);
  stream_(ev);
  t.emitted = std::max(end, t.emitted);
}

}  // namespace pagedkv::llama
