// Tensor parallelism over NCCL (cuda/tp_backend.hpp) against the one-GPU CUDA backend on the same
// plans, on two GPUs (the device kind nvidia-h100-x2): one scheduler drives both, every step's plan
// runs on each, and their logits must agree within the GPU engine's bf16 tolerance
// (logit_agreement.hpp); greedy tokens through the engine must be identical on the tiny goldens,
// and stay so under preemption (swap and recompute), without prefix caching, with n = 2, with
// asynchronous scheduling on and off and with decode graphs; a random llama2-7b-shaped model (its
// widths, 2 layers) agrees step by step, both sides replaying decode graphs (the ranks' with their
// all-reduces captured in them); two GPUs with graphs agree with two without; the peer reduce
// (cuda/peer_reduce.cuh, the default) gives NCCL's sums bit for bit, steps too large for its
// buffers taking NCCL's all-reduce in the same run. A rank that throws or hangs mid-step ends the
// step with tensor_parallel_error, within the deadline, eagerly and while the other rank replays a
// decode graph, and the backend refuses later steps. Skipped, visibly, without two GPUs or NCCL,
// but for the options' own checks (a failure-injection rank out of range), which need neither.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <pagedkv/scheduler.hpp>

#include "cuda/cuda_backend.hpp"
#include "cuda/tp_backend.hpp"
#include "engine.hpp"
#include "llama_weights.hpp"
#include "logit_agreement.hpp"
#include "sharding.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv;
using namespace pagedkv::llama;
using namespace pagedkv::llama::test_support;

class TensorParallel : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_backend_available(&why) || !tensor_parallel_available(2, &why)) GTEST_SKIP() << why;
  }
};

struct comparison : logit_agreement {
  std::int64_t steps = 0, copies = 0, swaps = 0;
};

/// The row of sequence `seq` among the plan's logit-producing sequences.
std::int64_t row_of(const step_plan& plan, seq_id seq) {
  std::int64_t row = 0;
  for (const scheduled_sequence& q : plan.batch) {
    if (q.seq == seq) break;
    row += q.produces_logits ? 1 : 0;
  }
  return row;
}

/// Drives one scheduler's plans through `one` (one GPU, or the reference) and `tp` (a
/// tensor-parallel backend), comparing each step's logits and tp's greedy choices; samples greedily
/// from one's.
void compare_with_tp(model_backend& one, model_backend& tp, const llama_config& config, std::int32_t block_size,
                     std::int32_t num_blocks, std::int32_t num_host_blocks, unsigned seed, comparison& c) {
  ASSERT_EQ(tp.vocab_size(), config.vocab_size);
  const kv_cache_options kv{.block_size = block_size, .num_device_blocks = num_blocks, .num_host_blocks = num_host_blocks};
  one.allocate_kv_cache(kv);
  tp.allocate_kv_cache(kv);
  scheduler<fcfs_admission, preempt_by_swap> s({.max_tokens_per_step = 32, .max_num_seqs = 16}, kv);
  std::mt19937 rng(seed);
  const auto tokens = [&](std::size_t n) {
    std::vector<token_id> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = i < 5 ? token_id(1 + i) : token_id(rng() % config.vocab_size);
    return t;
  };
  const std::size_t lengths[] = {1, 13, 37, 70, 6, 29};  // a shared start: prefix hits; n = 2: copy-on-write
  for (std::size_t i = 0; i < std::size(lengths); ++i)
    s.add_request(i + 1, {.prompt = tokens(lengths[i]), .max_new_tokens = 9, .num_samples = i % 3 == 1 ? 2 : 1});
  const std::int64_t vocab = config.vocab_size;
  std::vector<float> a, b;
  while (s.has_unfinished() && c.steps < 500) {
    const step_plan plan = s.schedule();
    if (plan.empty()) break;
    const std::span<const float> x = one.execute(plan);
    a.assign(x.begin(), x.end());
    const std::span<const float> y = tp.execute(plan);
    b.assign(y.begin(), y.end());
    expect_logits_agree(a, b, vocab, bf16_tolerance, c, "step " + std::to_string(c.steps));
    if (::testing::Test::HasFatalFailure()) return;
    // The same step again, choosing across the ranks on the device (the K/V written again are the same).
    const std::size_t num_rows = b.size() / std::size_t(vocab);
    const sampling_batch greedy_rows{.rows = std::vector<row_sampling>(num_rows, row_sampling{.num_draws = 1}),
                                     .uniforms = std::vector<double>(num_rows, 0.5)};
    const std::span<const sampled_token> choices = tp.execute_sampled(plan, greedy_rows).draws;
    ASSERT_EQ(std::int64_t(choices.size()) * vocab, std::int64_t(b.size()));
    for (std::int64_t r = 0; r < std::int64_t(choices.size()); ++r) {
      const float* y1 = b.data() + r * vocab;
      const float* best = std::max_element(y1, y1 + vocab);
      double sum = 0.0;
      for (std::int64_t i = 0; i < vocab; ++i) sum += std::exp(double(y1[i]) - double(*best));
      EXPECT_EQ(choices[std::size_t(r)].token, best - y1) << "step " << c.steps << " row " << r;
      EXPECT_NEAR(choices[std::size_t(r)].logprob, -std::log(sum), 1e-3) << "step " << c.steps << " row " << r;
    }
    ++c.steps;
    c.copies += std::int64_t(plan.copies.size());
    c.swaps += std::int64_t(plan.swap_out.size() + plan.swap_in.size());
    s.complete(plan, [&](const sampling_request& req) {
      std::vector<continuation> next;
      for (const seq_id seq : req.seqs) {
        const float* l = a.data() + row_of(plan, seq) * vocab;
        const auto top = token_id(std::max_element(l, l + vocab) - l);
        const std::int32_t ways = req.first ? std::max(req.params->num_samples, req.params->beam_width) : 1;
        for (std::int32_t i = 0; i < ways; ++i) next.push_back({seq, token_id((top + i) % vocab), false});
      }
      return next;
    });
  }
  EXPECT_FALSE(s.has_unfinished());
  std::cout << "  " << c.steps << " steps, " << c.rows << " logit rows, " << c.copies
            << " copies, " << c.swaps << " swapped blocks; max |tp - one gpu| " << c.max_abs
            << ", relative to the row's largest logit " << c.max_rel << "; near-ties " << c.near_ties << "\n";
}

/// compare_with_tp of one GPU and two, both replaying decode graphs.
void compare_one_gpu_and_tp(const llama_config& config, const llama_weights& weights, std::int32_t block_size,
                            std::int32_t num_blocks, std::int32_t num_host_blocks, unsigned seed, comparison& c) {
  const std::unique_ptr<model_backend> one = make_cuda_backend(config, &weights, {});
  const std::unique_ptr<model_backend> tp = make_tensor_parallel_backend(config, &weights, {.size = 2, .cuda_graphs = true});
  compare_with_tp(*one, *tp, config, block_size, num_blocks, num_host_blocks, seed, c);
}

TEST_F(TensorParallel, TinyHfModelsMatchOneGpu) {
  // 4 query heads over 2 KV heads (gqa): one KV head a rank; mqa_tied: its one KV head replicated.
  for (const char* name : {"gqa", "mqa_tied", "linear", "llama3", "yarn"}) {
    SCOPED_TRACE(name);
    const hf_checkpoint model = load_hf_checkpoint(golden_dir() / "hf_tiny" / name);
    comparison c;
    compare_one_gpu_and_tp(model.config, model.weights, 7, 64, 0, 1, c);
    EXPECT_GT(c.copies, 0);
  }
}

TEST_F(TensorParallel, SwapPreemptionMovesEveryRanksSlice) {
  const hf_checkpoint model = load_hf_checkpoint(golden_dir() / "hf_tiny" / "gqa");
  comparison c;
  compare_one_gpu_and_tp(model.config, model.weights, 4, 30, 64, 4, c);
  EXPECT_GT(c.swaps, 0);
}

TEST_F(TensorParallel, DecodeGraphsComputeWhatEagerStepsDo) {
  // Two GPUs replaying decode graphs, NCCL's all-reduces captured in them, against two GPUs
  // launching every step: the same logits within the bf16 tolerance (a graph pads its batch to the
  // bucket and its tables to a power-of-two pitch), the same greedy choices, and every captured
  // all-reduce counted at each replay as the eager steps count theirs.
  // head_dim 128: the decode kernel's, which graphs need (the tiny goldens' head dims are not).
  const llama_config config = test::shaped(8, 2, 128, 2);
  const llama_weights weights = test::shaped_weights(config, 16);
  const std::unique_ptr<model_backend> eager =
      make_tensor_parallel_backend(config, &weights, {.size = 2, .cuda_graphs = false});
  const std::unique_ptr<model_backend> graphed =
      make_tensor_parallel_backend(config, &weights, {.size = 2, .cuda_graphs = true, .time_graph_collectives = true});
  comparison c;
  compare_with_tp(*eager, *graphed, config, 5, 96, 0, 6, c);
  const tensor_parallel_stats e = tensor_parallel_stats_of(*eager), g = tensor_parallel_stats_of(*graphed);
  std::cout << "  graphed: " << g.graphs.captures << " graphs captured, " << g.graphs.replays << " replays; "
            << g.all_reduces << " all-reduces counted (eager: " << e.all_reduces << ")\n";
  EXPECT_GT(g.graphs.replays, 0) << "decode steps should replay graphs";
  EXPECT_EQ(e.graphs.captures, 0);
  // compare_with_tp runs each plan once on the reference and twice on the other (its logits, then
  // its greedy choices): twice the all-reduces, replayed or not; more bytes, as a graph's batch is
  // padded to its bucket.
  EXPECT_EQ(g.all_reduces, 2 * e.all_reduces) << "a replay counts its captured all-reduces";
  EXPECT_GE(g.all_reduce_bytes, 2 * e.all_reduce_bytes);
  EXPECT_GT(g.all_reduce_seconds, 0.0);
}

TEST_F(TensorParallel, PeerReduceSumsAsNcclDoes) {
  // The all-reduces after O and down fused with the add and RMSNorm over NVLink peer access
  // (cuda/peer_reduce.cuh) against NCCL's all-reduce and add_rmsnorm, both launching every step:
  // for two ranks the same sums (one bf16 rounding of an f32 sum of two terms either way), so the
  // same logits bit for bit. Buffers of 8 rows: the prefill steps (up to 32 tokens) all-reduce by
  // NCCL, the decode steps by the peer reduce, mixed in one run.
  const llama_config config = test::shaped(8, 2, 128, 2);
  const llama_weights weights = test::shaped_weights(config, 18);
  const std::unique_ptr<model_backend> nccl =
      make_tensor_parallel_backend(config, &weights, {.size = 2, .cuda_graphs = false, .peer_reduce = false});
  const std::unique_ptr<model_backend> peer = make_tensor_parallel_backend(
      config, &weights, {.size = 2, .cuda_graphs = false, .peer_reduce = true, .peer_reduce_tokens = 8});
  const tensor_parallel_stats off = tensor_parallel_stats_of(*nccl);
  EXPECT_FALSE(off.peer_reduce);
  EXPECT_NE(off.peer_reduce_off.find("off"), std::string::npos) << off.peer_reduce_off;
  ASSERT_TRUE(tensor_parallel_stats_of(*peer).peer_reduce) << tensor_parallel_stats_of(*peer).peer_reduce_off;
  comparison c;
  compare_with_tp(*nccl, *peer, config, 5, 96, 0, 8, c);
  const tensor_parallel_stats p = tensor_parallel_stats_of(*peer), n = tensor_parallel_stats_of(*nccl);
  std::cout << "  peer: " << p.eager_peer_reduces << " of " << p.all_reduces << " all-reduces by the peer reduce; "
            << "max |peer - nccl| " << c.max_abs << "\n";
  EXPECT_EQ(c.max_abs, 0.0) << "the peer reduce's sums differ from NCCL's";
  EXPECT_GT(p.eager_peer_reduces, 0) << "no step took the peer reduce";
  EXPECT_GT(p.all_reduces, p.eager_peer_reduces) << "no step took NCCL's all-reduce (more rows than the buffers)";
  EXPECT_EQ(n.eager_peer_reduces, 0);
}

TEST_F(TensorParallel, PeerAccessUnavailableFallsBackToNccl) {
  // A host whose GPUs cannot reach each other's memory, injected on rank 1 (rank 0 connects): the
  // peer reduce is off, named so, every rank's buffers are freed again, and the steps all-reduce by
  // NCCL, computing bit for bit what the peer reduce does (two ranks: PeerReduceSumsAsNcclDoes).
  const llama_config config = test::shaped(8, 2, 128, 2);
  const llama_weights weights = test::shaped_weights(config, 19);
  const std::unique_ptr<model_backend> fallback =
      make_tensor_parallel_backend(config, &weights, {.size = 2, .cuda_graphs = false, .fail_peer_access_rank = 1});
  const std::unique_ptr<model_backend> peer = make_tensor_parallel_backend(config, &weights, {.size = 2, .cuda_graphs = false});
  const tensor_parallel_stats f = tensor_parallel_stats_of(*fallback);
  EXPECT_FALSE(f.peer_reduce);
  EXPECT_NE(f.peer_reduce_off.find("peer access unavailable on GPU 1"), std::string::npos) << f.peer_reduce_off;
  EXPECT_EQ(f.peer_reduce_bytes, 0u) << "the peer reduce's buffers were kept after peer access failed";
  ASSERT_TRUE(tensor_parallel_stats_of(*peer).peer_reduce) << tensor_parallel_stats_of(*peer).peer_reduce_off;
  EXPECT_GT(tensor_parallel_stats_of(*peer).peer_reduce_bytes, 0u);
  comparison c;
  compare_with_tp(*fallback, *peer, config, 5, 96, 0, 8, c);
  const tensor_parallel_stats p = tensor_parallel_stats_of(*peer), n = tensor_parallel_stats_of(*fallback);
  std::cout << "  fallback: " << n.all_reduces << " all-reduces by NCCL; peer: " << p.eager_peer_reduces << " of "
            << p.all_reduces << " by the peer reduce; max |peer - fallback| " << c.max_abs << "\n";
  EXPECT_EQ(c.max_abs, 0.0) << "the fallback's logits differ from the peer reduce's";
  EXPECT_EQ(n.eager_peer_reduces, 0);
  EXPECT_GT(p.eager_peer_reduces, 0);
}

/// Uniform weights in +-1/sqrt(in), as the CUDA backend's random ones, made on the host (a hash of
/// the index: seconds for a 7B-wide layer) so that one GPU and the shards hold the same model.
void fill_uniform(std::vector<float>& v, std::int64_t size, std::int64_t in, std::uint64_t seed) {
  v.resize(std::size_t(size));
  const float scale = 1.0f / std::sqrt(float(in));
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    v[i] = scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

TEST_F(TensorParallel, Llama2_7bShapedModelMatchesOneGpu) {
  llama_config c = *named_model_shape("llama2-7b");
  c.num_layers = 2;  // the widths of 7B (4096, 32 heads, FFN 11008, vocab 32000); 2.7 GB of f32 on the host
  llama_weights w;
  std::uint64_t seed = 1;
  const std::int64_t d = c.embedding_dim, q = c.num_heads * c.head_dim, kv = c.kv_dim(), f = c.ffn_dim;
  fill_uniform(w.token_embedding, c.vocab_size * d, 1, seed++);  // embedding rows of unit scale
  fill_uniform(w.output, c.vocab_size * d, d, seed++);
  w.output_norm.assign(std::size_t(d), 1.0f);
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    llama_layer_weights lw;
    lw.attn_norm.assign(std::size_t(d), 1.0f);
    lw.ffn_norm.assign(std::size_t(d), 1.0f);
    fill_uniform(lw.wq, q * d, d, seed++);
    fill_uniform(lw.wk, kv * d, d, seed++);
    fill_uniform(lw.wv, kv * d, d, seed++);
    fill_uniform(lw.wo, d * q, q, seed++);
    fill_uniform(lw.w_gate, f * d, d, seed++);
    fill_uniform(lw.w_up, f * d, d, seed++);
    fill_uniform(lw.w_down, d * f, f, seed++);
    w.layers.push_back(std::move(lw));
  }
  comparison r;
  compare_one_gpu_and_tp(c, w, 16, 96, 0, 2, r);
  EXPECT_GT(r.rows, 0);
}

/// Greedy continuations of a few prompts through the engine over `backend`.
struct generation {
  std::vector<std::vector<token_id>> tokens;
  std::int64_t preemptions = 0;
  engine_stats stats;
  std::int64_t buffer_growths = 0;  // in steps, after the engine's reserve_steps: none
};
generation generate(std::unique_ptr<model_backend> backend, const engine_options& options, std::int32_t n) {
  engine e(std::move(backend), nullptr, options);
  std::vector<request_id> ids;
  const std::vector<std::vector<token_id>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 3, 4, 5, 11, 12},
                                                      {7}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}};
  for (const auto& p : prompts) ids.push_back(e.add_request(p, {.max_tokens = 16, .n = n, .ignore_eos = true}));
  e.run();
  generation g;
  for (const request_id id : ids)
    for (const completion& c : e.result(id).completions) g.tokens.push_back(c.tokens);
  g.preemptions = e.num_preemptions();
  g.stats = e.stats();
  const tensor_parallel_stats tp = tensor_parallel_stats_of(e.backend());
  g.buffer_growths = tp.ranks > 1 ? tp.buffer_growths : cuda_step_stats_of(e.backend()).buffer_growths;
  EXPECT_EQ(g.buffer_growths, 0) << "a step allocated after the engine's reserve_steps";
  return g;
}

TEST_F(TensorParallel, GreedyTokensAreIdenticalAndInvariant) {
  // The tiny golden with 4 heads and 2 KV heads: one GPU, then two, with room and then under
  // preemption (16 blocks of 4 tokens for 4 requests needing 27, the largest alone 14 with n = 2),
  // without prefix caching, n = 2.
  const hf_checkpoint model = load_hf_checkpoint(golden_dir() / "hf_tiny" / "gqa");
  const auto tp2 = [&] {
    return make_tensor_parallel_backend(model.config, &model.weights, {.size = 2, .cuda_graphs = false});
  };
  for (const std::int32_t n : {1, 2}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    engine_options roomy{.block_size = 4, .num_blocks = 128};
    const generation one = generate(make_cuda_backend(model.config, &model.weights, {}), roomy, n);
    const generation two = generate(tp2(), roomy, n);
    EXPECT_EQ(one.tokens, two.tokens) << "greedy tokens differ between one GPU and two";
    // Asynchronous scheduling (on by default): each rank enqueues step t+1, its input tokens taken
    // from step t's greedy choices on the device, before step t is collected.
    if (n == 1) {
      EXPECT_GT(two.stats.num_async_steps, 0) << "TP2 planned no step ahead";
    }
    engine_options sync = roomy;
    sync.async_scheduling = false;
    EXPECT_EQ(generate(tp2(), sync, n).tokens, two.tokens) << "asynchronous scheduling changed TP2's output";
    // Decode graphs under TP through the engine, which plans ahead (the tiny golden's head_dim
    // takes no decode kernel: its steps run eagerly; GraphedStepsOverlapAndEveryReplayIsTimed
    // replays graphs so).
    const generation graphed =
        generate(make_tensor_parallel_backend(model.config, &model.weights, {.size = 2, .cuda_graphs = true}), roomy, n);
    EXPECT_EQ(graphed.tokens, two.tokens) << "decode graphs changed TP2's output";
    engine_options no_prefix = roomy;
    no_prefix.enable_prefix_caching = false;
    EXPECT_EQ(generate(tp2(), no_prefix, n).tokens, two.tokens) << "prefix caching changed the output";
    for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
      engine_options tight = roomy;
      tight.num_blocks = 16;
      tight.preemption = mode;
      tight.max_num_seqs = 8;
      const generation g = generate(tp2(), tight, n);
      EXPECT_GT(g.preemptions, 0) << "the tight pool preempted";
      EXPECT_EQ(g.tokens, two.tokens) << (mode == preemption_mode::swap ? "swap" : "recompute")
                                      << " preemption changed the output";
    }
  }
}

TEST_F(TensorParallel, GraphedStepsOverlapAndEveryReplayIsTimed) {
  // Decode graphs through the engine, which launches each step before the one before it is
  // collected (asynchronous scheduling): two replays of one graph are in flight at once, each
  // recording its collectives' times into its own set of events. Every step's all-reduces are
  // counted (the embedding's and two a layer) as eager steps count theirs, and the tokens are the
  // eager steps'; with time_graph_collectives off (the default), the replays count as untimed
  // instead.
  const llama_config config = test::shaped(8, 2, 128, 2);
  const llama_weights weights = test::shaped_weights(config, 16);
  struct run {
    std::vector<std::vector<token_id>> tokens;
    engine_stats engine;
    tensor_parallel_stats tp;
  };
  const auto go = [&](const tensor_parallel_options& options) {
    engine e(make_tensor_parallel_backend(config, &weights, options), nullptr, {.block_size = 16, .num_blocks = 96});
    std::mt19937 rng(11);
    std::vector<request_id> ids;
    for (int i = 0; i < 5; ++i) {
      std::vector<token_id> prompt(std::size_t(1 + rng() % 40));
      for (token_id& t : prompt) t = token_id(rng() % std::uint32_t(config.vocab_size));
      ids.push_back(e.add_request(prompt, {.max_tokens = std::int32_t(8 + rng() % 16), .ignore_eos = true}));
    }
    e.run();
    run r{.tokens = {}, .engine = e.stats(), .tp = tensor_parallel_stats_of(e.backend())};
    for (const request_id id : ids) r.tokens.push_back(e.result(id).completions.front().tokens);
    return r;
  };
  const run eager = go({.size = 2, .cuda_graphs = false});
  const run graphed = go({.size = 2, .cuda_graphs = true, .time_graph_collectives = true});
  const run untimed = go({.size = 2});  // the default: graphs, their collectives untimed
  std::cout << "  graphed: " << graphed.tp.steps << " steps, " << graphed.tp.graphs.replays << " replays, "
            << graphed.engine.num_async_steps << " planned ahead; " << graphed.tp.all_reduces << " all-reduces in "
            << graphed.tp.all_reduce_seconds << " s\n";
  EXPECT_EQ(graphed.tokens, eager.tokens) << "decode graphs changed the output";
  EXPECT_EQ(untimed.tokens, eager.tokens) << "untimed decode graphs changed the output";
  EXPECT_GT(graphed.tp.graphs.replays, 1);
  EXPECT_GT(graphed.engine.num_async_steps, 0) << "no graphed step was launched ahead";
  const std::int64_t per_step = 2 * config.num_layers + 1;
  EXPECT_EQ(eager.tp.all_reduces, eager.tp.steps * per_step);
  EXPECT_EQ(graphed.tp.all_reduces, graphed.tp.steps * per_step) << "a replay's all-reduces were not all counted";
  EXPECT_EQ(graphed.tp.untimed_replays, 0);
  EXPECT_GT(graphed.tp.all_reduce_seconds, 0.0);
  EXPECT_EQ(untimed.tp.untimed_replays, untimed.tp.graphs.replays);
  EXPECT_EQ(untimed.tp.all_reduces, (untimed.tp.steps - untimed.tp.graphs.replays) * per_step);
}

/// One step whose rank 1 fails (throws, or hangs until the abort) while rank 0 runs step 2, its
/// all-reduces waiting for rank 1 on the GPU: launched eagerly, or (graphs) replayed from a decode
/// graph (step 0 the prefill, step 1 a decode captured): how long execute took to throw and what
/// it said.
struct failure {
  double seconds = 0.0;
  std::string what;
  std::int32_t rank = -2;
  bool later_step_refused = false;
  std::int64_t replays = 0;
};
failure fail_a_step(bool hang, bool graphs) {
  const llama_config config = test::shaped(8, 2, 128, 2);
  const llama_weights weights = test::shaped_weights(config, 17);
  const std::unique_ptr<model_backend> tp = make_tensor_parallel_backend(
      config, &weights,
      {.size = 2, .step_timeout_s = 5.0, .cuda_graphs = graphs, .fail_rank = 1, .fail_at_step = 2, .fail_by_hanging = hang});
  const kv_cache_options kv{.block_size = 4, .num_device_blocks = 32};
  tp->allocate_kv_cache(kv);
  scheduler<> s({}, kv);
  s.add_request(1, {.prompt = {1, 2, 3, 4, 5}, .max_new_tokens = 8});
  const sampling_batch one_greedy_row{.rows = {row_sampling{.num_draws = 1}}, .uniforms = {0.5}};  // its one row a step
  failure f;
  for (int i = 0; i < 8 && s.has_unfinished(); ++i) {
    const step_plan plan = s.schedule();
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)tp->execute_sampled(plan, one_greedy_row);
    } catch (const tensor_parallel_error& e) {
      f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      f.what = e.what();
      f.rank = e.rank();
      f.replays = tensor_parallel_stats_of(*tp).graphs.replays;
      try {
        (void)tp->execute_sampled(plan, one_greedy_row);
      } catch (const tensor_parallel_error&) {
        f.later_step_refused = true;
      }
      return f;
    }
    s.complete(plan, [](const sampling_request& r) {
      std::vector<continuation> next;
      for (const seq_id seq : r.seqs) next.push_back({seq, 3, false});
      return next;
    });
  }
  return f;
}

void expect_the_failure_ended_the_step(bool graphs) {
  const failure f = fail_a_step(false, graphs);
  std::cout << "  rank 1 threw at step 2: execute threw after " << f.seconds << " s: " << f.what << "\n";
  EXPECT_EQ(f.rank, 1);
  EXPECT_NE(f.what.find("rank 1 failed in step 2: injected failure"), std::string::npos) << f.what;
  EXPECT_NE(f.what.find("communicators were aborted"), std::string::npos) << f.what;
  EXPECT_LT(f.seconds, 5.0) << "the failure, not the deadline, ended the step";
  EXPECT_TRUE(f.later_step_refused);
  EXPECT_EQ(f.replays > 0, graphs) << "with graphs, rank 0 was inside a graph's all-reduce";
}

void expect_the_deadline_ended_the_step(bool graphs) {
  const failure f = fail_a_step(true, graphs);
  std::cout << "  rank 1 hung at step 2: execute threw after " << f.seconds << " s: " << f.what << "\n";
  EXPECT_EQ(f.rank, -1) << "no rank failed before the deadline";
  EXPECT_NE(f.what.find("step 2 passed its deadline"), std::string::npos) << f.what;
  EXPECT_GE(f.seconds, 5.0);
  EXPECT_LT(f.seconds, 20.0) << "the abort ended the other rank's wait";
  EXPECT_TRUE(f.later_step_refused);
  EXPECT_EQ(f.replays > 0, graphs) << "with graphs, rank 0 was inside a graph's all-reduce";
}

TEST_F(TensorParallel, AFailingRankEndsTheStepWithoutAHang) { expect_the_failure_ended_the_step(false); }
TEST_F(TensorParallel, AHungRankIsAbortedAtTheDeadline) { expect_the_deadline_ended_the_step(false); }
// ncclCommAbort ends the collectives in flight at once, then waits until no CUDA graph holds one of
// its communicator's: the backend aborts on a thread of its own and destroys the ranks' graphs
// once their streams are idle (docs/design.md, "CUDA graphs under TP").
TEST_F(TensorParallel, AFailingRankEndsAGraphReplayWithoutAHang) { expect_the_failure_ended_the_step(true); }
TEST_F(TensorParallel, AHungRankInAGraphReplayIsAbortedAtTheDeadline) { expect_the_deadline_ended_the_step(true); }

TEST_F(TensorParallel, RefusesWhatItCannotRun) {
  const hf_checkpoint model = load_hf_checkpoint(golden_dir() / "hf_tiny" / "gqa");
  if (std::string why; !tensor_parallel_available(4, &why)) {
    try {
      (void)make_tensor_parallel_backend(model.config, &model.weights, {.size = 4});
      FAIL() << "4 ranks where " << why;
    } catch (const pagedkv::error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor-parallel size 4 needs 4 GPUs"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)make_tensor_parallel_backend(model.config, &model.weights, {.size = 3}), pagedkv::error);
  llama_config odd = model.config;
  odd.num_heads = 6;
  odd.num_kv_heads = 3;  // 3 KV heads over 2 ranks: neither divides the other
  EXPECT_THROW((void)make_tensor_parallel_backend(odd, nullptr, {.size = 2}), pagedkv::error);
}

// Not skipped without GPUs: the failure injection's ranks are checked before NCCL or any GPU.
TEST(TensorParallelOptions, AFailureInjectionRankOutOfRangeIsRefusedByName) {
  const hf_checkpoint model = load_hf_checkpoint(golden_dir() / "hf_tiny" / "gqa");
  const auto message = [&](const tensor_parallel_options& options) {
    try {
      (void)make_tensor_parallel_backend(model.config, &model.weights, options);
    } catch (const std::exception& e) {  // pagedkv::error, or NCCL's on a host of two GPUs: past the check
      return std::string(e.what());
    }
    return std::string();  // built: two GPUs and NCCL
  };
  for (const std::int32_t rank : {2, 7, -2}) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    const std::string want = " is " + std::to_string(rank) + ": -1 (off) or a rank in [0, 1]";
    const std::string failing = message({.size = 2, .fail_rank = rank, .fail_at_step = 0});
    EXPECT_NE(failing.find("tensor_parallel_options::fail_rank" + want), std::string::npos) << failing;
    const std::string peer = message({.size = 2, .fail_peer_access_rank = rank});
    EXPECT_NE(peer.find("tensor_parallel_options::fail_peer_access_rank" + want), std::string::npos) << peer;
  }
  // -1 and the ranks pass the check: whatever stops them later (no NCCL, too few GPUs) names neither.
  for (const std::int32_t rank : {-1, 0, 1}) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    const std::string failing = message({.size = 2, .fail_rank = rank});
    EXPECT_EQ(failing.find("tensor_parallel_options::fail"), std::string::npos) << failing;
    const std::string peer = message({.size = 2, .fail_peer_access_rank = rank});
    EXPECT_EQ(peer.find("tensor_parallel_options::fail"), std::string::npos) << peer;
  }
}

}  // namespace
