// An attention_case's inputs copied to the device (outputs poisoned), and the host reference of it
// run on every core: what the GPU tests of the prefill and of a mixed step share.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include <pagedkv/reference/attention.hpp>

#include "attention_case.hpp"
#include "gpu_test.cuh"

namespace pagedkv::kernels::testing {

/// Head_dim 128, block 16, bf16: sequences of kv_lens tokens whose last q_lens are queries.
inline case_config prompt_case(int group, int kv_heads, std::vector<std::int32_t> kv_lens, std::vector<std::int32_t> q_lens) {
  case_config cfg;
  cfg.q_dtype = dtype::bf16;
  cfg.kv_dtype = dtype::bf16;
  cfg.head_dim = 128;
  cfg.block_size = 16;
  cfg.group = group;
  cfg.num_kv_heads = kv_heads;
  cfg.kv_lens = std::move(kv_lens);
  cfg.q_lens = std::move(q_lens);
  return cfg;
}

/// The case's inputs on the device, and params pointing at them. o, lse: 0xff bytes (NaN), so an
/// output left unwritten shows.
struct device_inputs {
  cuda::device_kv_pool pool;
  cuda::device_buffer indices, indptr, kv_lens, last_block_len, q_indptr, q, o, lse, k_scales, v_scales, alibi;
  attention_params params;

  explicit device_inputs(const attention_case& c) {
    pool = device_pool_of(c.layout, c.pool);
    indices = cuda::device_buffer::from(c.indices);
    indptr = cuda::device_buffer::from(c.indptr);
    kv_lens = cuda::device_buffer::from(c.kv_lens);
    last_block_len = cuda::device_buffer::from(c.last_block_len);
    q_indptr = cuda::device_buffer::from(c.q_indptr);
    q = cuda::device_buffer::from(c.q);
    o = cuda::device_buffer(c.o.size());
    lse = cuda::device_buffer(c.lse.size() * sizeof(float));
    k_scales = cuda::device_buffer::from(c.k_scales);
    v_scales = cuda::device_buffer::from(c.v_scales);
    alibi = cuda::device_buffer::from(c.alibi_slopes);
    const attention_params& h = c.params;
    params = h;
    params.set_kv(pool.layout(), pool.data(), c.cfg.layer);
    params.q = q.get();
    params.o = o.get();
    params.lse = h.lse ? lse.as<float>() : nullptr;
    params.q_indptr = h.q_indptr ? q_indptr.as<std::int32_t>() : nullptr;
    params.table.indices = indices.as<block_id>();
    params.table.indptr = h.table.indptr ? indptr.as<std::int32_t>() : nullptr;
    params.table.kv_lens = h.table.kv_lens ? kv_lens.as<std::int32_t>() : nullptr;
    params.table.last_block_len = h.table.last_block_len ? last_block_len.as<std::int32_t>() : nullptr;
    params.k_scale_per_head = h.k_scale_per_head ? k_scales.as<float>() : nullptr;
    params.v_scale_per_head = h.v_scale_per_head ? v_scales.as<float>() : nullptr;
    params.alibi_slopes = h.alibi_slopes ? alibi.as<float>() : nullptr;
  }
};

/// reference::attention(c.params) (host pointers: fills c.o and c.lse), its work spread over every
/// core: each job is up to 64 query tokens of one sequence, which attend exactly as the last
/// queries of that sequence cut after the job's last one.
inline void reference_on_all_cores(attention_case& c) {
  const attention_params& p = c.params;
  struct job {
    std::int32_t seq, first, last;  // query tokens [first, last) of seq, from its first
  };
  std::vector<job> jobs;
  for (std::int32_t s = 0; s < p.num_seqs; ++s)
    for (std::int32_t j = 0; j < p.q_len(s); j += 64) jobs.push_back({s, j, std::min(p.q_len(s), j + 64)});
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      const job& w = jobs[i];
      const std::int32_t kv_len = p.kv_len(w.seq), q_len = p.q_len(w.seq), begin = p.q_begin(w.seq);
      const std::int32_t sub_q_indptr[2] = {begin + w.first, begin + w.last};
      const std::int32_t sub_kv_len = kv_len - q_len + w.last;
      attention_params sub = p;
      sub.num_seqs = 1;
      sub.q_indptr = sub_q_indptr;
      sub.table.indices = p.table.is_csr() ? c.indices.data() + c.indptr[std::size_t(w.seq)]
                                           : c.indices.data() + std::size_t(w.seq) * std::size_t(c.max_blocks);
      sub.table.indptr = nullptr;
      sub.table.last_block_len = nullptr;
      sub.table.kv_lens = &sub_kv_len;
      sub.table.max_blocks_per_seq = c.max_blocks;
      sub.max_kv_len = std::max(sub_kv_len, 1);
      reference::attention(sub);
    }
  };
  std::vector<std::thread> threads;
  const unsigned n = std::max(1u, std::min(std::thread::hardware_concurrency(), unsigned(jobs.size())));
  for (unsigned t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
}

/// The host reference's output and LSE of c (after reference_on_all_cores).
inline dense_result reference_result(const attention_case& c) {
  dense_result ref;
  ref.out.resize(c.out_elems());
  for (std::size_t i = 0; i < ref.out.size(); ++i) ref.out[i] = c.out(i);
  ref.lse.assign(c.lse.begin(), c.lse.end());
  return ref;
}

/// The device's o and lse of a finished run of c against c's host reference, already computed
/// (reference_on_all_cores). A run that merged split partials, rounded to q's type, gets twice the
/// tolerance, as a cascade's merge.
inline void expect_computed_reference(const attention_case& c, const cuda::device_buffer& o_dev,
                                      const cuda::device_buffer& lse_dev, bool merged_splits) {
  std::vector<unsigned char> o;
  std::vector<float> lse;
  o_dev.to(o);
  lse_dev.to(lse);
  const comparison cmp = compare(c, o.data(), c.cfg.with_lse ? lse.data() : nullptr, reference_result(c));
  EXPECT_EQ(cmp.non_finite, 0u) << "outputs left unwritten (poison) or NaN";
  EXPECT_LE(cmp.rel_error, (merged_splits ? 2 : 1) * tolerance(c.cfg.q_dtype)) << "merged splits: " << merged_splits;
  EXPECT_LE(cmp.max_lse_error, 2e-3) << "merged splits: " << merged_splits;
}

/// The same, the host reference of c run here first.
inline void expect_reference_output(attention_case& c, const cuda::device_buffer& o_dev,
                                    const cuda::device_buffer& lse_dev, bool merged_splits) {
  reference_on_all_cores(c);
  expect_computed_reference(c, o_dev, lse_dev, merged_splits);
}

}  // namespace pagedkv::kernels::testing
