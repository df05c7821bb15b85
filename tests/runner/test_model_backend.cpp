// The engine's model-backend seam: the engine runs any model_backend, chosen at run time; it hands
// the backend the manager's pool sizes once and each step's plan, and applies the logits it gets.
// A scripted backend stands in for a device the engine has never heard of; the CPU backend's
// factory, sizing and misuse are checked beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pagedkv/error.hpp>

#include "engine.hpp"
#include "model_backend.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv::llama;
using pagedkv::token_id;

/// A backend whose model continues every sequence with its last input token + 1 (mod vocab): its
/// logits row for a sequence peaks there. It records what the engine handed it.
class scripted_backend final : public model_backend {
 public:
  static constexpr std::int64_t vocab = 16;

  struct log {
    std::vector<pagedkv::kv_cache_options> allocations;
    std::vector<pagedkv::step_plan> plans;
  };
  explicit scripted_backend(log& out) : log_(out) {}

  [[nodiscard]] std::int64_t vocab_size() const noexcept override { return vocab; }
  [[nodiscard]] pagedkv::kernels::kv_cache_layout kv_layout(std::int32_t num_blocks,
                                                            std::int32_t block_size) const override {
    return pagedkv::kernels::make_kv_cache_layout(
        {.num_layers = 1, .num_blocks = num_blocks, .block_size = block_size, .num_kv_heads = 1, .head_dim = 4},
        pagedkv::kernels::kv_layout::nhd, pagedkv::kernels::dtype::bf16);
  }
  void allocate_kv_cache(const pagedkv::kv_cache_options& kv) override { log_.allocations.push_back(kv); }
  std::span<const float> execute(const pagedkv::step_plan& plan) override {
    log_.plans.push_back(plan);
    logits_.clear();
    for (const pagedkv::scheduled_sequence& q : plan.batch) {
      if (!q.produces_logits) continue;
      const token_id last = plan.input_tokens[q.slot_offset + std::size_t(q.num_tokens) - 1];
      std::vector<float> row(vocab, 0.0f);
      row[std::size_t((last + 1) % vocab)] = 10.0f;
      logits_.insert(logits_.end(), row.begin(), row.end());
    }
    return logits_;
  }

 private:
  log& log_;
  std::vector<float> logits_;
};

TEST(model_backend, the_engine_runs_a_backend_it_does_not_know) {
  scripted_backend::log log;
  const engine_options options{.block_size = 4, .num_blocks = 8, .max_tokens_per_step = 3};
  engine e(std::make_unique<scripted_backend>(log), nullptr, options);
  ASSERT_EQ(log.allocations.size(), 1u) << "the pools are allocated once, by the engine";
  EXPECT_EQ(log.allocations[0].block_size, 4);
  EXPECT_EQ(log.allocations[0].num_device_blocks, 8);
  EXPECT_EQ(log.allocations[0].num_host_blocks, 0) << "recompute needs no host pool";

  const auto id = e.add_request({3, 4, 5, 6, 7}, {.max_tokens = 6});
  e.run();
  EXPECT_EQ(e.result(id).completions.at(0).tokens, (std::vector<token_id>{8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(e.result(id).num_prefill_chunks, 2) << "a 5-token prompt under a budget of 3";

  // What the backend saw: the prompt in two chunks, then one decode token a step, each with the
  // table row up to its kv_len.
  ASSERT_EQ(log.plans.size(), 2u + 5u);
  EXPECT_EQ(log.plans[0].input_tokens, (std::vector<token_id>{3, 4, 5}));
  EXPECT_EQ(log.plans[1].input_tokens, (std::vector<token_id>{6, 7}));
  EXPECT_EQ(log.plans[2].input_tokens, (std::vector<token_id>{8}));
  for (const pagedkv::step_plan& p : log.plans) {
    ASSERT_EQ(p.batch.size(), 1u);
    EXPECT_EQ(p.kv_lens.at(0), p.batch[0].kv_len());
    EXPECT_EQ(p.max_blocks_per_seq, (p.batch[0].kv_len() + 3) / 4);
  }
  EXPECT_EQ(e.stats().num_steps, 7);
}

TEST(model_backend, swap_gives_the_backend_a_host_pool) {
  scripted_backend::log log;
  engine e(std::make_unique<scripted_backend>(log), nullptr,
           {.block_size = 4, .num_blocks = 8, .preemption = pagedkv::preemption_mode::swap});
  ASSERT_EQ(log.allocations.size(), 1u);
  EXPECT_EQ(log.allocations[0].num_host_blocks, 8) << "0 host blocks under swap means as many as the device pool";
}

/// The KV layout of the test backends below: one layer, one head of 4, f32.
pagedkv::kernels::kv_cache_layout one_layer_f32(std::int32_t num_blocks, std::int32_t block_size) {
  return pagedkv::kernels::make_kv_cache_layout(
      {.num_layers = 1, .num_blocks = num_blocks, .block_size = block_size, .num_kv_heads = 1, .head_dim = 4},
      pagedkv::kernels::kv_layout::nhd, pagedkv::kernels::dtype::f32);
}

TEST(model_backend, the_engine_takes_only_what_the_backend_sampled) {
  // A device backend samples where its logits are: execute() is never called by the engine, and
  // every request kind (greedy, sampled with n = 3, beams) runs on execute_sampled's choices.
  class sampling_backend final : public model_backend {
   public:
    std::int32_t calls = 0;
    std::vector<pagedkv::llama::sampling_batch> batches;
    [[nodiscard]] std::int64_t vocab_size() const noexcept override { return 16; }
    [[nodiscard]] pagedkv::kernels::kv_cache_layout kv_layout(std::int32_t num_blocks,
                                                              std::int32_t block_size) const override {
      return one_layer_f32(num_blocks, block_size);
    }
    void allocate_kv_cache(const pagedkv::kv_cache_options&) override {}
    std::span<const float> execute(const pagedkv::step_plan&) override {
      ADD_FAILURE() << "the engine asked for logits";
      return {};
    }
    step_samples execute_sampled(const pagedkv::step_plan& plan, const sampling_batch& sampling) override {
      ++calls;
      batches.push_back(sampling);
      draws_.clear();
      candidates_.clear();
      std::size_t row = 0;
      for (const pagedkv::scheduled_sequence& q : plan.batch) {
        if (!q.produces_logits) continue;
        const row_sampling& s = sampling.rows[row++];
        const token_id last = plan.input_tokens[q.slot_offset + std::size_t(q.num_tokens) - 1];
        for (std::int32_t d = 0; d < s.num_draws; ++d)  // a draw's token says which uniform it had
          draws_.push_back({token_id((last + 1 + d) % 16), -0.5});
        for (std::int32_t c = 0; c < s.num_candidates; ++c) candidates_.push_back({token_id((last + 1 + c) % 16), -1.0 - c});
      }
      return {draws_, candidates_};
    }
  };
  auto owned = std::make_unique<sampling_backend>();
  sampling_backend& b = *owned;
  engine e(std::move(owned), nullptr, {.block_size = 4, .num_blocks = 32, .eos_id = -1});
  const auto greedy = e.add_request({1, 2}, {.max_tokens = 3});
  const auto three = e.add_request({5}, {.max_tokens = 2, .temperature = 1.0f, .top_k = 4, .top_p = 0.5f, .n = 3});
  const auto beams = e.add_request({9}, {.max_tokens = 2, .beam_width = 2});
  e.run();
  EXPECT_GT(b.calls, 0);
  EXPECT_EQ(e.result(greedy).completions[0].tokens, (std::vector<token_id>{3, 4, 5}));
  EXPECT_DOUBLE_EQ(e.result(greedy).completions[0].logprob, -1.5);
  const auto& samples = e.result(three).completions;
  ASSERT_EQ(samples.size(), 3u);
  for (std::int32_t i = 0; i < 3; ++i)  // sample i took the prompt row's draw i, then its own row's one draw
    EXPECT_EQ(samples[std::size_t(i)].tokens, (std::vector<token_id>{token_id(6 + i), token_id(7 + i)}));
  const auto& hyps = e.result(beams).completions;
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].tokens, (std::vector<token_id>{10, 11}));  // the best candidate of the best beam
  EXPECT_DOUBLE_EQ(hyps[0].logprob, -2.0);
  // What the engine asked for the first step: rows of the three requests in batch order.
  const sampling_batch& first = b.batches.front();
  ASSERT_EQ(first.rows.size(), 3u);
  EXPECT_EQ(first.rows[0].num_draws, 1);
  EXPECT_EQ(first.rows[0].temperature, 0.0f);
  EXPECT_EQ(first.rows[1].num_draws, 3) << "n samples draw n times from the prompt's row";
  EXPECT_EQ(first.rows[1].top_k, 4);
  EXPECT_EQ(first.rows[1].top_p, 0.5f);
  EXPECT_EQ(first.rows[2].num_draws, 0);
  EXPECT_EQ(first.rows[2].num_candidates, 4) << "beam search wants 2k candidates a beam";
  ASSERT_EQ(first.uniforms.size(), 4u);
  EXPECT_EQ(first.uniforms[1], request_uniform(0, 0, 0));
  EXPECT_EQ(first.uniforms[3], request_uniform(0, 2, 0));
}

TEST(model_backend, logits_of_the_wrong_size_are_refused) {
  // A backend that returns one row too few: the engine names the mismatch instead of reading past it.
  class short_backend final : public model_backend {
   public:
    [[nodiscard]] std::int64_t vocab_size() const noexcept override { return 4; }
    [[nodiscard]] pagedkv::kernels::kv_cache_layout kv_layout(std::int32_t num_blocks,
                                                              std::int32_t block_size) const override {
      return one_layer_f32(num_blocks, block_size);
    }
    void allocate_kv_cache(const pagedkv::kv_cache_options&) override {}
    std::span<const float> execute(const pagedkv::step_plan&) override { return {}; }
  };
  engine e(std::make_unique<short_backend>(), nullptr, {.block_size = 4, .num_blocks = 8});
  e.add_request({1, 2}, {.max_tokens = 2});
  try {
    e.step();
    FAIL() << "an empty logits span for one row";
  } catch (const pagedkv::error& error) {
    EXPECT_NE(std::string(error.what()).find("returned 0 logits for 1 rows of 4"), std::string::npos) << error.what();
  }
  EXPECT_THROW(engine(nullptr, nullptr, {}), pagedkv::error);
}

TEST(model_backend, the_cpu_backend_is_chosen_by_name_with_its_kv_dtype) {
  const test::tiny_model& m = test::shared_tiny_model();
  const auto devices = model_backend_devices();
  EXPECT_NE(std::find(devices.begin(), devices.end(), "cpu"), devices.end());
  const std::unique_ptr<model_backend> cpu = make_model_backend(m.config, m.weights, {.device = "cpu"});
  EXPECT_EQ(cpu->vocab_size(), m.config.vocab_size);
  EXPECT_EQ(cpu->kv_layout(3, 4).kv_dtype, pagedkv::kernels::dtype::f32);
  EXPECT_EQ(cpu->kv_layout(3, 4).shape.num_blocks, 3);
  try {
    (void)make_model_backend(m.config, m.weights, {.device = "tpu"});
    FAIL() << "no such device";
  } catch (const pagedkv::error& e) {
    EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  try {
    (void)make_model_backend(m.config, m.weights, {.device = "cpu", .kv_dtype = pagedkv::kernels::dtype::bf16});
    FAIL() << "the CPU forward stores f32 only";
  } catch (const pagedkv::error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(model_backend, the_cpu_backend_runs_only_what_it_allocated) {
  const test::tiny_model& m = test::shared_tiny_model();
  const std::unique_ptr<model_backend> cpu = make_model_backend(m.config, m.weights);
  pagedkv::scheduler<> s({}, {.block_size = 4, .num_device_blocks = 4});
  s.add_request(1, {.prompt = {1, 2, 3}});
  const pagedkv::step_plan plan = s.schedule();
  EXPECT_THROW((void)cpu->execute(plan), pagedkv::error) << "no pools yet";
  cpu->allocate_kv_cache(s.kv().options());
  EXPECT_EQ(cpu->execute(plan).size(), std::size_t(m.config.vocab_size));
  pagedkv::step_plan swapping = plan;
  swapping.swap_out.push_back({.src = 0, .dst = 0});
  EXPECT_THROW((void)cpu->execute(swapping), pagedkv::error) << "no host pool to swap to";
}

TEST(model_backend, reserve_steps_refuses_sizes_below_one_naming_both) {
  // Every backend's reserve_steps (the default here; the CUDA and tensor-parallel ones call the
  // same check first) refuses before anything changes, naming both sizes.
  const test::tiny_model& m = test::shared_tiny_model();
  const std::unique_ptr<model_backend> cpu = make_model_backend(m.config, m.weights);
  for (const auto& [tokens, seqs] : {std::pair{0, 8}, std::pair{64, -3}, std::pair{0, 0}}) {
    try {
      cpu->reserve_steps(tokens, seqs);
      ADD_FAILURE() << "reserve_steps(" << tokens << ", " << seqs << ") was not refused";
    } catch (const pagedkv::error& e) {
      EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
      const std::string named = "max_tokens " + std::to_string(tokens) + " and max_seqs " + std::to_string(seqs);
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(cpu->reserve_steps(1, 1));
}

}  // namespace
