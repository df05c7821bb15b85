// The CUDA backend (cuda_backend.hpp). Reads top to bottom: device buffers -> weights -> the
// step's inputs -> block moves -> forward (per layer: RMSNorm, the QKV product, RoPE and the K/V
// write, attention, output product, RMSNorm, gate/up product, SwiGLU, down product) -> logits.
#include "cuda_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <pagedkv/cuda.cuh>
#include <pagedkv/cuda/attention_step.cuh>
#include <pagedkv/cuda/memory.cuh>
#include <pagedkv/error.hpp>

#include "cuda/cuda_sampling.hpp"
#include "cuda/gemm.hpp"
#include "cuda/generic_attention.cuh"
#include "cuda/model_kernels.cuh"
#include "cuda/tensor_parallel_rank.hpp"
#include "model.hpp"
#include "rope.hpp"

namespace pagedkv::llama {

namespace {

using pagedkv::detail::fail;
using kernels::cuda::device_memory;
using kernels::cuda::owned_bytes;
using kernels::cuda::pinned_host_memory;

/// Activation memory the backend keeps out of the KV budget: a 2048-token step of a 13B model
/// takes about 0.5 GiB of buffers, plus cuBLASLt's workspace and the decode's split scratch.
constexpr std::uint64_t activation_reserve_bytes = std::uint64_t(1) << 30;

/// A typed device array that grows on demand (its contents are not kept across growth, but by
/// reserve_keeping). Each growth moves it and counts in *moves, when set (a CUDA graph that
/// captured its address is stale), and in *growths, when set.
template <class T>
class device_array {
 public:
  explicit device_array(std::uint64_t* moves = nullptr, std::int64_t* growths = nullptr)
      : moves_(moves), growths_(growths) {}
  T* get() const { return static_cast<T*>(bytes_.get()); }
  std::size_t capacity() const { return capacity_; }
  T* reserve(std::size_t n) {
    if (n > capacity_) grow(n, nullptr);
    return get();
  }
  /// reserve, growing to at least twice the capacity when it grows: for sizes that creep up.
  T* reserve_doubling(std::size_t n) { return reserve(n > capacity_ ? std::max(n, 2 * capacity_) : n); }
  /// reserve, the elements held copied into the new array on `stream` first.
  T* reserve_keeping(std::size_t n, cudaStream_t stream) {
    if (n > capacity_) grow(n, stream);
    return get();
  }

 private:
  void grow(std::size_t n, cudaStream_t keep_on) {
    owned_bytes<device_memory> bytes = kernels::cuda::allocate<device_memory>(std::max<std::size_t>(n, 1) * sizeof(T));
    if (keep_on && capacity_ > 0)
      PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(bytes.get(), bytes_.get(), capacity_ * sizeof(T), cudaMemcpyDeviceToDevice, keep_on));
    bytes_ = std::move(bytes);  // the old array freed: cudaFree waits for the copy
    capacity_ = n;
    if (moves_) ++*moves_;
    if (growths_) ++*growths_;
  }

  owned_bytes<device_memory> bytes_;
  std::size_t capacity_ = 0;
  std::uint64_t* moves_ = nullptr;
  std::int64_t* growths_ = nullptr;
};

/// Grows pinned host memory `bytes`, of `*capacity` bytes, to `wanted` bytes: the old freed first
/// (no copy may still read it), the capacity 0 until the new allocation succeeds, so that a throw
/// leaves no capacity the pointer lacks. Returns whether it grew.
bool grow_pinned(owned_bytes<pinned_host_memory>& bytes, std::size_t& capacity, std::size_t wanted) {
  if (wanted <= capacity) return false;
  bytes.reset();
  capacity = 0;
  bytes = kernels::cuda::allocate<pinned_host_memory>(wanted);
  capacity = wanted;
  return true;
}

unsigned grid_for(std::int64_t n, int threads) {
  return unsigned(std::min<std::int64_t>((n + threads - 1) / threads, 65535 * 4));
}

/// tokens[i] = drawn[sources[i]] where sources[i] >= 0, for i < n: a step's inputs taken from the
/// greedy choices (one per row) of the step before, on the device.
__global__ void take_greedy_tokens_kernel(token_id* tokens, const std::int32_t* sources, const std::int32_t* drawn,
                                          std::int32_t n) {
  const std::int32_t i = std::int32_t(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n && sources[i] >= 0) tokens[i] = drawn[sources[i]];
}

/// The step's host-side inputs in device order: decode sequences (one token each) first, longest
/// first, then the prefill chunks, so that one decode launch covers rows [0, num_decode). Each KV cache group has
/// its own slots and table rows, group after group (step_plan's order).
struct step_inputs {
  std::vector<token_id> tokens;
  std::vector<std::int32_t> positions;
  std::vector<slot_id> slots;            // [num_groups, tokens]
  std::vector<std::int32_t> seq_of_token;
  std::vector<std::int32_t> q_indptr{0};
  std::vector<std::int32_t> kv_lens;
  std::vector<block_id> tables;          // [num_groups, num_seqs, max_blocks]
  std::vector<std::int32_t> logit_rows;  // device rows of the logits, in plan order
  std::vector<block_id> copy_pairs;      // [num_copies, 2]
  std::vector<std::int32_t> token_sources;  // [tokens]: the previous step's draw that is this token, or -1
  bool takes_drawn_tokens = false;          // some token_sources entry is >= 0
  std::int32_t num_decode = 0;
  std::int32_t max_kv_len = 0;
  std::int32_t max_blocks = 0;
  std::int32_t num_real_rows = 0;  // logit rows of the plan; the rest pad a graph's batch
};

/// The batch sizes that decode graphs are captured at (vLLM's buckets): a decode-only step of n
/// sequences runs the graph of the smallest bucket >= n, its extra rows padding.
constexpr std::int32_t graph_batch_bucket(std::int32_t n) {
  if (n <= 4) return n <= 1 ? 1 : n <= 2 ? 2 : 4;
  return (n + 7) / 8 * 8;
}

/// The largest batch a decode graph takes; larger decode steps run eagerly.
constexpr std::int32_t max_graph_batch = 256;

/// A decode graph's block-table pitch: the plan's, rounded up to a power of two (at least 32), so
/// that a handful of graphs serve every context length; its tokens bound the attention's grid.
constexpr std::int32_t graph_table_pitch(std::int32_t max_blocks) {
  std::int32_t pitch = 32;
  while (pitch < max_blocks) pitch *= 2;
  return pitch;
}

/// One instantiated decode graph (and the captured graph it was made of: under tensor parallelism
/// the rank rebinds exec's timing events by the captured graph's nodes), and the buffer generation
/// its addresses belong to.
struct decode_graph {
  cudaGraph_t captured = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::uint64_t buffers_epoch = 0;
  std::int32_t collectives = -1;  // under tensor parallelism: the timing id of its collectives
  decode_graph() = default;
  decode_graph(const decode_graph&) = delete;
  decode_graph& operator=(const decode_graph&) = delete;
  ~decode_graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (captured) cudaGraphDestroy(captured);
  }
};

class cuda_backend final : public model_backend {
 public:
  cuda_backend(const llama_config& config, const llama_weights* weights, const cuda_backend_options& options);
  ~cuda_backend() override {
    for (cudaEvent_t e : {step_end_[0], step_end_[1], step_start_[0], step_start_[1]})
      if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }
  [[nodiscard]] double busy_seconds() const noexcept { return busy_seconds_; }
  [[nodiscard]] cuda_graph_stats graph_stats() const noexcept { return graph_stats_; }
  [[nodiscard]] cuda_step_stats step_stats() const noexcept {
    cuda_step_stats stats = step_stats_;
    stats.buffer_growths = growths_ - growths_outside_steps_;
    stats.heuristic_seconds = gemm_.heuristic_seconds();
    stats.tuned_batches = std::int64_t(tuned_batches_.size());
    return stats;
  }
  [[nodiscard]] std::vector<cuda::gemm_choice> gemm_choices() const { return gemm_.choices(); }
  void release_graphs();

  [[nodiscard]] std::int64_t vocab_size() const noexcept override {
    return tp_ ? tp_->vocab_size() : config_.vocab_size;
  }
  [[nodiscard]] std::vector<kv_cache_spec> kv_cache_groups() const override { return groups_.specs; }
  [[nodiscard]] kernels::kv_cache_layout kv_layout(std::int32_t num_blocks, std::int32_t block_size) const override {
    const kernels::kv_cache_shape shape{.num_layers = std::int32_t(config_.num_layers),
                                        .num_blocks = num_blocks,
                                        .block_size = block_size,
                                        .num_kv_heads = std::int32_t(config_.num_kv_heads),
                                        .head_dim = std::int32_t(config_.head_dim)};
    return kernels::make_kv_cache_layout(shape, kernels::kv_layout::nhd, options_.kv_dtype);
  }
  void allocate_kv_cache(const kv_cache_options& kv) override;
  void reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs) override;
  std::span<const float> execute(const step_plan& plan) override;
  step_samples execute_sampled(const step_plan& plan, const sampling_batch& sampling) override;
  void launch_sampled(const step_plan& plan, const sampling_batch& sampling,
                      std::span<const std::int32_t> token_sources) override;
  step_samples collect_sampled() override;

 private:
  struct layer {
    owned_bytes<device_memory> attn_norm, wqkv, wo, ffn_norm, w_gate_up, w_down;  // wqkv: [Q; K; V] rows
  };

  void load_weights(const llama_weights* weights);
  void upload_f32(owned_bytes<device_memory>& dst, const std::vector<float>& src);
  void upload_bf16(owned_bytes<device_memory>& dst, std::initializer_list<const std::vector<float>*> parts);
  void random_bf16(owned_bytes<device_memory>& dst, std::int64_t rows, std::int64_t cols);
  void ones_f32(owned_bytes<device_memory>& dst, std::int64_t n);
  void gather(const step_plan& plan, std::span<const std::int32_t> token_sources, std::int32_t graph_batch,
              std::int32_t graph_pitch);
  [[nodiscard]] bool graph_eligible(const step_plan& plan) const;
  void refuse_while_launched(const char* what) const;
  void size_reserved();
  void size_activations(std::size_t tokens, std::size_t rows);
  void prepare_step();
  void upload_inputs();
  void move_blocks(const step_plan& plan);
  void forward();
  void run_step(const step_plan& plan, std::span<const std::int32_t> token_sources = {});
  void capture(decode_graph& graph);
  void tune_products(decode_graph& graph);
  void enqueued();
  void collected(int slot, float ms);
  void finish_step();
  [[nodiscard]] kernels::attention_params attention_params_of(std::int32_t layer_index) const;
  void plan_attention();
  void attention(std::int32_t layer_index);

  const llama_config& config_;
  cuda_backend_options options_;
  attention_groups groups_;  // the KV cache groups: each layer's group, each group's window
  std::uint64_t buffers_epoch_ = 0;  // counts moves of the buffers a graph captures (device_array)
  std::int64_t growths_ = 0;         // every buffer growth so far, device or pinned
  std::int64_t growths_outside_steps_ = 0;  // those of reserve_steps and allocate_kv_cache
  // reserve_steps's largest step (0: none told): every buffer sized for it once, and the attention
  // workspace for any step of it (attention_step's KV splits fitted to it, plan_attention)
  std::int32_t reserved_tokens_ = 0, reserved_seqs_ = 0;
  std::map<std::pair<std::int32_t, std::int32_t>, decode_graph> graphs_;  // by (batch bucket, pitch)
  std::timed_mutex graphs_mutex_;             // graphs_ and graphs_released_: the step's thread, release_graphs
  std::atomic<bool> graphs_released_{false};  // no graph is replayed or captured any more
  cuda_graph_stats graph_stats_{};
  cuda::tensor_parallel_rank* tp_ = nullptr;  // set when this backend is one rank of several
  cudaStream_t stream_ = nullptr;
  // Two steps may be in flight (launch_sampled): each has its slot of events, input staging and
  // sampler, alternating, so that the host fills the next step's while the device reads the last's.
  int slot_ = 0;                     // the slot of the step launched last
  std::vector<int> launched_;        // slots launched and not collected, oldest first
  std::size_t previous_draws_ = 0;   // draws of the step launched last: what token sources may name
  cudaEvent_t step_start_[2] = {}, step_end_[2] = {};
  double busy_seconds_ = 0.0;
  cuda_step_stats step_stats_{};
  std::set<std::int32_t> tuned_batches_;  // decode graph batches whose products were tuned
  std::chrono::steady_clock::time_point step_host_start_{};  // run_step's start, for the host time
  bool step_prefill_[2] = {};          // each slot's step: eager, with prompt tokens
  double step_host_seconds_[2] = {};   // each slot's step: host time to its last launch
  std::int64_t steps_run_ = 0;  // run_step calls: the step index of options_.profile_steps
  bool profiling_ = false;      // between cudaProfilerStart and cudaProfilerStop
  std::int64_t q_dim_ = 0, kv_dim_ = 0;
  bool decode_kernel_ = false;   // the decode kernel compiles this head_dim and KV dtype
  bool prefill_kernel_ = false;  // so does the prefill kernel: attention_step runs every sequence
  std::uint64_t seed_ = 0;

  // weights
  owned_bytes<device_memory> embedding_, output_norm_, lm_head_;
  std::vector<layer> layers_;
  owned_bytes<device_memory> inv_freq_;
  float attention_factor_ = 1.0f;

  // KV pools
  kernels::kv_cache_layout device_layout_{}, host_layout_{};  // the host pool is block_major
  owned_bytes<device_memory> device_pool_;
  owned_bytes<pinned_host_memory> host_pool_;
  std::unique_ptr<kernels::cuda::staged_swap> staged_swap_;  // with a host pool: swaps whole blocks

  // the step
  step_inputs in_;
  owned_bytes<pinned_host_memory> staging_[2];
  std::size_t staging_bytes_[2] = {};
  device_array<unsigned char> inputs_{&buffers_epoch_, &growths_};
  token_id* d_tokens_ = nullptr;
  const std::int32_t* d_token_sources_ = nullptr;
  const std::int32_t* d_positions_ = nullptr;
  const slot_id* d_slots_ = nullptr;
  const std::int32_t* d_seq_of_token_ = nullptr;
  const std::int32_t* d_q_indptr_ = nullptr;
  const std::int32_t* d_kv_lens_ = nullptr;
  const block_id* d_tables_ = nullptr;
  const std::int32_t* d_logit_rows_ = nullptr;
  const block_id* d_copy_pairs_ = nullptr;

  // activations
  device_array<float> x_{&buffers_epoch_, &growths_};
  device_array<__nv_bfloat16> xb_{&buffers_epoch_, &growths_}, q_{&buffers_epoch_, &growths_},
      qkv_{&buffers_epoch_, &growths_}, att_{&buffers_epoch_, &growths_}, delta_{&buffers_epoch_, &growths_},
      gate_up_{&buffers_epoch_, &growths_}, h_{&buffers_epoch_, &growths_}, rows_{&buffers_epoch_, &growths_};
  device_array<float> logits_{&buffers_epoch_, &growths_};
  // [rows, vocab_size()]: every rank's columns, under tensor parallelism
  device_array<float> full_logits_{&buffers_epoch_, &growths_};
  cuda::row_sampler sampler_[2];
  // Tensor parallelism's greedy steps (tp_->greedy: no row is gathered): the chosen tokens and
  // their log-probabilities on the device, and each slot's copy of them on the host, with the
  // row of each draw (a row of num_draws > 1 repeats its choice).
  struct merged_greedy {
    bool used = false;  // the slot's step chose so, not through sampler_
    std::size_t rows = 0;
    owned_bytes<pinned_host_memory> host;  // [rows] int32 tokens, then [rows] double logprobs
    std::size_t host_bytes = 0;
    std::vector<std::int32_t> draw_rows;  // draw -> row
    /// host for up to `rows` rows (pinned: the copies back stay asynchronous); whether it grew.
    bool reserve(std::size_t rows) {
      return grow_pinned(host, host_bytes, rows * (sizeof(std::int32_t) + sizeof(double)) + 8);
    }
  };
  merged_greedy merged_[2];
  device_array<std::int32_t> greedy_tokens_{nullptr, &growths_};
  device_array<double> greedy_logprobs_{nullptr, &growths_};
  std::vector<sampled_token> tp_draws_;
  device_array<unsigned char> attention_workspace_{&buffers_epoch_, &growths_};
  // the step's attention, planned once for every layer (plan_attention)
  kernels::cuda::attention_step_plan attention_plan_{};  // with the prefill kernel
  std::int32_t attention_max_splits_ = 0;                // the plan's cap (attention_params::max_splits)
  std::vector<float> host_logits_;
  cuda::gemm gemm_;
};

cuda_backend::cuda_backend(const llama_config& config, const llama_weights* weights, const cuda_backend_options& options)
    : config_(config), options_(options), groups_(attention_groups_of(config)), tp_(options.tensor_parallel),
      seed_(options.random_seed) {
  gemm_.set_choices(options.gemm_choices);
  if (options.kv_dtype != kernels::dtype::bf16 && options.kv_dtype != kernels::dtype::fp8_e4m3)
    fail(errc::invalid_argument, "the cuda backend stores its KV cache in bf16 or fp8_e4m3, not ",
         kernels::to_string(options.kv_dtype));
  if (config.head_dim > cuda::generic_attention_max_head_dim || config.head_dim % 8 != 0)
    fail(errc::invalid_argument, "the cuda backend needs head_dim a multiple of 8 up to ",
         cuda::generic_attention_max_head_dim, ", not ", config.head_dim);
  if (config.rope_dim % 2 != 0 || config.rope_dim > config.head_dim)
    fail(errc::invalid_argument, "rope_dim ", config.rope_dim, " must be even and at most head_dim ", config.head_dim);
  PAGEDKV_CUDA_CHECK(cudaSetDevice(options.device));
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) {
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&step_start_[i]));
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&step_end_[i]));
  }
  q_dim_ = config.num_heads * config.head_dim;
  kv_dim_ = config.kv_dim();

  // Whether the decode kernel compiles this head_dim and KV dtype: plan_decode checks without
  // touching memory (16-byte aligned stand-in pointers).
  kernels::attention_params probe;
  probe.q = probe.k = probe.v = reinterpret_cast<const void*>(std::uintptr_t(256));
  probe.o = reinterpret_cast<void*>(std::uintptr_t(256));
  static const block_id probe_block = 0;
  static const std::int32_t probe_len = 1;
  probe.table.indices = &probe_block;
  probe.table.kv_lens = &probe_len;
  probe.table.max_blocks_per_seq = 1;
  probe.num_seqs = 1;
  probe.num_qo_heads = std::int32_t(config.num_heads);
  probe.num_kv_heads = std::int32_t(config.num_kv_heads);
  probe.head_dim = std::int32_t(config.head_dim);
  probe.block_stride = probe.token_stride = config.kv_dim();
  probe.head_stride = config.head_dim;
  probe.max_kv_len = 1;
  probe.kv_dtype = options.kv_dtype;
  try {
    (void)kernels::cuda::plan_decode(probe);
    decode_kernel_ = !options.generic_attention;
  } catch (const pagedkv::error&) {
    decode_kernel_ = false;  // the generic attention serves every token
  }
  // The same for the prefill kernel: one sequence of two query tokens.
  static const std::int32_t probe_indptr[] = {0, 2};
  static const std::int32_t probe_two = 2;
  probe.q_indptr = probe_indptr;
  probe.table.kv_lens = &probe_two;
  probe.max_kv_len = 2;
  try {
    (void)kernels::cuda::plan_attention_step(probe, probe_indptr);
    prefill_kernel_ = decode_kernel_ && !options.generic_attention;
  } catch (const pagedkv::error&) {
    prefill_kernel_ = false;
  }
  load_weights(weights);
}

// ---- weights ----------------------------------------------------------------------------------

// Every copy goes on the backend's stream and is waited for there: a cudaMemcpy from pageable
// memory may return before its DMA lands, and the legacy stream it uses does not order with the
// non-blocking stream that reads the weights.
void cuda_backend::upload_f32(owned_bytes<device_memory>& dst, const std::vector<float>& src) {
  dst = kernels::cuda::allocate<device_memory>(src.size() * sizeof(float));
  PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

/// The parts, concatenated by rows, as one bf16 matrix (Q alone; K and V; gate and up).
void cuda_backend::upload_bf16(owned_bytes<device_memory>& dst, std::initializer_list<const std::vector<float>*> parts) {
  std::size_t n = 0;
  for (const auto* p : parts) n += p->size();
  dst = kernels::cuda::allocate<device_memory>(n * sizeof(__nv_bfloat16));
  device_array<float> staging;
  std::size_t at = 0;
  for (const auto* p : parts) {
    float* s = staging.reserve(p->size());
    PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(s, p->data(), p->size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    cuda::to_bf16_kernel<><<<grid_for(std::int64_t(p->size()), 256), 256, 0, stream_>>>(
        static_cast<__nv_bfloat16*>(dst.get()) + at, s, std::int64_t(p->size()));
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staging is reused by the next part
    at += p->size();
  }
}

/// Uniform in +-1/sqrt(cols): products keep their inputs' scale, so activations stay finite.
void cuda_backend::random_bf16(owned_bytes<device_memory>& dst, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  dst = kernels::cuda::allocate<device_memory>(std::size_t(n) * sizeof(__nv_bfloat16));
  cuda::random_bf16_kernel<><<<grid_for(n, 256), 256, 0, stream_>>>(static_cast<__nv_bfloat16*>(dst.get()), n,
                                                                  1.0f / std::sqrt(float(cols)), seed_++);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

void cuda_backend::ones_f32(owned_bytes<device_memory>& dst, std::int64_t n) {
  upload_f32(dst, std::vector<float>(std::size_t(n), 1.0f));
}

void cuda_backend::load_weights(const llama_weights* w) {
  const std::int64_t dim = config_.embedding_dim, ffn = config_.ffn_dim, vocab = config_.vocab_size;
  // What the weights take, checked against free memory first: a model that does not fit is
  // refused naming both, before any allocation fails midway.
  const std::uint64_t per_layer = std::uint64_t(q_dim_ * dim + 2 * kv_dim_ * dim + dim * q_dim_ + 3 * ffn * dim) * 2 +
                                  std::uint64_t(2 * dim) * 4;
  const bool separate_head = w ? !w->output.empty() : !config_.tied_embeddings;
  const std::uint64_t needed = per_layer * std::uint64_t(config_.num_layers) +
                               std::uint64_t(vocab * dim) * 2 * (separate_head ? 2 : 1) + std::uint64_t(dim) * 4;
  std::size_t free_bytes = 0, total_bytes = 0;
  PAGEDKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (needed + activation_reserve_bytes > free_bytes)
    fail(errc::invalid_argument, "the model's bf16 weights need ", needed, " bytes of GPU memory (plus ",
         activation_reserve_bytes, " for activations); ", free_bytes, " of ", total_bytes, " are free");

  layers_.resize(std::size_t(config_.num_layers));
  if (w) {
    upload_bf16(embedding_, {&w->token_embedding});
    upload_f32(output_norm_, w->output_norm);
    if (separate_head) upload_bf16(lm_head_, {&w->output});
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const llama_layer_weights& src = w->layers[l];
      layer& dst = layers_[l];
      upload_f32(dst.attn_norm, src.attn_norm);
      upload_bf16(dst.wqkv, {&src.wq, &src.wk, &src.wv});
      upload_bf16(dst.wo, {&src.wo});
      upload_f32(dst.ffn_norm, src.ffn_norm);
      upload_bf16(dst.w_gate_up, {&src.w_gate, &src.w_up});
      upload_bf16(dst.w_down, {&src.w_down});
    }
  } else {
    random_bf16(embedding_, vocab, dim);
    ones_f32(output_norm_, dim);
    if (separate_head) random_bf16(lm_head_, vocab, dim);
    for (layer& dst : layers_) {
      ones_f32(dst.attn_norm, dim);
      random_bf16(dst.wqkv, q_dim_ + 2 * kv_dim_, dim);
      random_bf16(dst.wo, dim, q_dim_);
      ones_f32(dst.ffn_norm, dim);
      random_bf16(dst.w_gate_up, 2 * ffn, dim);
      random_bf16(dst.w_down, dim, ffn);
    }
  }
  const rope_table rope = make_rope_table(config_);
  upload_f32(inv_freq_, rope.inv_freq);
  attention_factor_ = rope.attention_factor;
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- KV pools ---------------------------------------------------------------------------------

void cuda_backend::allocate_kv_cache(const kv_cache_options& kv) {
  refuse_while_launched("allocate_kv_cache");
  staged_swap_.reset();
  device_pool_.reset();
  host_pool_.reset();
  device_layout_ = kv_layout(kv.num_device_blocks, kv.block_size);
  const std::size_t device_bytes = std::size_t(device_layout_.size()) * kernels::size_of(device_layout_.kv_dtype);
  std::size_t free_bytes = 0, total_bytes = 0;
  PAGEDKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (device_bytes > free_bytes)
    fail(errc::invalid_argument, "a KV cache of ", kv.num_device_blocks, " blocks of ", kv.block_size, " tokens needs ",
         device_bytes, " bytes of GPU memory; ", free_bytes, " are free");
  device_pool_ = kernels::cuda::allocate<device_memory>(device_bytes);
  // On the backend's stream, waited for: a cudaMemset on the legacy stream does not order with a
  // non-blocking stream, and once zeroed the first step's K/V writes after it.
  PAGEDKV_CUDA_CHECK(cudaMemsetAsync(device_pool_.get(), 0, device_bytes, stream_));
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (kv.num_host_blocks > 0) {
    // Block-major, so that a swapped block is one copy over PCIe: the staged swap gathers the
    // device pool's layer-major pieces of each block on the GPU (docs/design.md, "Staged swaps").
    kernels::kv_cache_shape host_shape = device_layout_.shape;
    host_shape.num_blocks = kv.num_host_blocks;
    host_layout_ = kernels::make_kv_cache_layout(host_shape, device_layout_.layout, device_layout_.kv_dtype,
                                                 kernels::layer_order::block_major);
    host_pool_ = kernels::cuda::allocate<pinned_host_memory>(host_layout_.size_bytes());
    const std::size_t block_bytes = host_layout_.bytes_per_block();
    const std::size_t chunk_blocks = std::clamp<std::size_t>(
        kernels::cuda::staged_swap::default_buffer_bytes / block_bytes, 1,
        std::min<std::size_t>(std::size_t(kv.num_host_blocks), std::size_t(kernels::max_stage_blocks)));
    staged_swap_ = std::make_unique<kernels::cuda::staged_swap>(chunk_blocks * block_bytes);
  }
  size_reserved();  // the tables' width and the contexts follow the pool
}

// ---- the step ---------------------------------------------------------------------------------

/// The plan's inputs in device order (decodes first, longest first) and its copy-on-write pairs. For a decode
/// graph (graph_batch > 0), padded to graph_batch sequences of one token and tables of graph_pitch
/// blocks: a padding sequence reads one token of block 0 and writes nothing (slot -1), and its
/// logits row is computed and left unread.
void cuda_backend::gather(const step_plan& plan, std::span<const std::int32_t> token_sources, std::int32_t graph_batch,
                          std::int32_t graph_pitch) {
  step_inputs& in = in_;
  const std::int32_t n = std::int32_t(plan.batch.size());
  in.tokens.clear();
  in.positions.clear();
  in.slots.clear();
  in.seq_of_token.clear();
  in.q_indptr.assign(1, 0);
  in.kv_lens.clear();
  in.tables.clear();
  in.logit_rows.clear();
  in.copy_pairs.clear();
  in.token_sources.clear();
  in.takes_drawn_tokens = false;
  in.max_blocks = graph_batch > 0 ? graph_pitch : plan.max_blocks_per_seq;
  in.max_kv_len = 0;
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // A decode runs on the decode kernel only where it compiles; else all go to the generic path.
  const auto is_decode = [&](std::int32_t i) { return decode_kernel_ && plan.batch[std::size_t(i)].num_tokens == 1; };
  std::stable_partition(order.begin(), order.end(), is_decode);
  in.num_decode = std::int32_t(std::count_if(order.begin(), order.end(), is_decode));
  // Longest decodes first: the decode kernel runs a CTA per (sequence, KV head) in this order, and
  // a long sequence started in the last wave is a tail the rest of the GPU waits for. On an
  // engine's spread of lengths, GQA 32/8 ran at 85.6% of the read ceiling in the plan's order and
  // 88.4% longest first (200 sequences of ~250 tokens), 81.5% and 90.5% (128 of ~360)
  // (docs/journal/decode-kernel.md, "Short contexts at large batch").
  std::stable_sort(order.begin(), order.begin() + in.num_decode, [&](std::int32_t a, std::int32_t b) {
    return plan.kv_lens[std::size_t(a)] > plan.kv_lens[std::size_t(b)];
  });
  std::vector<std::int32_t> last_row(static_cast<std::size_t>(n));
  for (std::int32_t d = 0; d < n; ++d) {
    const std::int32_t i = order[std::size_t(d)];
    const scheduled_sequence& q = plan.batch[std::size_t(i)];
    for (std::int32_t t = 0; t < q.num_tokens; ++t) {
      in.tokens.push_back(plan.input_tokens[q.slot_offset + std::size_t(t)]);
      in.token_sources.push_back(token_sources.empty() ? -1 : token_sources[q.slot_offset + std::size_t(t)]);
      in.takes_drawn_tokens = in.takes_drawn_tokens || in.token_sources.back() >= 0;
      in.positions.push_back(q.first_position + t);
      in.seq_of_token.push_back(d);
    }
    in.q_indptr.push_back(std::int32_t(in.tokens.size()));
    last_row[std::size_t(i)] = std::int32_t(in.tokens.size()) - 1;
    in.kv_lens.push_back(plan.kv_lens[std::size_t(i)]);
    in.max_kv_len = std::max(in.max_kv_len, plan.kv_lens[std::size_t(i)]);
  }
  for (std::int32_t i = 0; i < n; ++i)
    if (plan.batch[std::size_t(i)].produces_logits) in.logit_rows.push_back(last_row[std::size_t(i)]);
  in.num_real_rows = std::int32_t(in.logit_rows.size());
  if (graph_batch > 0) {
    for (std::int32_t d = n; d < graph_batch; ++d) {
      in.tokens.push_back(0);
      in.token_sources.push_back(-1);
      in.positions.push_back(0);
      in.seq_of_token.push_back(d);
      in.q_indptr.push_back(d + 1);
      in.kv_lens.push_back(1);
      in.logit_rows.push_back(d);
    }
    in.num_decode = graph_batch;
    in.max_kv_len = graph_pitch * device_layout_.shape.block_size;  // the grid's bound, not the lengths
  }
  // Each group's slots and table rows in device order; a padding sequence writes nothing (slot
  // -1) and reads one token of block 0.
  for (std::int32_t g = 0; g < plan.num_groups; ++g) {
    const auto slots = plan.slot_mapping.begin() + std::ptrdiff_t(std::size_t(g) * plan.input_tokens.size());
    const auto tables = plan.block_tables.begin() + std::ptrdiff_t(g) * std::ptrdiff_t(n) * plan.max_blocks_per_seq;
    for (std::int32_t d = 0; d < n; ++d) {
      const auto i = std::size_t(order[std::size_t(d)]);
      const scheduled_sequence& q = plan.batch[i];
      const auto first = slots + std::ptrdiff_t(q.slot_offset);
      in.slots.insert(in.slots.end(), first, first + q.num_tokens);
      const auto row = tables + std::ptrdiff_t(i) * plan.max_blocks_per_seq;
      in.tables.insert(in.tables.end(), row, row + plan.max_blocks_per_seq);
      in.tables.resize(in.tables.size() + std::size_t(in.max_blocks - plan.max_blocks_per_seq), null_block);
    }
    for (std::int32_t d = n; d < graph_batch; ++d) {
      in.slots.push_back(-1);
      in.tables.push_back(0);
      in.tables.resize(in.tables.size() + std::size_t(graph_pitch - 1), null_block);
    }
  }
  for (const block_copy& c : plan.copies) in.copy_pairs.insert(in.copy_pairs.end(), {c.src, c.dst});
  for (const token_id t : in.tokens)
    if (t < 0 || t >= vocab_size())
      fail(errc::invalid_argument, "cuda_backend: token ", t, " outside the vocabulary of ", vocab_size());
}

namespace {

/// Bytes of a step's input arrays packed as upload_inputs packs them (16-byte aligned each), for
/// `tokens` tokens of `seqs` sequences (as many logit rows at most), tables `max_blocks` wide for
/// each of `groups` KV cache groups and `copies` copy-on-write pairs.
std::size_t input_bytes(std::size_t tokens, std::size_t seqs, std::size_t groups, std::size_t max_blocks,
                        std::size_t copies) {
  const auto bytes = [](std::size_t n, std::size_t size) { return (n * size + 15) / 16 * 16; };
  return bytes(tokens, sizeof(token_id)) + bytes(tokens, sizeof(std::int32_t)) + bytes(groups * tokens, sizeof(slot_id)) +
         bytes(tokens, sizeof(std::int32_t)) + bytes(seqs + 1, sizeof(std::int32_t)) + bytes(seqs, sizeof(std::int32_t)) +
         bytes(groups * seqs * max_blocks, sizeof(block_id)) + bytes(seqs, sizeof(std::int32_t)) +
         bytes(2 * copies, sizeof(block_id)) + bytes(tokens, sizeof(std::int32_t));
}

/// Bytes of one input array packed: 16-byte aligned.
template <class V>
std::size_t packed_size(const V& v) {
  return (v.size() * sizeof(v[0]) + 15) / 16 * 16;
}

/// Bytes of the step's input arrays as upload_inputs packs them.
std::size_t packed_bytes(const step_inputs& in) {
  const auto bytes_of = [](const auto& v) { return packed_size(v); };
  return bytes_of(in.tokens) + bytes_of(in.positions) + bytes_of(in.slots) + bytes_of(in.seq_of_token) +
         bytes_of(in.q_indptr) + bytes_of(in.kv_lens) + bytes_of(in.tables) + bytes_of(in.logit_rows) +
         bytes_of(in.copy_pairs) + bytes_of(in.token_sources);
}

}  // namespace

/// Every buffer a step of `tokens` tokens and `rows` logit rows computes in (forward's).
void cuda_backend::size_activations(std::size_t tokens, std::size_t rows) {
  const auto dim = std::size_t(config_.embedding_dim), ffn = std::size_t(config_.ffn_dim);
  x_.reserve(tokens * dim);
  xb_.reserve(tokens * dim);
  qkv_.reserve(tokens * std::size_t(q_dim_ + 2 * kv_dim_));
  q_.reserve(tokens * std::size_t(q_dim_));
  att_.reserve(tokens * std::size_t(q_dim_));
  delta_.reserve(tokens * dim);
  gate_up_.reserve(tokens * 2 * ffn);
  h_.reserve(tokens * ffn);
  rows_.reserve(std::max<std::size_t>(rows, 1) * dim);
  logits_.reserve(std::max<std::size_t>(rows, 1) * std::size_t(config_.vocab_size));
}

/// Every buffer of the step just gathered (in_, its slot slot_) sized before the step enqueues
/// anything; after reserve_steps, for a step no larger than it said, nothing grows here (nor
/// after: forward's sizes are these, plan_attention fits the workspace reserved). A growth frees
/// memory, and cudaFree waits for the GPU: one inside a step, after a tensor-parallel collective
/// was enqueued, could leave the GPU waiting for a peer whose thread the free stalls.
void cuda_backend::prepare_step() {
  const std::size_t tokens = in_.tokens.size(), rows = in_.logit_rows.size();
  size_activations(tokens, rows);
  const std::size_t total = packed_bytes(in_);
  if (total > staging_bytes_[slot_]) {  // doubling: the tables grow with the contexts
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old staging may still be read
    grow_pinned(staging_[slot_], staging_bytes_[slot_], std::max(total, 2 * staging_bytes_[slot_]));
    ++growths_;
  }
  inputs_.reserve_doubling(total);
  if (!tp_) return;
  full_logits_.reserve(rows * std::size_t(vocab_size()));
  greedy_tokens_.reserve_keeping(std::max<std::size_t>(rows, 1), stream_);  // the step may take the last one's
  greedy_logprobs_.reserve(std::max<std::size_t>(rows, 1));
  if (merged_[slot_].reserve(rows)) ++growths_;
  if (tp_->reserve_rows(std::int64_t(rows))) ++growths_;
}

/// One copy of every input array: packed into pinned staging memory (prepare_step sized it),
/// 16-byte aligned each.
void cuda_backend::upload_inputs() {
  const std::size_t total = packed_bytes(in_);
  unsigned char* device = inputs_.get();
  auto* host = static_cast<unsigned char*>(staging_[slot_].get());
  std::size_t at = 0;
  const auto put = [&](const auto& v, auto*& device_ptr) {
    std::memcpy(host + at, v.data(), v.size() * sizeof(v[0]));
    device_ptr = reinterpret_cast<std::remove_reference_t<decltype(device_ptr)>>(device + at);
    at += packed_size(v);
  };
  put(in_.tokens, d_tokens_);
  put(in_.positions, d_positions_);
  put(in_.slots, d_slots_);
  put(in_.seq_of_token, d_seq_of_token_);
  put(in_.q_indptr, d_q_indptr_);
  put(in_.kv_lens, d_kv_lens_);
  put(in_.tables, d_tables_);
  put(in_.logit_rows, d_logit_rows_);
  put(in_.copy_pairs, d_copy_pairs_);
  put(in_.token_sources, d_token_sources_);
  PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(device, host, total, cudaMemcpyHostToDevice, stream_));
}

/// The plan's block moves, in its order: swap out, swap in, copy-on-write.
void cuda_backend::move_blocks(const step_plan& plan) {
  const auto pairs = [](const std::vector<block_copy>& copies) {
    std::vector<std::pair<block_id, block_id>> out;
    for (const block_copy& c : copies) out.emplace_back(c.src, c.dst);
    return out;
  };
  if ((!plan.swap_out.empty() || !plan.swap_in.empty()) && !host_pool_)
    fail(errc::invalid_argument, "cuda_backend: the plan swaps, but the KV cache has no host pool");
  if (!plan.swap_out.empty())
    staged_swap_->to_host(device_layout_, device_pool_.get(), host_layout_, host_pool_.get(), pairs(plan.swap_out),
                          stream_);
  if (!plan.swap_in.empty())
    staged_swap_->to_device(host_layout_, host_pool_.get(), device_layout_, device_pool_.get(), pairs(plan.swap_in),
                            stream_);
  kernels::cuda::copy_blocks({.pairs = d_copy_pairs_, .pool = device_pool_.get(), .layout = device_layout_,
                              .num_pairs = std::int32_t(plan.copies.size())},
                             stream_);
}

/// Everything of a step up to its logits on the device.
void cuda_backend::run_step(const step_plan& plan, std::span<const std::int32_t> token_sources) {
  if (!device_pool_) fail(errc::invalid_argument, "cuda_backend::execute before allocate_kv_cache");
  if (plan.num_groups != std::int32_t(groups_.specs.size()))
    fail(errc::invalid_argument, "cuda_backend: the plan has ", plan.num_groups, " KV cache groups, the model ",
         groups_.specs.size());
  const auto groups = std::size_t(plan.num_groups);
  if (plan.max_blocks_per_seq * device_layout_.shape.block_size < 0 ||
      plan.kv_lens.size() != plan.batch.size() ||
      plan.block_tables.size() != groups * plan.batch.size() * std::size_t(plan.max_blocks_per_seq) ||
      plan.slot_mapping.size() != groups * plan.input_tokens.size())
    fail(errc::invalid_argument, "cuda_backend: the plan's kv_lens, block_tables and slot_mapping do not match its ",
         plan.batch.size(), " sequences, ", plan.input_tokens.size(), " tokens and ", plan.num_groups,
         " KV cache groups");
  // The profiler's range holds the launches of the listed steps (a step's sampling included: it
  // is enqueued before the next step's run_step).
  if (!options_.profile_steps.empty()) {
    const bool profiled = std::binary_search(options_.profile_steps.begin(), options_.profile_steps.end(), steps_run_);
    if (profiled != profiling_) PAGEDKV_CUDA_CHECK(profiled ? cudaProfilerStart() : cudaProfilerStop());
    profiling_ = profiled;
  }
  ++steps_run_;
  step_host_start_ = std::chrono::steady_clock::now();
  const bool graphed = graph_eligible(plan);
  const std::int32_t batch = graphed ? graph_batch_bucket(std::int32_t(plan.batch.size())) : 0;
  const std::int32_t pitch = graphed ? graph_table_pitch(plan.max_blocks_per_seq) : 0;
  gather(plan, token_sources, batch, pitch);
  if (in_.takes_drawn_tokens && merged_[slot_].used)  // the previous step's draws are its rows' choices
    for (std::int32_t& source : in_.token_sources)
      if (source >= 0) source = merged_[slot_].draw_rows[std::size_t(source)];
  slot_ = 1 - slot_;
  step_prefill_[slot_] = !graphed && in_.tokens.size() > in_.kv_lens.size();
  try {
    prepare_step();
  } catch (...) {  // memory short, the step not begun: the step launched last stays the previous one
    slot_ = 1 - slot_;
    throw;
  }
  PAGEDKV_CUDA_CHECK(cudaEventRecord(step_start_[slot_], stream_));
  upload_inputs();
  // Tokens drawn by the step launched before, which the plan holds stand-ins for, are taken where
  // they were drawn: that step's sampler is the other slot's.
  if (in_.takes_drawn_tokens) {
    const std::int32_t n = std::int32_t(in_.tokens.size());
    if (merged_[1 - slot_].used) take_greedy_tokens_kernel<<<grid_for(n, 256), 256, 0, stream_>>>(
        d_tokens_, d_token_sources_, greedy_tokens_.get(), n);
    else sampler_[1 - slot_].take_drawn_tokens(d_tokens_, d_token_sources_, n, stream_);
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
  }
  move_blocks(plan);
  if (!graphed) {
    plan_attention();
    forward();
    return;
  }
  // A decode step replays its bucket's graph while no buffer it captured has moved; otherwise it
  // runs eagerly (sizing every buffer and choosing every product's algorithm) and is captured.
  // The graphs are touched under graphs_mutex_ (release_graphs may come from another thread).
  std::unique_lock lock(graphs_mutex_);
  if (!graphs_released_) {
    const decode_graph& graph = graphs_[{batch, pitch}];
    if (graph.exec && graph.buffers_epoch == buffers_epoch_) {
      if (tp_) tp_->launch(graph.exec, graph.collectives, stream_);
      else PAGEDKV_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream_));
      ++graph_stats_.replays;
      return;
    }
  }
  lock.unlock();
  plan_attention();
  forward();
  lock.lock();
  if (graphs_released_) return;
  decode_graph& graph = graphs_[{batch, pitch}];
  const auto capture_start = std::chrono::steady_clock::now();
  capture(graph);
  ++graph_stats_.captures;
  graph_stats_.capture_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - capture_start).count();
  if (options_.tune_gemm_candidates > 1 && !tp_ && batch >= options_.tune_gemm_min_batch &&
      tuned_batches_.insert(batch).second)
    tune_products(graph);
}

/// The step's forward captured into `graph` (replacing what it held) and instantiated.
void cuda_backend::capture(decode_graph& graph) {
  const std::uint64_t epoch = buffers_epoch_;
  cudaGraph_t captured = nullptr;
  // Under tensor parallelism every rank captures its own graph on its own thread, the NCCL
  // collectives inside it; the ranks take the same steps, so their graphs replay together.
  if (tp_) tp_->begin_capture();
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    forward();
  } catch (...) {
    (void)cudaStreamEndCapture(stream_, &captured);
    if (captured) cudaGraphDestroy(captured);
    if (tp_) graph.collectives = tp_->end_capture();
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(stream_, &captured);
  if (tp_) graph.collectives = tp_->end_capture();
  PAGEDKV_CUDA_CHECK(ended);
  if (buffers_epoch_ != epoch) fail(errc::invalid_argument, "cuda_backend: a buffer moved while a decode graph was captured");
  if (graph.exec) cudaGraphExecDestroy(graph.exec);
  if (graph.captured) cudaGraphDestroy(graph.captured);
  graph.exec = nullptr;
  graph.captured = captured;
  PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&graph.exec, captured, 0));
  if (tp_) tp_->instantiated(graph.collectives, graph.captured);
  graph.buffers_epoch = epoch;
}

/// Whole-step tuning of the products of the step just captured (cuda_backend_options): each
/// product in turn tries the heuristic's first candidates, the graph recaptured and replayed for
/// each; what is kept was faster in the whole step. The step's sampling comes after, on the
/// logits of the last replay, which are the same rows of the same inputs.
void cuda_backend::tune_products(decode_graph& graph) {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t n = std::int64_t(in_.tokens.size()), rows = std::int64_t(in_.logit_rows.size());
  const std::int64_t dim = config_.embedding_dim, ffn = config_.ffn_dim;
  const cuda::gemm_choice products[] = {{n, dim, q_dim_ + 2 * kv_dim_, false},
                                        {n, q_dim_, dim, false},
                                        {n, dim, 2 * ffn, false},
                                        {n, ffn, dim, false},
                                        {rows, dim, config_.vocab_size, true}};
  const kernels::cuda::owned_event begin = kernels::cuda::make_event(), end = kernels::cuda::make_event();
  const auto median_ms = [&] {  // of 5 replays, after one
    PAGEDKV_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream_));
    std::vector<float> ms(5);
    for (float& m : ms) {
      PAGEDKV_CUDA_CHECK(cudaEventRecord(begin.get(), stream_));
      PAGEDKV_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream_));
      PAGEDKV_CUDA_CHECK(cudaEventRecord(end.get(), stream_));
      PAGEDKV_CUDA_CHECK(cudaEventSynchronize(end.get()));
      PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&m, begin.get(), end.get()));
    }
    std::nth_element(ms.begin(), ms.begin() + 2, ms.end());
    return ms[2];
  };
  float best = median_ms();
  for (const cuda::gemm_choice& p : products) {
    const int count = gemm_.num_candidates(p.n, p.in, p.out, p.f32_out, options_.tune_gemm_candidates);
    int keep = gemm_.chosen(p.n, p.in, p.out, p.f32_out);
    for (int c = 0; c < count; ++c) {
      if (c == keep) continue;
      gemm_.choose(p.n, p.in, p.out, p.f32_out, c);
      capture(graph);
      if (const float ms = median_ms(); ms < best * 0.997f) {
        best = ms;
        keep = c;
      }
    }
    gemm_.choose(p.n, p.in, p.out, p.f32_out, keep);
  }
  capture(graph);
  step_stats_.tuning_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Every step buffer sized for the largest step at once (decode graphs pad to their bucket);
/// with the KV cache allocated, also those that follow the contexts (size_reserved).
void cuda_backend::reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs) {
  check_reserve_steps(max_tokens, max_seqs);
  refuse_while_launched("reserve_steps");
  const std::int32_t tokens_before = reserved_tokens_, seqs_before = reserved_seqs_;
  reserved_tokens_ = max_tokens;
  reserved_seqs_ = max_seqs;
  try {
    size_reserved();
  } catch (...) {  // memory short: the sizes told before stay (plan_attention caps splits by them)
    reserved_tokens_ = tokens_before;
    reserved_seqs_ = seqs_before;
    throw;
  }
}

/// Buffers a launched step still reads back from (its sampler's draws, its greedy choices' host
/// copy) are replaced by what resizes them: refused until collect_sampled.
void cuda_backend::refuse_while_launched(const char* what) const {
  if (!launched_.empty())
    fail(errc::invalid_argument, "cuda_backend::", what, " with ", launched_.size(), " launched steps not collected");
}

/// reserve_steps's sizes: the activations, logits and samplers for its largest step; once the KV
/// cache is allocated, the inputs (tables as wide as a sequence can grow: the pool, or the
/// model's context where shorter) and the attention workspace for any plan of such a step
/// (decode_workspace_bound, prefill_workspace_bound), at most
/// cuda_backend_options::max_attention_workspace_bytes.
void cuda_backend::size_reserved() {
  if (reserved_tokens_ == 0) return;
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no step in flight reads what is replaced
  const std::int64_t before = growths_;
  const std::int32_t padded = options_.cuda_graphs && decode_kernel_
                                  ? graph_batch_bucket(std::min(reserved_seqs_, max_graph_batch)) : 0;
  const auto tokens = std::size_t(std::max(reserved_tokens_, padded));
  const auto seqs = std::size_t(std::max(std::min(reserved_seqs_, reserved_tokens_), padded));
  size_activations(tokens, seqs);
  // One draw a row, or as many as the sequences (n > 1 draws several from one row).
  for (cuda::row_sampler& sampler : sampler_)
    if (sampler.reserve(seqs, seqs + std::size_t(reserved_seqs_), 0)) ++growths_;
  if (tp_) {
    full_logits_.reserve(seqs * std::size_t(vocab_size()));
    greedy_tokens_.reserve(seqs);
    greedy_logprobs_.reserve(seqs);
    for (merged_greedy& merged : merged_)
      if (merged.reserve(seqs)) ++growths_;
    if (tp_->reserve_rows(std::int64_t(seqs))) ++growths_;
  }
  if (device_pool_) {
    const std::int32_t block_size = device_layout_.shape.block_size;
    std::int64_t blocks = device_layout_.shape.num_blocks;
    if (config_.context_length > 0) blocks = std::min<std::int64_t>(blocks, (config_.context_length + block_size - 1) / block_size);
    const auto width = std::int32_t(std::max<std::int64_t>(blocks, 1));
    const std::int32_t pitch = padded > 0 ? std::max(width, graph_table_pitch(width)) : width;
    // Copy-on-write pairs: at most one a sequence in each group (its shared last block).
    const std::size_t groups = groups_.specs.size();
    const std::size_t bytes = input_bytes(tokens, seqs, groups, std::size_t(pitch), groups * seqs);
    for (int slot = 0; slot < 2; ++slot)
      if (grow_pinned(staging_[slot], staging_bytes_[slot], bytes)) ++growths_;
    inputs_.reserve(bytes);
    int device = 0, sms = 0;
    PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
    PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const auto heads = std::int32_t(config_.num_heads), kv_heads = std::int32_t(config_.num_kv_heads);
    const auto head_dim = std::int32_t(config_.head_dim);
    const std::size_t decode = kernels::cuda::decode_workspace_bound(std::int32_t(seqs), heads, kv_heads, head_dim, sms);
    const std::size_t prefill = kernels::cuda::prefill_workspace_bound(
        std::int64_t(tokens), heads, head_dim, std::int32_t(std::min<std::int64_t>(blocks * block_size, 1 << 30)),
        sizeof(__nv_bfloat16));
    attention_workspace_.reserve(std::min((decode + 255) / 256 * 256 + prefill, options_.max_attention_workspace_bytes));
  }
  growths_outside_steps_ += growths_ - before;
}

/// Destroys the decode graphs, and captures none after (any thread): ncclCommAbort waits until no
/// graph holds a collective of the communicator, so a rank's graphs must go while its abort runs.
/// They go once the stream is idle (the abort's flags end the collectives of a graph in flight),
/// up to 10 s: destroying a graph in flight left the abort waiting for ever (two H200s,
/// 2026-11-26), where CUDA's deferred free of it never released NCCL's hold.
void cuda_backend::release_graphs() {
  std::unique_lock lock(graphs_mutex_, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::seconds(5))) return;  // a capture that never ends: the abort may wait too
  graphs_released_ = true;
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(options_.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (cudaStreamQuery(stream_) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (void)cudaGetLastError();
  graphs_.clear();
  (void)cudaSetDevice(current);
}

/// Whether the step runs as a decode graph: every sequence decodes one token with the decode
/// kernel and wants its logits, and the batch fits the largest bucket.
bool cuda_backend::graph_eligible(const step_plan& plan) const {
  if (!options_.cuda_graphs || graphs_released_ || !decode_kernel_ || plan.batch.empty() ||
      std::int32_t(plan.batch.size()) > max_graph_batch)
    return false;
  return std::all_of(plan.batch.begin(), plan.batch.end(),
                     [](const scheduled_sequence& q) { return q.num_tokens == 1 && q.produces_logits; });
}

/// Waits for the step's copies back and adds its GPU time to busy_seconds.
void cuda_backend::finish_step() {
  PAGEDKV_CUDA_CHECK(cudaEventRecord(step_end_[slot_], stream_));
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  float ms = 0.0f;
  PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, step_start_[slot_], step_end_[slot_]));
  collected(slot_, ms);
}

/// The step just launched is on the stream: its host time and, for a prefill step, whether the
/// step before was still running.
void cuda_backend::enqueued() {
  step_host_seconds_[slot_] = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_host_start_).count();
  if (step_prefill_[slot_] && !launched_.empty()) {  // launched_: the steps before this one, in flight
    const cudaError_t status = cudaEventQuery(step_end_[launched_.back()]);
    if (status == cudaErrorNotReady) ++step_stats_.prefill_enqueued_ahead;
    else PAGEDKV_CUDA_CHECK(status);
  }
}

/// A slot's step has ended on the device after `ms` of its events.
void cuda_backend::collected(int slot, float ms) {
  busy_seconds_ += 1e-3 * ms;
  if (!step_prefill_[slot]) return;
  ++step_stats_.prefill_steps;
  step_stats_.prefill_gpu_seconds += 1e-3 * ms;
  step_stats_.prefill_host_seconds += step_host_seconds_[slot];
}

std::span<const float> cuda_backend::execute(const step_plan& plan) {
  if (!launched_.empty()) fail(errc::invalid_argument, "cuda_backend::execute with launched steps not collected");
  previous_draws_ = 0;
  run_step(plan);
  merged_[slot_].used = false;
  const auto rows = std::size_t(in_.num_real_rows);
  host_logits_.resize(rows * std::size_t(vocab_size()));
  const float* logits = logits_.get();
  if (tp_ && rows > 0) {
    float* full = full_logits_.reserve(host_logits_.size());
    tp_->gather_logits(logits, std::int64_t(rows), full, stream_);
    logits = full;
  }
  if (rows > 0)
    PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(host_logits_.data(), logits, host_logits_.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
  enqueued();
  finish_step();
  return host_logits_;
}

/// The step, then its sampling on the device (cuda/sampling_kernels.cuh): only the chosen tokens,
/// their log-probabilities and the candidates cross to the host, never the logits.
step_samples cuda_backend::execute_sampled(const step_plan& plan, const sampling_batch& sampling) {
  if (!launched_.empty()) fail(errc::invalid_argument, "cuda_backend::execute_sampled with launched steps not collected");
  launch_sampled(plan, sampling, {});
  return collect_sampled();
}

/// The step and its sampling enqueued, its end recorded; collect_sampled waits for that event
/// alone, so a step launched after it keeps the device busy meanwhile. Under tensor parallelism
/// the same, each rank on its own worker: an all-greedy step chooses across the ranks' column
/// shards (tp_->greedy) and nothing gathers whole rows; other sampling gathers the rows and every
/// rank samples them alike.
void cuda_backend::launch_sampled(const step_plan& plan, const sampling_batch& sampling,
                                  std::span<const std::int32_t> token_sources) {
  if (launched_.size() >= 2) fail(errc::invalid_argument, "launch_sampled: two launched steps are not collected yet");
  check_sampling_batch(sampling, std::size_t(std::count_if(plan.batch.begin(), plan.batch.end(),
                                                           [](const scheduled_sequence& q) { return q.produces_logits; })),
                       vocab_size());  // before the step runs: nothing changes on a refusal
  check_token_sources(plan, token_sources, previous_draws_);
  // The sampler this step will use (the other slot's), sized before the step enqueues anything
  // (prepare_step's reasons); reserve_steps sized it for one draw a row, more draws and
  // candidates (n > 1, beam search, logprobs) may grow it here.
  std::size_t candidates = 0;
  for (const row_sampling& r : sampling.rows) candidates += std::size_t(r.num_candidates);
  if (!(tp_ && is_greedy(sampling)) &&
      sampler_[1 - slot_].reserve(sampling.rows.size(), sampling.uniforms.size(), candidates))
    ++growths_;
  run_step(plan, token_sources);
  const auto rows = std::size_t(in_.num_real_rows);
  merged_greedy& merged = merged_[slot_];
  merged.used = tp_ && is_greedy(sampling);
  if (merged.used) {
    merged.rows = rows;
    merged.draw_rows.clear();
    for (std::size_t r = 0; r < rows; ++r) merged.draw_rows.insert(merged.draw_rows.end(), std::size_t(sampling.rows[r].num_draws), std::int32_t(r));
    std::int32_t* tokens = greedy_tokens_.get();  // prepare_step sized these and merged.host
    double* logprobs = greedy_logprobs_.get();
    auto* host = static_cast<unsigned char*>(merged.host.get());
    if (rows > 0) {
      tp_->greedy(logits_.get(), std::int64_t(rows), tokens, logprobs, stream_);
      PAGEDKV_CUDA_CHECK(cudaGetLastError());
      PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(host, tokens, rows * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
      PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(host + (rows * sizeof(std::int32_t) + 7) / 8 * 8, logprobs, rows * sizeof(double),
                                         cudaMemcpyDeviceToHost, stream_));
    }
  } else {
    const float* logits = logits_.get();
    if (tp_ && rows > 0) {  // other sampling reads whole rows: every rank's columns, gathered
      float* full = full_logits_.reserve(rows * std::size_t(vocab_size()));
      tp_->gather_logits(logits, std::int64_t(rows), full, stream_);
      logits = full;
    }
    sampler_[slot_].launch(logits, vocab_size(), sampling, stream_);
  }
  PAGEDKV_CUDA_CHECK(cudaEventRecord(step_end_[slot_], stream_));
  enqueued();
  launched_.push_back(slot_);
  previous_draws_ = sampling.uniforms.size();
}

step_samples cuda_backend::collect_sampled() {
  if (launched_.empty()) fail(errc::invalid_argument, "collect_sampled: no launched step to collect");
  const int slot = launched_.front();
  launched_.erase(launched_.begin());
  PAGEDKV_CUDA_CHECK(cudaEventSynchronize(step_end_[slot]));
  float ms = 0.0f;
  PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, step_start_[slot], step_end_[slot]));
  collected(slot, ms);
  const merged_greedy& merged = merged_[slot];
  if (!merged.used) return sampler_[slot].collect();
  const auto* host = static_cast<const unsigned char*>(merged.host.get());
  const auto* tokens = reinterpret_cast<const std::int32_t*>(host);
  const auto* logprobs = reinterpret_cast<const double*>(host + (merged.rows * sizeof(std::int32_t) + 7) / 8 * 8);
  tp_draws_.clear();
  for (const std::int32_t r : merged.draw_rows) tp_draws_.push_back(sampled_token{tokens[r], logprobs[r]});
  return {tp_draws_, {}};
}

// ---- forward ----------------------------------------------------------------------------------

/// Layer l's attention params over the step's inputs, as plan_attention planned them: the
/// sequences the planned kernels take (every one with the prefill kernel; else the leading
/// decodes) and the plan's split cap.
kernels::attention_params cuda_backend::attention_params_of(std::int32_t l) const {
  // The layer's KV cache group: its table rows, its window (window_left = W - 1, or -1).
  const auto group = std::size_t(groups_.group_of_layer[std::size_t(l)]);
  kernels::attention_params p;
  p.set_kv(device_layout_, device_pool_.get(), l);
  p.q = q_.get();
  p.o = att_.get();
  p.table.indices = d_tables_ + group * in_.kv_lens.size() * std::size_t(in_.max_blocks);
  p.window_left = groups_.specs[group].kernel_window_left();
  p.table.kv_lens = d_kv_lens_;
  p.table.max_blocks_per_seq = in_.max_blocks;
  p.num_qo_heads = std::int32_t(config_.num_heads);
  p.sm_scale = 1.0f / std::sqrt(float(config_.head_dim));
  p.q_dtype = kernels::dtype::bf16;
  p.max_kv_len = in_.max_kv_len;
  p.max_splits = attention_max_splits_;
  if (prefill_kernel_) {
    p.num_seqs = std::int32_t(in_.kv_lens.size());
    p.q_indptr = d_q_indptr_;
  } else {
    p.num_seqs = in_.num_decode;
  }
  return p;
}

/// The step's attention planned once for every layer (a plan follows the step's shape, not the
/// layer), after its inputs are uploaded and before its forward's first collective, with the
/// workspace the plan needs. After reserve_steps the workspace stays as reserved and a plan that
/// needs more is made again with fewer KV splits (attention_params::max_splits, halved until it
/// fits: one split needs none), counted in attention_split_caps; without it the workspace grows
/// here, before the forward's launches.
void cuda_backend::plan_attention() {
  attention_max_splits_ = 0;
  const auto workspace_of = [&] {
    const kernels::attention_params p = attention_params_of(0);
    if (prefill_kernel_) {
      attention_plan_ = kernels::cuda::plan_attention_step(p, in_.q_indptr);
      return std::pair{attention_plan_.workspace_bytes,
                       std::max(attention_plan_.decode.num_splits, attention_plan_.prefill.num_splits)};
    }
    if (p.num_seqs == 0) return std::pair{std::size_t(0), 1};
    const kernels::cuda::decode_plan plan = kernels::cuda::plan_decode(p);
    return std::pair{plan.workspace_bytes, plan.num_splits};
  };
  auto [bytes, splits] = workspace_of();
  if (bytes <= attention_workspace_.capacity()) return;
  if (reserved_tokens_ == 0) {
    attention_workspace_.reserve_doubling(bytes);
    return;
  }
  ++step_stats_.attention_split_caps;
  while (bytes > attention_workspace_.capacity() && splits > 1) {
    attention_max_splits_ = std::max(1, splits / 2);
    std::tie(bytes, splits) = workspace_of();
  }
}

void cuda_backend::attention(std::int32_t l) {
  const kernels::attention_params p = attention_params_of(l);
  unsigned char* workspace = attention_workspace_.get();
  const std::size_t workspace_bytes = attention_workspace_.capacity();
  if (prefill_kernel_) {  // one call: the decode kernel for the leading decodes, the prefill kernel after
    kernels::cuda::attention_step(p, attention_plan_, workspace, workspace_bytes, stream_);
    return;
  }
  if (in_.num_decode > 0) kernels::cuda::decode(p, workspace, workspace_bytes, stream_);
  const std::int32_t num_tokens = std::int32_t(in_.tokens.size());
  if (num_tokens > in_.num_decode) {
    kernels::attention_params all = p;
    all.num_seqs = std::int32_t(in_.kv_lens.size());
    all.q_indptr = d_q_indptr_;
    const dim3 grid(unsigned(num_tokens - in_.num_decode), unsigned(config_.num_heads));
    const auto launch = [&]<class TKV>() {  // rows [num_decode, num_tokens)
      cuda::generic_attention_kernel<TKV><<<grid, 32 * cuda::generic_attention_warps, 0, stream_>>>(
          all, d_seq_of_token_, q_dim_, q_dim_, in_.num_decode);
    };
    if (device_layout_.kv_dtype == kernels::dtype::fp8_e4m3) launch.template operator()<__nv_fp8_e4m3>();
    else launch.template operator()<__nv_bfloat16>();
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
  }
}

void cuda_backend::forward() {
  const std::int64_t n = std::int64_t(in_.tokens.size()), dim = config_.embedding_dim, ffn = config_.ffn_dim;
  const std::int64_t rows = std::int64_t(in_.logit_rows.size()), vocab = config_.vocab_size;
  const std::int64_t qkv_dim = q_dim_ + 2 * kv_dim_;
  const auto un = [](std::int64_t v) { return std::size_t(v); };
  size_activations(un(n), un(rows));  // prepare_step's sizes: nothing grows here
  float* x = x_.get();
  __nv_bfloat16* xb = xb_.get();
  __nv_bfloat16* qkv = qkv_.get();
  __nv_bfloat16* q = q_.get();
  __nv_bfloat16* att = att_.get();
  __nv_bfloat16* delta = delta_.get();
  __nv_bfloat16* gate_up = gate_up_.get();
  __nv_bfloat16* h = h_.get();
  __nv_bfloat16* head_rows = rows_.get();
  float* logits = logits_.get();
  if (n == 0) return;
  const unsigned tokens = unsigned(n);
  const float eps = config_.rms_norm_eps;

  // The embedding: on one GPU straight into the residual stream; under tensor parallelism summed
  // over the ranks' vocabulary slices in bf16 (half the f32 stream's bytes) and added to a zero
  // stream by the first layer's norm.
  const auto* embedding = static_cast<const __nv_bfloat16*>(embedding_.get());
  if (tp_) {
    PAGEDKV_CUDA_CHECK(cudaMemsetAsync(x, 0, un(n * dim) * sizeof(float), stream_));
    tp_->embed(delta, embedding, d_tokens_, n, dim, stream_);
  } else {
    cuda::embed_kernel<float><<<tokens, cuda::row_threads, 0, stream_>>>(x, embedding, d_tokens_, dim, 0, vocab);
  }
  // Small steps: dependent launches and RoPE fused with the K/V write (cuda_backend_options). Why
  // large ones lose was not measured; a guess is that a dependent's CTAs, resident and waiting,
  // take SM slots from the later waves of a product of many tiles, which small steps' lack. Under
  // tensor parallelism too: a dependent launched after a collective waits for its end like after
  // any other grid (model_kernels.cuh), and the peer reduce's kernel waits before its handshake.
  const bool dependent = n <= options_.dependent_launch_max_tokens;
  cuda::rope_write_kv_params rope{.q_out = q, .qkv = qkv, .positions = d_positions_, .slots = d_slots_,
                                  .inv_freq = static_cast<const float*>(inv_freq_.get()),
                                  .attention_factor = attention_factor_, .row_pitch = qkv_dim,
                                  .num_q_heads = int(config_.num_heads), .num_kv_heads = int(config_.num_kv_heads),
                                  .head_dim = int(config_.head_dim), .rope_dim = int(config_.rope_dim),
                                  .pool = device_pool_.get(), .layout = device_layout_};
  // Large steps: RoPE and the K/V write in one ordinary launch of 16-byte pieces, where the
  // shape allows.
  const bool rope_rows = cuda::rope_write_kv_rows_fits(rope);
  kernels::write_kv_params write{.k_new = qkv + q_dim_, .v_new = qkv + q_dim_ + kv_dim_, .slot_mapping = d_slots_,
                                 .pool = device_pool_.get(), .layout = device_layout_, .src_token_stride = qkv_dim,
                                 .num_tokens = std::int32_t(n), .src_dtype = kernels::dtype::bf16};
  // Under tensor parallelism O's and down's partial products go to the rank's two peer buffers
  // where it has them for this step, and the norm after each sums them over the ranks
  // (cuda/peer_reduce.cuh); else to delta, all-reduced by NCCL before the norm.
  __nv_bfloat16* const o_out = tp_ ? tp_->peer_buffer(0, n, dim) : nullptr;
  __nv_bfloat16* const down_out = o_out ? tp_->peer_buffer(1, n, dim) : nullptr;
  const bool peer = o_out && down_out;
  // The norm that adds block output `which` (0: O's, 1: down's; in delta when not peer) to the stream.
  const auto add_norm = [&](__nv_bfloat16* out, const void* gain, int which, const std::int32_t* rows_of,
                            std::int64_t num_rows) {
    const auto* g = static_cast<const float*>(gain);
    if (peer) tp_->reduce_add_rmsnorm(which, n * dim, out, x, g, rows_of, num_rows, dim, eps, dependent, stream_);
    else cuda::add_rmsnorm(out, x, delta, g, rows_of, num_rows, dim, eps, dependent, stream_);
  };
  for (std::int32_t l = 0; l < std::int32_t(layers_.size()); ++l) {
    const layer& w = layers_[std::size_t(l)];
    // attention block; the previous block's output (delta, or the embedding under tensor
    // parallelism) joins the residual stream here
    if (l > 0 && peer) add_norm(xb, w.attn_norm.get(), 1, nullptr, n);
    else cuda::add_rmsnorm(xb, x, l == 0 && !tp_ ? nullptr : delta, static_cast<const float*>(w.attn_norm.get()),
                           nullptr, n, dim, eps, dependent, stream_);
    gemm_.run(qkv, xb, w.wqkv.get(), n, dim, qkv_dim, false, stream_);
    // RoPE: q's heads rotated out to q (the attention's input); k's rotated and v's heads into
    // the cache at the layer's group's slots, by the same kernel: a programmatic dependent (small
    // steps), or in 16-byte pieces a CTA a token (large ones); else by write_kv after k is
    // rotated in place (shapes whose halves are not 16-byte pieces)
    const slot_id* slots = d_slots_ + std::size_t(groups_.group_of_layer[std::size_t(l)]) * un(n);
    rope.layer = write.layer = l;
    rope.slots = write.slot_mapping = slots;
    if (dependent) {
      cuda::rope(rope, n, true, true, stream_);
    } else if (rope_rows) {
      cuda::rope_write_kv_rows(rope, n, stream_);
    } else {
      cuda::rope(rope, n, false, false, stream_);
      kernels::cuda::write_kv(write, stream_);
    }
    attention(l);
    gemm_.run(peer ? o_out : delta, att, w.wo.get(), n, q_dim_, dim, false, stream_);
    if (tp_ && !peer) tp_->all_reduce(delta, n * dim, stream_);  // row-parallel: the ranks' partial products summed
    // feed-forward block: down(silu(gate x) * up x)
    add_norm(xb, w.ffn_norm.get(), 0, nullptr, n);
    gemm_.run(gate_up, xb, w.w_gate_up.get(), n, dim, 2 * ffn, false, stream_);
    cuda::swiglu(h, gate_up, n, ffn, dependent, stream_);
    gemm_.run(peer ? down_out : delta, h, w.w_down.get(), n, ffn, dim, false, stream_);
    if (tp_ && !peer) tp_->all_reduce(delta, n * dim, stream_);
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
  }
  // the last block's output joins the stream; final norm and LM head for the rows with logits
  if (rows == 0) return;
  add_norm(head_rows, output_norm_.get(), 1, d_logit_rows_, rows);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  gemm_.run(logits, head_rows, (lm_head_ ? lm_head_ : embedding_).get(), rows, dim, vocab, true, stream_);
}

}  // namespace

// ---- public -----------------------------------------------------------------------------------

bool cuda_backend_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why) *why = status != cudaSuccess ? std::string("no usable GPU (") + cudaGetErrorString(status) + ")" : "no GPU";
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

std::unique_ptr<model_backend> make_cuda_backend(const llama_config& config, const llama_weights* weights,
                                                 const cuda_backend_options& options) {
  std::string why;
  if (!cuda_backend_available(&why)) fail(errc::invalid_argument, "--device cuda: ", why);
  return std::make_unique<cuda_backend>(config, weights, options);
}

double cuda_busy_seconds(const model_backend& backend) {
  const auto* cuda = dynamic_cast<const cuda_backend*>(&backend);
  return cuda ? cuda->busy_seconds() : 0.0;
}

cuda_graph_stats cuda_graph_stats_of(const model_backend& backend) {
  const auto* cuda = dynamic_cast<const cuda_backend*>(&backend);
  return cuda ? cuda->graph_stats() : cuda_graph_stats{};
}

cuda_step_stats cuda_step_stats_of(const model_backend& backend) {
  const auto* cuda = dynamic_cast<const cuda_backend*>(&backend);
  return cuda ? cuda->step_stats() : cuda_step_stats{};
}

std::vector<cuda::gemm_choice> cuda_gemm_choices(const model_backend& backend) {
  const auto* cuda = dynamic_cast<const cuda_backend*>(&backend);
  return cuda ? cuda->gemm_choices() : std::vector<cuda::gemm_choice>{};
}

std::string cuda_gemm_target() {
  int device = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  PAGEDKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name) + " sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + " cuBLASLt " +
         std::to_string(cublasLtGetVersion());
}

void cuda_release_graphs(model_backend& backend) {
  if (auto* cuda = dynamic_cast<cuda_backend*>(&backend)) cuda->release_graphs();
}

std::uint64_t cuda_kv_budget_bytes(const model_backend&, double utilization) {
  std::size_t free_bytes = 0, total_bytes = 0;
  PAGEDKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double allowed = utilization * double(total_bytes) - double(total_bytes - free_bytes) -
                         double(activation_reserve_bytes);
  return allowed > 0 ? std::uint64_t(allowed) : 0;
}

}  // namespace pagedkv::llama
