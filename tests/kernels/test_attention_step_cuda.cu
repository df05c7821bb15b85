// attention_step against the host reference: batches that mix decode tokens and prefill chunks
// (decode sequences first: both kernels; in any other order: exact still), decode-only and
// prefill-only steps, and the plan's choice of kernels.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <pagedkv/cuda/attention_step.cuh>

#include "attention_case.hpp"
#include "device_attention_case.cuh"
#include "gpu_test.cuh"

namespace pk = pagedkv::kernels;
using pk::testing::attention_case;
using pk::testing::case_config;
using pk::cuda::device_buffer;
using pk::testing::device_inputs;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r = pk::testing::seeded_rng();
  return r;
}

/// Runs attention_step on a fresh case and checks it against the host reference; returns the plan.
pk::cuda::attention_step_plan check_step(const case_config& cfg) {
  SCOPED_TRACE(cfg.describe());
  attention_case c;
  pk::testing::make_case(c, cfg, rng());
  device_inputs d(c);
  const std::vector<std::int32_t> host_q_indptr = c.params.q_indptr ? c.q_indptr : std::vector<std::int32_t>{};
  const auto plan = pk::cuda::plan_attention_step(d.params, host_q_indptr);
  const device_buffer workspace(plan.workspace_bytes);  // 0xff: NaN
  pk::cuda::attention_step(d.params, plan, workspace.get(), workspace.bytes());
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  pk::testing::expect_reference_output(c, d.o, d.lse, plan.prefill.num_splits > 1);  // the decode merges in fp32
  return plan;
}

/// Llama-3-8B's grouping scaled down (2 KV heads of 4), head_dim 128, bf16 q over KV of type kv.
case_config step_case(pk::dtype kv, std::vector<std::int32_t> kv_lens, std::vector<std::int32_t> q_lens) {
  case_config cfg = pk::testing::prompt_case(4, 2, std::move(kv_lens), std::move(q_lens));
  cfg.kv_dtype = kv;
  return cfg;
}

class AttentionStepCuda : public ::testing::Test {
 protected:
  void SetUp() override { PAGEDKV_SKIP_WITHOUT_GPU(); }
};

}  // namespace

// Five decode sequences (one of 9000 tokens: split-K), then three prefill chunks (a new prompt,
// a chunk over a cached prefix, a chunk over 8000 tokens), dense and CSR, bf16 and fp8 KV.
TEST_F(AttentionStepCuda, DecodeSequencesThenPrefillChunks) {
  for (const pk::dtype kv : {pk::dtype::bf16, pk::dtype::fp8_e4m3})
    for (const bool csr : {false, true}) {
      case_config cfg = step_case(kv, {1, 37, 9000, 400, 2, 300, 700, 8512}, {1, 1, 1, 1, 1, 300, 250, 512});
      cfg.csr = csr;
      cfg.per_head_scale = kv == pk::dtype::fp8_e4m3;
      const auto plan = check_step(cfg);
      EXPECT_EQ(plan.num_decode_seqs, 5);
      EXPECT_TRUE(plan.has_prefill());
    }
}

// Decode sequences after a prefill chunk run on the prefill kernel: exact, in one call.
TEST_F(AttentionStepCuda, DecodeSequencesInAnyOrder) {
  case_config cfg = step_case(pk::dtype::bf16, {300, 5, 1200, 3, 77}, {100, 1, 1, 3, 1});
  cfg.alibi = true;
  cfg.window_left = 500;
  EXPECT_EQ(check_step(cfg).num_decode_seqs, 0);
  cfg.q_lens = {1, 1, 40, 1, 77};
  EXPECT_EQ(check_step(cfg).num_decode_seqs, 2);
}

TEST_F(AttentionStepCuda, DecodeOnlyAndPrefillOnlySteps) {
  case_config cfg = step_case(pk::dtype::bf16, {1, 700, 5000}, {});
  cfg.q_len = 1;  // q_indptr nullptr: every sequence one token
  auto plan = check_step(cfg);
  EXPECT_EQ(plan.num_decode_seqs, 3);
  EXPECT_FALSE(plan.has_prefill());
  cfg.q_lens = {1, 1, 1};  // the same through q_indptr
  EXPECT_EQ(check_step(cfg).num_decode_seqs, 3);
  cfg.q_lens = {1, 700, 2000};
  cfg.kv_lens = {1, 700, 2000};
  plan = check_step(cfg);
  EXPECT_EQ(plan.num_decode_seqs, 1);
  cfg.q_lens = {2, 700, 2000};
  cfg.kv_lens = {2, 700, 2000};
  plan = check_step(cfg);
  EXPECT_EQ(plan.num_decode_seqs, 0);
  EXPECT_EQ(plan.decode.workspace_bytes, 0u);
}

TEST(AttentionStepErrors, AShortWorkspaceOrAnotherBatchIsRefused) {
  // The checks run before any device call, so this test needs no GPU.
  pk::attention_params p;
  p.num_seqs = 2;
  pk::cuda::attention_step_plan plan;
  plan.num_seqs = 3;
  try {
    pk::cuda::attention_step(p, plan, nullptr, 0);
    ADD_FAILURE() << "no error";
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("made for 3 sequences"), std::string::npos) << e.what();
  }
  plan.num_seqs = 2;
  plan.num_decode_seqs = 2;
  plan.workspace_bytes = 512;
  try {
    pk::cuda::attention_step(p, plan, nullptr, 100);
    ADD_FAILURE() << "no error";
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::buffer_too_small);
    EXPECT_NE(std::string(e.what()).find("workspace of 100 bytes, the plan needs 512"), std::string::npos) << e.what();
  }
}
