// The CUDA backend of the engine's model seam (model_backend.hpp): bf16 weights on the GPU, every
// matrix product through cuBLASLt, pagedkv's CUDA kernels for the KV cache (copy_blocks,
// staged_swap) and for attention, and small kernels of its own (cuda/model_kernels.cuh; among
// them RoPE fused with the K/V write, which stores what write_kv would).
// The KV pools are bf16 or fp8 e4m3, NHD; the swap pool is block-major pinned host memory, so that
// a swap copies whole blocks over PCIe (kernels' staged_swap.cuh). This header needs
// no CUDA compiler: builds without CUDA get a make_cuda_backend that refuses with a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pagedkv/kv_dtype.hpp>

#include "cuda/gemm_choice.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model_backend.hpp"

namespace pagedkv::llama {

namespace cuda {
class tensor_parallel_rank;
}

struct cuda_backend_options {
  kernels::dtype kv_dtype = kernels::dtype::bf16;  ///< bf16 or fp8_e4m3
  int device = 0;                                  ///< CUDA device ordinal
  std::uint64_t random_seed = 1;                   ///< for random weights (timing-only models)
  /// Every token on the backend's plain generic attention instead of kernels/pagedkv's decode and
  /// prefill kernels (which it takes where they compile the head_dim): a second path for tests.
  bool generic_attention = false;
  /// Decode-only steps of up to 256 sequences replay a CUDA graph of their forward, captured once
  /// per batch bucket (1, 2, 4, then multiples of 8) and block-table pitch (powers of two from 32), their
  /// batch padded to the bucket; false runs every step eagerly (vLLM's --enforce-eager).
  bool cuda_graphs = true;
  /// Steps of up to this many tokens launch the layers' small kernels (RMSNorm, RoPE, SwiGLU) as
  /// programmatic dependents of the products before them, and RoPE writes K and V to the cache
  /// itself; larger steps launch them after each product's end, RoPE writing K/V in 16-byte pieces
  /// (or write_kv after it, where rope_dim is not a multiple of 16). The
  /// default is where that measured faster on an H100 (runs p1 and p2, docs/journal/engine-gpu.md):
  /// decode steps of 1-191 sequences 0.05-0.45 ms faster, those of 192+ 0.03-0.16 ms slower and
  /// prefill steps of 2027 tokens 3-4 ms slower. -1: no step (a second path for tests). One GPU
  /// only: a tensor-parallel rank runs every step the second way.
  std::int64_t dependent_launch_max_tokens = 191;
  /// Steps (0-based, in the order this backend runs them) whose launches lie between
  /// cudaProfilerStart and cudaProfilerStop, so that `ncu --profile-from-start off` profiles those
  /// steps alone (pagedkv-llama --profile-steps). Sorted; empty: the profiler API is never called.
  std::vector<std::int64_t> profile_steps = {};
  /// Whole-step tuning of the products' algorithms (pagedkv-llama --tune-gemms): when a decode
  /// graph of at least tune_gemm_min_batch sequences is first captured, each of its five products
  /// in turn (QKV, O, gate/up, down, LM head) tries each of cuBLASLt's first tune_gemm_candidates
  /// candidates for its shape, the others fixed, timed as the median of 5 replays of the whole
  /// recaptured graph; a candidate is kept only where it is faster than the one before by 0.3%
  /// or more, so the step's products run as the heuristic chose unless the whole step measured
  /// faster otherwise. The replays rerun the step on its own inputs (same K/V at the same slots).
  /// 0 or 1: no tuning. One GPU only.
  int tune_gemm_candidates = 0;
  std::int32_t tune_gemm_min_batch = 64;
  /// Algorithm choices made before (cuda_gemm_choices of an earlier run on the same GPU): each
  /// product of such a shape runs with that candidate instead of the heuristic's first.
  std::vector<cuda::gemm_choice> gemm_choices = {};
  /// The attention's split-K scratch that reserve_steps sizes once: what any plan of the largest
  /// step may need (kernels' decode_workspace_bound and prefill_workspace_bound, the latter loose:
  /// up to 128 splits of every row), at most this. A step whose plan needs more runs with fewer KV
  /// splits rather than allocate (cuda_step_stats::attention_split_caps). 64 MiB: the decode's
  /// bound is 9-11 MB at 256 sequences of llama2-7b, llama3-8b and llama2-13b on 132 SMs, and a
  /// prefill split fills the SMs' free slots rather than every row (4 splits of 132 CTAs of 128
  /// rows at head_dim 128 would take 18 MB); arithmetic, not measured. Taken from the backend's
  /// 1 GiB activation reserve. 0: no split once reserved (tests).
  std::size_t max_attention_workspace_bytes = std::size_t(64) << 20;
  /// Set by the tensor-parallel backend (tp_backend.hpp): this backend is one rank, its config and
  /// weights a shard's (sharding.hpp), and it meets the other ranks through these calls after the
  /// embedding, O and down (inside its decode graphs too), and for the logits. Null: the whole
  /// model on one GPU.
  cuda::tensor_parallel_rank* tensor_parallel = nullptr;
};

/// What the CUDA backend's decode graphs did: graphs captured (a bucket's first step, and again
/// after a larger step moved its buffers) and steps replayed from one.
struct cuda_graph_stats {
  std::int64_t captures = 0;
  std::int64_t replays = 0;
  double capture_seconds = 0.0;  ///< host time capturing and instantiating them
};

/// What the CUDA backend's eager steps with prompt tokens (prefill steps) cost, and its buffers.
struct cuda_step_stats {
  std::int64_t prefill_steps = 0;
  double prefill_gpu_seconds = 0.0;   ///< device events around each such step's work
  double prefill_host_seconds = 0.0;  ///< host time from the step's start to its last launch
  /// Prefill steps whose last launch came while the step before was still running on the device:
  /// the device had the step queued before it ran out of work (asynchronous scheduling).
  std::int64_t prefill_enqueued_ahead = 0;
  double heuristic_seconds = 0.0;     ///< host time in cuBLASLt's heuristic, every step
  /// Buffers (device or pinned host) that grew in steps, each a free that waits for the GPU, all
  /// before the step enqueues anything (run_step). None after reserve_steps for steps no larger
  /// than it said, but a sampler's for more draws or candidates than one a row (n > 1, beam
  /// search, logprobs).
  std::int64_t buffer_growths = 0;
  /// Steps planned (eager, or captured into a decode graph) whose attention needed more workspace
  /// than reserve_steps reserved, and so ran with fewer KV splits; a graph's replays run as it was
  /// captured and are not counted again.
  std::int64_t attention_split_caps = 0;
  std::int64_t tuned_batches = 0;     ///< decode graph batches whose products were tuned
  double tuning_seconds = 0.0;        ///< host time tuning them
};

/// Whether this build has the CUDA backend and a GPU is visible; `why` says what is missing.
bool cuda_backend_available(std::string* why = nullptr);

/// A CUDA backend over `weights` (converted to bf16 and uploaded), or over random bf16 weights of
/// config's shape made on the GPU when `weights` is null: a timing-only model. config (and weights)
/// must outlive it. Errors: pagedkv::error (invalid_argument) without CUDA or a GPU, for a KV dtype
/// it does not store, or when the weights do not fit the GPU (naming the bytes needed and free);
/// kernels::cuda_error naming the call for other CUDA failures.
std::unique_ptr<model_backend> make_cuda_backend(const llama_config& config, const llama_weights* weights,
                                                 const cuda_backend_options& options = {});

/// Bytes of GPU memory free for the KV cache once the backend's weights are loaded: utilization
/// (vLLM's meaning: the fraction of the GPU's whole memory this process may use) of the total,
/// less what is in use now and the backend's activation reserve. 0 when nothing is left.
std::uint64_t cuda_kv_budget_bytes(const model_backend& backend, double utilization);

/// The GPU's read ceiling, measured now: the median of 9 read-only passes over 512 MiB (bytes/s).
/// Call it before the KV cache takes the memory. Errors: as make_cuda_backend.
double cuda_read_bytes_per_s();

/// GPU time of the backend's steps so far (device events around each step's work); 0 for a
/// backend other than the CUDA one.
double cuda_busy_seconds(const model_backend& backend);

/// The CUDA backend's graph counts so far; zeros for another backend.
cuda_graph_stats cuda_graph_stats_of(const model_backend& backend);

/// The CUDA backend's step figures so far; zeros for another backend.
cuda_step_stats cuda_step_stats_of(const model_backend& backend);

/// The products the CUDA backend runs with a candidate other than cuBLASLt's first (tuned, or
/// given in its options), for cuda_backend_options::gemm_choices of a later run; empty for
/// another backend.
std::vector<cuda::gemm_choice> cuda_gemm_choices(const model_backend& backend);

/// What such choices hold for: the current GPU's name and compute capability and cuBLASLt's
/// version ("NVIDIA H100 80GB HBM3 sm_90 cuBLASLt 130000"): a candidate index names another
/// algorithm elsewhere. Errors: as make_cuda_backend.
std::string cuda_gemm_target();

/// Destroys the CUDA backend's decode graphs and has it capture and replay none after; any
/// thread, also while a step runs: it first waits up to 10 s for the backend's stream to be idle.
/// The tensor-parallel backend calls it while aborting the ranks' communicators (ncclCommAbort
/// waits for every graph holding one of its collectives to be destroyed, and its flags end the
/// collectives of a graph in flight). Nothing for another backend.
void cuda_release_graphs(model_backend& backend);

/// Bytes of bf16 weights one forward reads: every layer's matrices and norms and the LM head (the
/// embedding table only by the rows it gathers, left out).
double bf16_weight_bytes_per_step(const llama_config& config);

/// The random-weight shapes of timing runs: llama2-7b, llama3-8b, llama2-13b, and NAME@tpN for rank
/// 0's shard of one at tensor-parallel size N (sharding.hpp); nullopt for others.
std::optional<llama_config> named_model_shape(std::string_view name);

}  // namespace pagedkv::llama
