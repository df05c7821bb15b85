// Builds random paged-attention inputs (pool, block tables, queries) on the host, and the naive
// dense attention in double precision that every implementation is checked against. Shared by
// the CPU tests of the host reference and the GPU tests of the CUDA kernels.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <pagedkv/attention_params.hpp>
#include <pagedkv/kv_dtype.hpp>
#include <pagedkv/kv_layout.hpp>
#include <pagedkv/merge_params.hpp>

namespace pagedkv::kernels::testing {

/// A generator seeded from the device's entropy, the seed printed so that a failure can be
/// replayed.
inline std::mt19937_64 seeded_rng() {
  const std::uint64_t seed = std::random_device{}();
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

struct case_config {
  std::vector<std::int32_t> kv_lens;  ///< one per sequence
  std::int32_t q_len = 1;             ///< query tokens per sequence, clamped to kv_len
  std::vector<std::int32_t> q_lens;   ///< per sequence instead of q_len (each clamped to [1, kv_len]);
                                      ///< sets q_indptr even where every one is 1
  std::int32_t num_kv_heads = 1;
  std::int32_t group = 1;
  std::int32_t head_dim = 64;
  std::int32_t block_size = 16;
  dtype q_dtype = dtype::f32;
  dtype kv_dtype = dtype::f32;
  kv_layout layout = kv_layout::nhd;
  layer_order order = layer_order::layer_major;
  std::int32_t num_layers = 1;
  std::int32_t layer = 0;
  bool csr = false;
  bool per_head_scale = false;
  std::int32_t window_left = -1;
  float soft_cap = 0.0f;
  bool alibi = false;                 ///< ALiBi, slopes 2^(-8 (h + 1) / heads): BLOOM's for a
                                      ///< power-of-two head count
  bool with_lse = true;
  float q_magnitude = 1.0f;           ///< q is multiplied by it and sm_scale divided by it: the same
                                      ///< logits from q of another magnitude (exact for a power of two)
  std::int32_t max_splits = 0;        ///< attention_params::max_splits (0: the kernel's choice)
  std::int32_t extra_blocks = 3;      ///< unused blocks in the pool, filled with poison

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << "seqs=" << kv_lens.size() << " kv_lens=[";
    for (std::size_t i = 0; i < kv_lens.size() && i < 8; ++i) s << (i ? "," : "") << kv_lens[i];
    if (kv_lens.size() > 8) s << ",...";
    s << "] q_len=" << q_len;
    if (!q_lens.empty()) {
      s << " q_lens=[";
      for (std::size_t i = 0; i < q_lens.size() && i < 8; ++i) s << (i ? "," : "") << q_lens[i];
      s << (q_lens.size() > 8 ? ",...]" : "]");
    }
    s << " kv_heads=" << num_kv_heads << " group=" << group << " head_dim=" << head_dim
      << " block_size=" << block_size << " q=" << to_string(q_dtype) << " kv=" << to_string(kv_dtype)
      << " layout=" << (layout == kv_layout::nhd ? "nhd" : "hnd")
      << " order=" << (order == layer_order::layer_major ? "layer_major" : "block_major") << " layer=" << layer
      << "/" << num_layers << " table=" << (csr ? "csr" : "dense") << " per_head_scale=" << per_head_scale
      << " window=" << window_left << " soft_cap=" << soft_cap << " alibi=" << alibi << " q_magnitude=" << q_magnitude;
    return s.str();
  }
};

/// Writes x as dtype t at element index i of a byte buffer.
/// A case of a block size x GQA group x head_dim x dtype sweep: its KV head count, layout, layer
/// order and count, table format and scale kind chosen by its place in the sweep, so that
/// neighbouring cases cover each of them.
inline case_config sweep_case(std::int32_t block_size, std::int32_t group, std::int32_t head_dim, dtype q, dtype kv,
                              int place) {
  case_config cfg;
  cfg.block_size = block_size;
  cfg.group = group;
  cfg.head_dim = head_dim;
  cfg.q_dtype = q;
  cfg.kv_dtype = kv;
  cfg.num_kv_heads = 1 + place % 3;
  cfg.layout = place % 2 ? kv_layout::hnd : kv_layout::nhd;
  cfg.order = place % 4 < 2 ? layer_order::layer_major : layer_order::block_major;
  cfg.num_layers = 1 + place % 2;
  cfg.layer = place % 2;
  cfg.csr = place % 3 == 1;
  cfg.per_head_scale = place % 2 == 0;
  return cfg;
}

inline void store_as(dtype t, unsigned char* base, std::size_t i, float x) {
  host::visit_dtype(t, [&]<class T>() {
    const T value = host::from_float<T>(x);
    std::memcpy(base + i * sizeof(T), &value, sizeof(T));
  });
}
inline float load_as(dtype t, const unsigned char* base, std::size_t i) {
  return host::visit_dtype(t, [&]<class T>() {
    T value;
    std::memcpy(&value, base + i * sizeof(T), sizeof(T));
    return host::to_float(value);
  });
}
/// NaN in every dtype: what an element nobody should read or everybody should write holds.
inline void poison(dtype t, unsigned char* base, std::size_t n) {
  if (t == dtype::f32) { std::fill_n(reinterpret_cast<float*>(base), n, std::numeric_limits<float>::quiet_NaN()); return; }
  if (t == dtype::fp8_e4m3) { std::memset(base, 0x7f, n); return; }
  const std::uint16_t nan = t == dtype::f16 ? 0x7e00 : 0x7fc0;
  for (std::size_t i = 0; i < n; ++i) std::memcpy(base + 2 * i, &nan, 2);
}

struct attention_case {
  case_config cfg;
  kv_cache_layout layout;
  std::vector<unsigned char> pool;
  std::vector<block_id> indices;  ///< dense [num_seqs, max_blocks] or CSR [nnz]
  std::vector<std::int32_t> indptr, kv_lens, last_block_len, q_indptr;
  std::vector<unsigned char> q, o;
  std::vector<float> lse, k_scales, v_scales, alibi_slopes;
  std::int32_t num_q_tokens = 0;
  std::int32_t max_blocks = 0;
  attention_params params;        ///< host pointers into the vectors above

  attention_case() = default;
  attention_case(const attention_case&) = delete;
  attention_case& operator=(const attention_case&) = delete;

  [[nodiscard]] std::int32_t num_qo_heads() const { return cfg.num_kv_heads * cfg.group; }
  [[nodiscard]] std::size_t out_elems() const { return std::size_t(num_q_tokens) * num_qo_heads() * cfg.head_dim; }
  [[nodiscard]] float out(std::size_t i) const { return load_as(cfg.q_dtype, o.data(), i); }
};

inline void make_case(attention_case& c, const case_config& cfg, std::mt19937_64& rng) {
  c.cfg = cfg;
  const auto num_seqs = std::int32_t(cfg.kv_lens.size());
  const std::int32_t bs = cfg.block_size;
  std::vector<std::int32_t> blocks_of(static_cast<std::size_t>(num_seqs));
  std::int32_t total_blocks = 0;
  c.max_blocks = 1;
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    blocks_of[std::size_t(s)] = (cfg.kv_lens[std::size_t(s)] + bs - 1) / bs;
    total_blocks += blocks_of[std::size_t(s)];
    c.max_blocks = std::max(c.max_blocks, blocks_of[std::size_t(s)]);
  }
  kv_cache_shape shape{cfg.num_layers, total_blocks + cfg.extra_blocks, bs, cfg.num_kv_heads, cfg.head_dim};
  c.layout = make_kv_cache_layout(shape, cfg.layout, cfg.kv_dtype, cfg.order);
  c.pool.assign(c.layout.size_bytes(), 0);
  poison(cfg.kv_dtype, c.pool.data(), std::size_t(c.layout.size()));

  // Sequences own a random permutation of the blocks, so the table is never the identity.
  std::vector<block_id> perm(std::size_t(shape.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.indices.clear();
  c.indptr.assign(1, 0);
  c.kv_lens = cfg.kv_lens;
  c.last_block_len.clear();
  if (!cfg.csr) c.indices.assign(std::size_t(num_seqs) * std::size_t(c.max_blocks), null_block);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float kv_range = cfg.kv_dtype == dtype::fp8_e4m3 ? 0.05f : 1.0f;  // fp8 values stored scaled
  std::size_t next = 0;
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    for (std::int32_t j = 0; j < blocks_of[std::size_t(s)]; ++j) {
      const block_id b = perm[next++];
      if (cfg.csr) c.indices.push_back(b);
      else c.indices[std::size_t(s) * std::size_t(c.max_blocks) + std::size_t(j)] = b;
    }
    c.indptr.push_back(std::int32_t(c.indices.size()));
    const std::int32_t len = cfg.kv_lens[std::size_t(s)];
    c.last_block_len.push_back(len == 0 ? 0 : len - (blocks_of[std::size_t(s)] - 1) * bs);
  }
  const auto table_block = [&](std::int32_t s, std::int32_t j) {
    return cfg.csr ? c.indices[std::size_t(c.indptr[std::size_t(s)] + j)]
                   : c.indices[std::size_t(s) * std::size_t(c.max_blocks) + std::size_t(j)];
  };
  // Fill the sequences' tokens of every layer (other layers hold different data, so reading the
  // wrong layer shows).
  for (std::int32_t layer = 0; layer < cfg.num_layers; ++layer)
    for (std::int32_t s = 0; s < num_seqs; ++s)
      for (std::int32_t t = 0; t < cfg.kv_lens[std::size_t(s)]; ++t)
        for (std::int32_t kv = 0; kv < 2; ++kv)
          for (std::int32_t h = 0; h < cfg.num_kv_heads; ++h) {
            const std::int64_t off = c.layout.offset(layer, kv, table_block(s, t / bs), t % bs, h);
            for (std::int32_t i = 0; i < cfg.head_dim; ++i)
              store_as(cfg.kv_dtype, c.pool.data(), std::size_t(off + i), kv_range * 8.0f * normal(rng) / 4.0f);
          }
  c.k_scales.clear();
  c.v_scales.clear();
  std::uniform_real_distribution<float> scale_dist(0.5f, 2.0f);
  for (std::int32_t h = 0; h < cfg.num_kv_heads; ++h) {
    c.k_scales.push_back(scale_dist(rng) * (cfg.kv_dtype == dtype::fp8_e4m3 ? 20.0f : 1.0f));
    c.v_scales.push_back(scale_dist(rng) * (cfg.kv_dtype == dtype::fp8_e4m3 ? 20.0f : 1.0f));
  }
  c.q_indptr.assign(1, 0);
  for (std::int32_t s = 0; s < num_seqs; ++s)
    c.q_indptr.push_back(c.q_indptr.back() + std::min(cfg.q_lens.empty() ? cfg.q_len : std::max(1, cfg.q_lens[std::size_t(s)]),
                                                      std::max(1, cfg.kv_lens[std::size_t(s)])));
  c.num_q_tokens = c.q_indptr.back();
  const std::size_t q_elems = c.out_elems();
  c.q.assign(q_elems * size_of(cfg.q_dtype), 0);
  for (std::size_t i = 0; i < q_elems; ++i) store_as(cfg.q_dtype, c.q.data(), i, normal(rng) * cfg.q_magnitude);
  c.o.assign(q_elems * size_of(cfg.q_dtype), 0);
  poison(cfg.q_dtype, c.o.data(), q_elems);
  c.lse.assign(std::size_t(c.num_q_tokens) * std::size_t(c.num_qo_heads()), std::numeric_limits<float>::quiet_NaN());

  attention_params& p = c.params;
  p = attention_params{};
  p.set_kv(c.layout, c.pool.data(), cfg.layer);
  p.q = c.q.data();
  p.o = c.o.data();
  p.lse = cfg.with_lse ? c.lse.data() : nullptr;
  p.q_indptr = cfg.q_len == 1 && cfg.q_lens.empty() ? nullptr : c.q_indptr.data();
  p.table.indices = c.indices.data();
  p.table.indptr = cfg.csr ? c.indptr.data() : nullptr;
  p.table.kv_lens = cfg.csr ? nullptr : c.kv_lens.data();
  p.table.last_block_len = cfg.csr ? c.last_block_len.data() : nullptr;
  p.table.max_blocks_per_seq = c.max_blocks;
  if (cfg.per_head_scale) {
    p.k_scale_per_head = c.k_scales.data();
    p.v_scale_per_head = c.v_scales.data();
  } else {
    p.k_scale = c.k_scales[0];
    p.v_scale = c.v_scales[0];
  }
  p.num_seqs = num_seqs;
  p.num_qo_heads = c.num_qo_heads();
  p.max_kv_len = c.max_blocks * bs;
  p.sm_scale = 1.0f / std::sqrt(float(cfg.head_dim)) / cfg.q_magnitude;
  p.logit_soft_cap = cfg.soft_cap;
  c.alibi_slopes.clear();
  for (std::int32_t h = 0; h < c.num_qo_heads(); ++h)
    c.alibi_slopes.push_back(std::exp2(-8.0f * float(h + 1) / float(c.num_qo_heads())));
  p.alibi_slopes = cfg.alibi ? c.alibi_slopes.data() : nullptr;
  p.window_left = cfg.window_left;
  p.max_splits = cfg.max_splits;
  p.q_dtype = cfg.q_dtype;
}

/// Points the first `blocks` blocks of every sequence of c (a dense table) at sequence 0's, as a
/// prefix cache shares a prompt's blocks. Every sequence must hold at least that many full blocks.
inline void share_prefix(attention_case& c, std::int32_t blocks) {
  for (std::size_t s = 1; s < c.cfg.kv_lens.size(); ++s)
    for (std::int32_t j = 0; j < blocks; ++j)
      c.indices[s * std::size_t(c.max_blocks) + std::size_t(j)] = c.indices[std::size_t(j)];
}

/// One part of a cascade over c's sequences: a dense table (c's pitch) of a range of each
/// sequence's blocks, and the tokens they hold.
struct table_part {
  std::vector<block_id> indices;
  std::vector<std::int32_t> kv_lens;
  std::int32_t max_kv_len = 0;
};

/// Cuts every sequence of c (a dense table) at the block boundaries `cuts` (ascending): part i
/// holds blocks [cuts[i - 1], cuts[i]) (from 0 for the first part, to the end for the last), so
/// attention over the parts' keys, merged, is attention over the whole. A part past a
/// sequence's end is empty (length 0).
inline std::vector<table_part> cascade_parts(const attention_case& c, const std::vector<std::int32_t>& cuts) {
  const std::int32_t bs = c.cfg.block_size;
  std::vector<table_part> parts(cuts.size() + 1);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    table_part& part = parts[i];
    const std::int32_t first = i == 0 ? 0 : cuts[i - 1];
    part.indices.assign(c.indices.size(), null_block);
    for (std::size_t s = 0; s < c.cfg.kv_lens.size(); ++s) {
      const std::int32_t len = c.cfg.kv_lens[s];
      const std::int32_t end = i < cuts.size() ? std::min(len, cuts[i] * bs) : len;
      const std::int32_t tokens = std::max(0, end - first * bs);
      part.kv_lens.push_back(tokens);
      part.max_kv_len = std::max(part.max_kv_len, tokens);
      for (std::int32_t j = 0; j * bs < tokens; ++j)
        part.indices[s * std::size_t(c.max_blocks) + std::size_t(j)] =
            c.indices[s * std::size_t(c.max_blocks) + std::size_t(first + j)];
    }
  }
  return parts;
}

/// Random inputs of merge_states in host memory: `offset` elements, then num_states states of
/// normal values of type t, `pad` elements apart (0: packed), and LSEs in [-30, 30], one in five
/// -inf (an empty state), row 0's all -inf. p holds the sizes and strides; pointers are the
/// caller's to set.
struct random_states {
  merge_states_params p;
  std::vector<unsigned char> o_in;
  std::vector<float> lse_in;

  random_states(dtype t, std::int64_t rows, std::int32_t n, std::int32_t d, std::int64_t pad, std::int64_t offset,
                std::mt19937_64& rng) {
    p.o_dtype = t;
    p.num_rows = rows;
    p.num_states = n;
    p.head_dim = d;
    p.state_stride = pad ? rows * d + pad : 0;
    p.lse_state_stride = pad ? rows + pad : 0;
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> lse_dist(-30.0f, 30.0f);
    o_in.resize(std::size_t(offset + n * p.o_stride()) * size_of(t));
    for (std::size_t i = 0; i < o_in.size() / size_of(t); ++i) store_as(t, o_in.data(), i, normal(rng));
    lse_in.resize(std::size_t(n * p.lse_stride()));
    for (float& x : lse_in) x = rng() % 5 == 0 ? -std::numeric_limits<float>::infinity() : lse_dist(rng);
    for (std::int32_t s = 0; s < n; ++s) lse_in[std::size_t(s * p.lse_stride())] = -std::numeric_limits<float>::infinity();
  }
};

struct dense_result {
  std::vector<double> out;  ///< [num_q_tokens, num_qo_heads, head_dim]
  std::vector<double> lse;  ///< [num_q_tokens, num_qo_heads]
};

/// Attention in double over the sequences' tokens gathered into dense arrays, written without the
/// params accessors so that it checks them too.
inline dense_result naive_attention(const attention_case& c) {
  const case_config& cfg = c.cfg;
  const std::int32_t d = cfg.head_dim, bs = cfg.block_size, hq = c.num_qo_heads();
  dense_result r;
  r.out.assign(c.out_elems(), 0.0);
  r.lse.assign(std::size_t(c.num_q_tokens) * std::size_t(hq), -std::numeric_limits<double>::infinity());
  for (std::size_t s = 0; s < cfg.kv_lens.size(); ++s) {
    const std::int32_t len = cfg.kv_lens[s];
    std::vector<double> k(std::size_t(len) * std::size_t(cfg.num_kv_heads) * std::size_t(d)), v(k.size());
    for (std::int32_t t = 0; t < len; ++t) {
      const block_id b = cfg.csr ? c.indices[std::size_t(c.indptr[s] + t / bs)]
                                 : c.indices[s * std::size_t(c.max_blocks) + std::size_t(t / bs)];
      for (std::int32_t h = 0; h < cfg.num_kv_heads; ++h)
        for (std::int32_t i = 0; i < d; ++i) {
          const std::size_t dense = (std::size_t(t) * std::size_t(cfg.num_kv_heads) + std::size_t(h)) * std::size_t(d) + std::size_t(i);
          const double ks = cfg.per_head_scale ? c.k_scales[std::size_t(h)] : c.k_scales[0];
          const double vs = cfg.per_head_scale ? c.v_scales[std::size_t(h)] : c.v_scales[0];
          k[dense] = ks * load_as(cfg.kv_dtype, c.pool.data(), std::size_t(c.layout.offset(cfg.layer, 0, b, t % bs, h) + i));
          v[dense] = vs * load_as(cfg.kv_dtype, c.pool.data(), std::size_t(c.layout.offset(cfg.layer, 1, b, t % bs, h) + i));
        }
    }
    const std::int32_t q_len = c.q_indptr[s + 1] - c.q_indptr[s];
    for (std::int32_t j = 0; j < q_len; ++j) {
      const std::int32_t token = c.q_indptr[s] + j;
      const std::int32_t pos = len - q_len + j;
      const std::int32_t lo = cfg.window_left >= 0 ? std::max(0, pos - cfg.window_left) : 0;
      for (std::int32_t h = 0; h < hq; ++h) {
        const std::int32_t kvh = h / cfg.group;
        std::vector<double> logits;
        double m = -std::numeric_limits<double>::infinity();
        for (std::int32_t t = lo; t <= pos; ++t) {
          double dot = 0;
          for (std::int32_t i = 0; i < d; ++i)
            dot += double(load_as(cfg.q_dtype, c.q.data(), (std::size_t(token) * std::size_t(hq) + std::size_t(h)) * std::size_t(d) + std::size_t(i))) *
                   k[(std::size_t(t) * std::size_t(cfg.num_kv_heads) + std::size_t(kvh)) * std::size_t(d) + std::size_t(i)];
          double logit = dot / std::sqrt(double(d)) / double(cfg.q_magnitude);
          if (cfg.soft_cap > 0) logit = cfg.soft_cap * std::tanh(logit / cfg.soft_cap);
          if (cfg.alibi) logit += std::exp2(-8.0 * double(h + 1) / double(hq)) * double(t - pos);
          logits.push_back(logit);
          m = std::max(m, logit);
        }
        if (logits.empty()) continue;
        double sum = 0;
        for (double& x : logits) sum += (x = std::exp(x - m));
        for (std::int32_t t = lo; t <= pos; ++t)
          for (std::int32_t i = 0; i < d; ++i)
            r.out[(std::size_t(token) * std::size_t(hq) + std::size_t(h)) * std::size_t(d) + std::size_t(i)] +=
                logits[std::size_t(t - lo)] / sum *
                v[(std::size_t(t) * std::size_t(cfg.num_kv_heads) + std::size_t(kvh)) * std::size_t(d) + std::size_t(i)];
        r.lse[std::size_t(token) * std::size_t(hq) + std::size_t(h)] = m + std::log(sum);
      }
    }
  }
  return r;
}

/// The tolerance on ||out - ref|| / ||ref|| for outputs of dtype t (device METHOD.md: fp32 far
/// under 1e-3; 16-bit between 1e-3 and 1e-2). The inputs are the same quantised values on both
/// sides, so what remains is fp32 accumulation plus the output's rounding.
inline double tolerance(dtype out) {
  switch (out) {
    case dtype::f32: return 2e-5;
    case dtype::f16: return 1e-3;
    default: return 8e-3;
  }
}

struct comparison {
  double rel_error = 0;   ///< ||out - ref|| / ||ref||
  std::size_t non_finite = 0;  ///< outputs left poisoned or NaN
  double max_lse_error = 0;
};

/// Compares o (dtype q) and lse (optional) with the naive result.
inline comparison compare(const attention_case& c, const unsigned char* o, const float* lse, const dense_result& ref) {
  comparison r;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double x = load_as(c.cfg.q_dtype, o, i);
    if (!std::isfinite(x)) { ++r.non_finite; continue; }
    num += (x - ref.out[i]) * (x - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  r.rel_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (lse)
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      if (std::isinf(ref.lse[i]) && std::isinf(lse[i]) && lse[i] < 0) continue;
      if (!std::isfinite(lse[i])) { ++r.non_finite; continue; }
      r.max_lse_error = std::max(r.max_lse_error, std::fabs(double(lse[i]) - ref.lse[i]));
    }
  return r;
}

}  // namespace pagedkv::kernels::testing
