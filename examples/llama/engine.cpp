#include "engine.hpp"
#include "logits.hpp"

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
};

struct engine::request {
  request_id id = 0;
  std::int32_t prompt_tokens = 0;
  sampling_params params{};
  std::mt19937_64 rng{};
  std::vector<track> live{};       // in the order of the scheduler's sampling_request::seqs
  std::vector<completion> done{};  // finished samples (indexed by done_index) or beam hypotheses
  std::vector<std::int32_t> done_index{};
  // Logits of sequences computed but not yet sampled: after a recompute preemption the sequences
  // of a group finish their prefills in different steps and are sampled together with the last.
  std::unordered_map<seq_id, std::vector<float>> logits{};
  std::unordered_map<seq_id, greedy_choice> choices{};  // instead of logits, in an all-greedy step

  const float* logits_of(seq_id seq) const {
    const auto it = logits.find(seq);
    if (it == logits.end()) fail(errc::invalid_argument, "request ", id, ": sequence ", seq, " was sampled without logits");
    return it->second.data();
  }
};

// ---- the sampler ---------------------------------------------------------------------------

namespace {

/// Whether draw() takes the argmax: sampling that a backend's greedy choice can serve (no beams).
bool is_greedy(const sampling_params& p) {
  return p.beam_width == 0 && p.top_logprobs == 0 && (p.temperature <= 0.0f || p.top_k == 1);
}

/// The `k` most likely tokens of a row of logits and their log-probabilities (lse: log_sum_exp).
std::vector<token_logprob> top_logprobs_of(const float* logits, std::int64_t vocab, std::int32_t k, double lse) {
  std::vector<token_logprob> top;
  for (const token_id id : top_k_tokens(logits, vocab, std::min<std::int64_t>(k, vocab)))
    top.push_back({id, double(logits[id]) - lse});
  return top;
}

/// Greedy at temperature <= 0; else a draw from softmax(logits / temperature) restricted to the
/// top_k most likely tokens and then to the smallest prefix of them whose mass reaches top_p.
token_id draw(const float* logits, std::int64_t vocab, const sampling_params& p, std::mt19937_64& rng) {
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab);
  std::vector<token_id> ids(static_cast<std::size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const auto keep = std::size_t(p.top_k > 0 ? std::min<std::int64_t>(p.top_k, vocab) : vocab);
  const auto by_logit = [&](token_id a, token_id b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(keep), ids.end(), by_logit);
  ids.resize(keep);
  std::vector<double> prob(keep);
  double sum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp(double(logits[ids[i]] - logits[ids[0]]) / p.temperature));
  std::size_t cut = keep;
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (cut = 0; cut < keep && mass < double(p.top_p) * sum;) mass += prob[cut++];
    cut = std::max<std::size_t>(cut, 1);
  }
  std::discrete_distribution<std::size_t> pick(prob.begin(), prob.begin() + std::ptrdiff_t(cut));
  return ids[pick(rng)];
}

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
          .enable_prefix_caching = o.enable_prefix_caching};
}

}  // namespace

engine::engine(std::unique_ptr<model_backend> backend, const tokenizer* tok, const engine_options& options)
    : backend_(std::move(backend)),
      tok_(tok),
      options_(resolved(options, tok)),
      scheduler_({.max_tokens_per_step = options_.max_tokens_per_step, .max_num_seqs = options_.max_num_seqs},
                 kv_options_of(options_)) {
  if (!backend_) fail(errc::invalid_argument, "engine: no model backend");
  backend_->allocate_kv_cache(scheduler_.kv().options());  // the pools the manager's block ids address
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
  if (params.max_tokens < 1 || params.n < 1 || params.beam_width < 0 || params.top_k < 0 || !(params.top_p > 0.0f) ||
      params.top_logprobs < 0)
    fail(errc::invalid_argument, "add_request: max_tokens ", params.max_tokens, ", n ", params.n, ", beam_width ",
         params.beam_width, ", top_k ", params.top_k, ", top_p ", params.top_p, ", top_logprobs ", params.top_logprobs);
  const request_id id = next_id_++;
  const auto prompt_tokens = std::int32_t(prompt.size());
  request_params rp{.prompt = std::move(prompt),
                    .max_new_tokens = params.max_tokens,
                    .num_samples = params.beam_width > 0 ? 1 : params.n,
                    .beam_width = params.beam_width};
  scheduler_.add_request(id, std::move(rp));
  auto r = std::make_unique<request>();
  r->id = id;
  r->prompt_tokens = prompt_tokens;
  r->params = params;
  r->rng.seed(params.seed);
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

std::int64_t engine::num_preemptions() const { return scheduler_.num_preemptions(); }

kv_cache_usage engine::kv_usage() const { return scheduler_.kv().usage(); }

bool engine::abort(request_id id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  scheduler_.abort(id);
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

bool engine::step() {
  if (requests_.empty()) return false;
  const step_plan plan = scheduler_.schedule();
  for (const request_id id : plan.rejected) {
    results_[id].rejected = true;
    request& r = *requests_.at(id);  // rejected mid-generation: keep what each sample generated
    for (track& t : r.live) finish(r, std::move(t), finish_reason::rejected);
    r.live.clear();
    finalize(id);
  }
  if (plan.empty()) {
    if (requests_.empty()) return false;
    fail(errc::out_of_blocks, "no request can run: ", requests_.size(), " wait for a KV pool of ", options_.num_blocks,
         " blocks of ", scheduler_.kv().block_size(), " tokens");
  }
  record(plan);

  // The backend moves the plan's blocks and runs its forward; each sequence that produced logits
  // keeps its row until its request samples. When every such request samples greedily, only the
  // rows' greedy choices come back from the backend (no logits cross from a device).
  const auto rows = std::size_t(std::count_if(plan.batch.begin(), plan.batch.end(),
                                              [](const scheduled_sequence& q) { return q.produces_logits; }));
  const bool greedy = std::all_of(plan.batch.begin(), plan.batch.end(), [&](const scheduled_sequence& q) {
    const auto it = requests_.find(q.request);
    return !q.produces_logits || it == requests_.end() || is_greedy(it->second->params);
  });
  if (greedy) {
    const std::span<const greedy_choice> choices = backend_->execute_greedy(plan);
    if (choices.size() != rows)
      fail(errc::invalid_argument, "the model backend returned ", choices.size(), " greedy choices for ", rows, " rows");
    std::size_t row = 0;
    for (const scheduled_sequence& q : plan.batch) {
      if (!q.produces_logits) continue;
      const greedy_choice choice = choices[row++];
      if (const auto it = requests_.find(q.request); it != requests_.end()) it->second->choices[q.seq] = choice;
    }
  } else {
    const std::span<const float> logits = backend_->execute(plan);
    const auto vocab = std::size_t(backend_->vocab_size());
    if (logits.size() != rows * vocab)
      fail(errc::invalid_argument, "the model backend returned ", logits.size(), " logits for ", rows, " rows of ", vocab);
    std::size_t row = 0;
    for (const scheduled_sequence& q : plan.batch) {
      if (!q.produces_logits) continue;
      const float* first = logits.data() + row++ * vocab;
      if (const auto it = requests_.find(q.request); it != requests_.end())
        it->second->logits[q.seq].assign(first, first + vocab);
    }
  }

  const std::vector<request_id> finished =
      scheduler_.complete(plan, [&](const sampling_request& req) { return sample(req); });
  for (const request_id id : finished) finalize(id);
  return true;
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
  const request_output& so = scheduler_.output(id);
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
  scheduler_.forget(id);
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
  const std::int64_t vocab = backend_->vocab_size();
  std::vector<continuation> next;
  std::vector<track> still_live;
  for (std::size_t j = 0; j < r.live.size(); ++j) {
    const seq_id parent = req.first ? req.seqs[0] : req.seqs[j];
    token_id token = 0;
    double logprob = 0.0;
    if (const auto choice = r.choices.find(parent); choice != r.choices.end()) {
      token = choice->second.token;  // the backend's greedy choice: what draw() takes at temperature 0
      logprob = choice->second.logprob;
    } else {
      const float* logits = r.logits_of(parent);
      token = draw(logits, vocab, r.params, r.rng);
      const double lse = log_sum_exp(logits, vocab);
      logprob = double(logits[token]) - lse;
      if (r.params.top_logprobs > 0) r.live[j].top_logprobs.push_back(top_logprobs_of(logits, vocab, r.params.top_logprobs, lse));
    }
    track& t = r.live[j];
    const std::size_t before = r.done.size();
    extend(r, t, token, logprob);
    next.push_back({parent, token, r.done.size() != before});
    if (r.done.size() == before) still_live.push_back(std::move(t));
  }
  r.live = std::move(still_live);
  r.logits.clear();
  r.choices.clear();
  return next;
}

std::vector<continuation> engine::sample_beams(request& r, const sampling_request& req) {
  const std::int64_t vocab = backend_->vocab_size();
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
    const float* logits = r.logits_of(req.seqs[j]);
    const double lse = log_sum_exp(logits, vocab);
    std::vector<token_id> ids(static_cast<std::size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    const std::size_t top = std::min<std::size_t>(2 * k, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(top), ids.end(),
                      [&](token_id a, token_id b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (std::size_t i = 0; i < top; ++i) {
      const double lp = double(logits[ids[i]]) - lse;
      candidates.push_back({r.live[j].logprob + lp, j, ids[i], lp});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const candidate& a, const candidate& b) { return a.score > b.score; });
  std::vector<continuation> next;
  std::vector<track> still_live;
  for (const candidate& c : candidates) {
    if (still_live.size() + r.done.size() >= k) break;
    const bool eos = c.token == options_.eos_id && !r.params.ignore_eos;
    track t = r.live[c.beam];
    if (r.params.top_logprobs > 0) {
      const float* logits = r.logits_of(req.seqs[c.beam]);
      t.top_logprobs.push_back(top_logprobs_of(logits, vocab, r.params.top_logprobs, log_sum_exp(logits, vocab)));
    }
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
  r.logits.clear();
  r.choices.clear();
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
  r.done.push_back({.tokens = std::move(t.tokens),
                    .text = std::move(t.text),
                    .logprob = t.logprob,
                    .reason = reason,
                    .token_logprobs = std::move(t.token_logprobs),
                    .top_logprobs = std::move(t.top_logprobs)});
  r.done_index.push_back(t.index);
  if (stream_ && r.params.beam_width == 0)
    stream_({.request = r.id, .sample = t.index, .token = -1, .text = {}, .finished = reason});
}

/// Streams the text of a sample that is complete: whole UTF-8 characters, and, until the end,
/// not the last bytes that could still begin a stop string.
void engine::emit(request& r, track& t, bool final_flush) {
  if (!stream_ || r.params.beam_width > 0) return;
  std::size_t end = t.text.size();
  if (!final_flush) {
    end = complete_utf8_prefix(t.text);
    std::size_t hold = 0;
    for (const std::string& stop : r.params.stop) hold = std::max(hold, stop.size() - 1);
    end = end > hold ? end - hold : 0;
  }
  if (end <= t.emitted) return;
  stream_({.request = r.id, .sample = t.index, .token = t.tokens.empty() ? -1 : t.tokens.back(),
           .text = t.text.substr(t.emitted, end - t.emitted), .finished = finish_reason::none});
  t.emitted = end;
}

}  // namespace pagedkv::llama
