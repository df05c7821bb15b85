#include "model.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <thread>

#include <pagedkv/error.hpp>
#include <pagedkv/reference/attention.hpp>
#include <pagedkv/reference/cache_ops.hpp>

namespace pagedkv::llama {

kernels::kv_cache_layout paged_kv_cache_layout(const llama_config& config, std::int32_t num_blocks,
                                               std::int32_t block_size) {
  const kernels::kv_cache_shape shape{.num_layers = std::int32_t(config.num_layers),
                                      .num_blocks = num_blocks,
                                      .block_size = block_size,
                                      .num_kv_heads = std::int32_t(config.num_kv_heads),
                                      .head_dim = std::int32_t(config.head_dim)};
  return kernels::make_kv_cache_layout(shape, kernels::kv_layout::nhd, kernels::dtype::f32);
}

paged_kv_cache make_paged_kv_cache(const llama_config& config, std::int32_t num_blocks, std::int32_t block_size) {
  paged_kv_cache cache;
  cache.layout = paged_kv_cache_layout(config, num_blocks, block_size);
  cache.data.assign(std::size_t(cache.layout.size()), 0.0f);
  return cache;
}

attention_groups attention_groups_of(const llama_config& config) {
  attention_groups groups;
  for (std::int64_t l = 0; l < config.num_layers; ++l) {
    const std::int32_t window = config.window(l);
    const kv_cache_spec spec = window > 0 ? kv_cache_spec::sliding_window(window) : kv_cache_spec::full_attention();
    const auto it = std::find(groups.specs.begin(), groups.specs.end(), spec);
    groups.group_of_layer.push_back(std::int32_t(it - groups.specs.begin()));
    if (it == groups.specs.end()) groups.specs.push_back(spec);
  }
  return groups;
}

namespace {

// ---- blocks ----------------------------------------------------------------------------------

/// out[n, dim] = x[n, dim] / rms(x) * gain
void rmsnorm(float* out, const float* x, const float* gain, std::int64_t n, std::int64_t dim, float eps) {
  for (std::int64_t t = 0; t < n; ++t) {
    const float* row = x + t * dim;
    double ss = 0.0;
    for (std::int64_t i = 0; i < dim; ++i) ss += double(row[i]) * row[i];
    const float scale = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
    for (std::int64_t i = 0; i < dim; ++i) out[t * dim + i] = row[i] * scale * gain[i];
  }
}

/// y[n, out] = x[n, in] W[out, in]^T, through OpenBLAS (which threads over the machine's cores).
void matmul(float* y, const float* x, const std::vector<float>& w, std::int64_t n, std::int64_t in, std::int64_t out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out), int(in), 1.0f, x, int(in), w.data(), int(in),
              0.0f, y, int(out));
}

/// The host reference attention with the query heads split over the pool's threads: each thread
/// writes its own heads' rows of o, so the result is bit for bit that of one call.
void attention(const kernels::attention_params& att, forward_state& s) {
  const std::int32_t wanted = s.attention_threads > 0 ? s.attention_threads
                                                      : std::int32_t(std::thread::hardware_concurrency());
  const std::int32_t threads = std::clamp(wanted, 1, att.num_qo_heads);
  if (threads == 1) {
    kernels::reference::attention(att);
    return;
  }
  if (!s.pool || s.pool->size() != threads) s.pool = std::make_shared<thread_pool>(threads);
  kernels::check(att);  // before any thread starts: a bad param throws once, here
  s.pool->run(threads, [&](std::int32_t i) {
    kernels::reference::attention_heads(att, att.num_qo_heads * i / threads, att.num_qo_heads * (i + 1) / threads);
  });
}

void check_batch(const llama_config& config, const attention_groups& groups, const paged_kv_cache& cache,
                 const forward_batch& b) {
  using pagedkv::detail::fail;
  const auto n = std::size_t(b.num_tokens());
  if (b.num_groups != std::int32_t(groups.specs.size()))
    fail(errc::invalid_argument, "forward_batch: ", b.num_groups, " KV cache groups for a model of ",
         groups.specs.size());
  const auto num_groups = std::size_t(b.num_groups);
  if (b.positions.size() != n || b.slot_mapping.size() != n * num_groups)
    fail(errc::invalid_argument, "forward_batch: ", n, " tokens but ", b.positions.size(), " positions and ",
         b.slot_mapping.size(), " slots for ", num_groups, " groups");
  if (b.q_indptr.empty() || b.q_indptr.front() != 0 || b.q_indptr.back() != b.num_tokens())
    fail(errc::invalid_argument, "forward_batch: q_indptr must run from 0 to num_tokens ", n);
  if (b.kv_lens.size() != std::size_t(b.num_seqs()) ||
      b.block_table.size() != num_groups * std::size_t(b.num_seqs()) * std::size_t(b.max_blocks_per_seq))
    fail(errc::invalid_argument, "forward_batch: ", b.num_seqs(), " sequences need as many kv_lens (got ",
         b.kv_lens.size(), ") and a block_table of num_groups x num_seqs x max_blocks_per_seq (got ",
         b.block_table.size(), ")");
  const std::int32_t bs = cache.layout.shape.block_size;
  for (std::int32_t s = 0; s < b.num_seqs(); ++s) {
    const std::int32_t q_len = b.q_indptr[s + 1] - b.q_indptr[s];
    if (q_len < 0 || q_len > b.kv_lens[s] || (b.kv_lens[s] + bs - 1) / bs > b.max_blocks_per_seq)
      fail(errc::invalid_argument, "forward_batch: sequence ", s, " has ", q_len, " query tokens, kv_len ",
           b.kv_lens[s], " and room for ", b.max_blocks_per_seq, " blocks of ", bs);
  }
  for (const token_id t : b.tokens)
    if (t < 0 || t >= config.vocab_size)
      fail(errc::invalid_argument, "forward_batch: token ", t, " outside the vocabulary of ", config.vocab_size);
  for (const std::int32_t r : b.logit_rows)
    if (r < 0 || r >= b.num_tokens())
      fail(errc::invalid_argument, "forward_batch: logit row ", r, " outside [0, ", n, ")");
}

}  // namespace

// ---- forward ---------------------------------------------------------------------------------

const std::vector<float>& forward(const llama_config& config, const llama_weights& weights, paged_kv_cache& cache,
                                  const forward_batch& batch, forward_state& s) {
  const attention_groups groups = attention_groups_of(config);
  check_batch(config, groups, cache, batch);
  const std::int64_t n = batch.num_tokens(), dim = config.embedding_dim, ffn = config.ffn_dim;
  const std::int64_t q_dim = config.num_heads * config.head_dim, kv_dim = config.kv_dim();
  s.x.resize(std::size_t(n * dim));
  s.xb.resize(std::size_t(n * dim));
  s.q.resize(std::size_t(n * q_dim));
  s.k.resize(std::size_t(n * kv_dim));
  s.v.resize(std::size_t(n * kv_dim));
  s.att.resize(std::size_t(n * q_dim));
  s.gate.resize(std::size_t(n * ffn));
  s.up.resize(std::size_t(n * ffn));

  // RoPE: the table is dim / 2 powf, rebuilt each step so it can never be stale; the angles of
  // this step's tokens serve q and k of every layer.
  s.rope = make_rope_table(config);
  compute_rope_angles(s.rope, batch.positions.data(), n, s.angles);

  for (std::int64_t t = 0; t < n; ++t) {
    const float* row = weights.token_embedding.data() + std::int64_t(batch.tokens[std::size_t(t)]) * dim;
    std::copy(row, row + dim, s.x.begin() + t * dim);
  }

  kernels::attention_params att;
  att.q = s.q.data();
  att.o = s.att.data();
  att.q_indptr = batch.q_indptr.data();
  att.table.indices = batch.block_table.data();
  att.table.kv_lens = batch.kv_lens.data();
  att.table.max_blocks_per_seq = batch.max_blocks_per_seq;
  att.num_seqs = batch.num_seqs();
  att.num_qo_heads = std::int32_t(config.num_heads);
  att.sm_scale = 1.0f / std::sqrt(float(config.head_dim));
  att.q_dtype = kernels::dtype::f32;
  for (const std::int32_t len : batch.kv_lens) att.max_kv_len = std::max(att.max_kv_len, len);

  kernels::write_kv_params write;
  write.k_new = s.k.data();
  write.v_new = s.v.data();
  write.slot_mapping = batch.slot_mapping.data();
  write.pool = cache.data.data();
  write.layout = cache.layout;
  write.num_tokens = std::int32_t(n);
  write.src_dtype = kernels::dtype::f32;

  for (std::int64_t l = 0; l < config.num_layers; ++l) {
    const llama_layer_weights& w = weights.layers[std::size_t(l)];
    // attention block
    rmsnorm(s.xb.data(), s.x.data(), w.attn_norm.data(), n, dim, config.rms_norm_eps);
    matmul(s.q.data(), s.xb.data(), w.wq, n, dim, q_dim);
    matmul(s.k.data(), s.xb.data(), w.wk, n, dim, kv_dim);
    matmul(s.v.data(), s.xb.data(), w.wv, n, dim, kv_dim);
    apply_rope(s.q.data(), n, config.num_heads, config.head_dim, s.angles);
    apply_rope(s.k.data(), n, config.num_kv_heads, config.head_dim, s.angles);
    // The layer's KV cache group: its slots, its tables, its window (window_left = W - 1).
    const auto group = std::size_t(groups.group_of_layer[std::size_t(l)]);
    write.slot_mapping = batch.slot_mapping.data() + group * std::size_t(n);
    att.table.indices = batch.block_table.data() + group * std::size_t(batch.num_seqs()) * std::size_t(batch.max_blocks_per_seq);
    att.window_left = groups.specs[group].kernel_window_left();
    write.layer = std::int32_t(l);
    kernels::reference::write_kv(write);
    att.set_kv(cache.layout, cache.data.data(), std::int32_t(l));
    attention(att, s);
    matmul(s.xb.data(), s.att.data(), w.wo, n, q_dim, dim);
    for (std::int64_t i = 0; i < n * dim; ++i) s.x[std::size_t(i)] += s.xb[std::size_t(i)];
    // feed-forward block: down(silu(gate x) * up x)
    rmsnorm(s.xb.data(), s.x.data(), w.ffn_norm.data(), n, dim, config.rms_norm_eps);
    matmul(s.gate.data(), s.xb.data(), w.w_gate, n, dim, ffn);
    matmul(s.up.data(), s.xb.data(), w.w_up, n, dim, ffn);
    for (std::int64_t i = 0; i < n * ffn; ++i) {
      const float g = s.gate[std::size_t(i)];
      s.gate[std::size_t(i)] = g / (1.0f + std::exp(-g)) * s.up[std::size_t(i)];
    }
    matmul(s.xb.data(), s.gate.data(), w.w_down, n, ffn, dim);
    for (std::int64_t i = 0; i < n * dim; ++i) s.x[std::size_t(i)] += s.xb[std::size_t(i)];
  }

  // final norm and LM head, only for the rows that produce logits
  const auto num_rows = std::int64_t(batch.logit_rows.size());
  s.rows.resize(std::size_t(num_rows * dim));
  s.logits.resize(std::size_t(num_rows * config.vocab_size));
  for (std::int64_t r = 0; r < num_rows; ++r)
    rmsnorm(s.rows.data() + r * dim, s.x.data() + std::int64_t(batch.logit_rows[std::size_t(r)]) * dim,
            weights.output_norm.data(), 1, dim, config.rms_norm_eps);
  if (num_rows > 0) matmul(s.logits.data(), s.rows.data(), weights.output_matrix(), num_rows, dim, config.vocab_size);
  return s.logits;
}

}  // namespace pagedkv::llama
