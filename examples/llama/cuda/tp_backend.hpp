// The CUDA backend over several GPUs by tensor parallelism (sharding.hpp's plan): one process, one
// worker thread per GPU, each running a cuda_backend over its shard's weights and KV heads; NCCL
// (opened at run time, nccl_library.hpp) all-reduces after the embedding and gathers the logits;
// after O and down each rank's norm kernel sums the ranks' partial products itself over NVLink peer
// access (cuda/peer_reduce.cuh; NCCL's all-reduce where that cannot run); each rank captures its
// own decode graphs with the collectives inside. One scheduler and one kv_cache_manager serve every
// rank: the engine hands this backend one step_plan, and every rank applies the same block ids,
// slots, copy-on-write pairs and swaps to its own pool slice. This header needs no CUDA compiler:
// builds without CUDA or NCCL's header get a make_tensor_parallel_backend that refuses, naming why.
//
// A rank that fails mid-step (an exception, or no return within step_timeout_s) ends the step for
// all: every communicator is aborted (ncclCommAbort makes the other ranks' pending collectives
// return), the workers are joined, and execute throws tensor_parallel_error naming the rank. The
// backend runs no step after that.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pagedkv/kv_dtype.hpp>

#include "cuda/cuda_backend.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model_backend.hpp"

namespace pagedkv::llama {

struct tensor_parallel_options {
  std::int32_t size = 2;                           ///< ranks, on GPUs 0 .. size - 1
  kernels::dtype kv_dtype = kernels::dtype::bf16;  ///< bf16 or fp8_e4m3
  std::uint64_t random_seed = 1;                   ///< random weights (timing-only models): rank r uses seed + r
  double step_timeout_s = 120.0;                   ///< a step that takes longer aborts the communicators
  /// Each rank replays decode graphs (cuda_backend_options::cuda_graphs) with NCCL's collectives
  /// captured in them, collected one step later like eager steps (asynchronous scheduling's
  /// overlap); off: every step launched eagerly (--enforce-eager).
  bool cuda_graphs = true;
  /// Whether the collectives captured in decode graphs are timed (CUDA events around each,
  /// recorded at each replay; --tensor-parallel-timed-graphs). Off by default: on two H100s the
  /// events made llama2-13b's decode steps 7.7% slower (docs/design.md); tensor_parallel_stats then
  /// counts the eagerly launched steps' collectives only.
  bool time_graph_collectives = false;
  /// The all-reduces after O and down fused with the residual add and RMSNorm after them, each rank
  /// receiving the others' partial products over NVLink peer access (cuda/peer_reduce.cuh), in steps
  /// of up to peer_reduce_tokens tokens (each rank keeps two buffers of that many rows);
  /// larger steps, GPUs that cannot reach each other's memory, or this off
  /// (--tensor-parallel-nccl-all-reduce): NCCL's all-reduce, then the add and norm.
  bool peer_reduce = true;
  std::int64_t peer_reduce_tokens = 2048;  ///< pagedkv-llama: max(--max-batch-tokens, 256), a decode graph's largest batch
  /// Testing the failure path: rank fail_rank, at step fail_at_step (0-based), throws before its
  /// step (fail_by_hanging false) or stops without launching it until the abort (true). -1: never;
  /// else a rank below size.
  std::int32_t fail_rank = -1;
  std::int64_t fail_at_step = -1;
  bool fail_by_hanging = false;
  /// Testing the fallback of hosts without peer access: rank fail_peer_access_rank reports that
  /// it cannot reach the others' memory (the others connect as usual), so that the peer reduce is
  /// off and its buffers are freed on every rank. -1: never; else a rank below size.
  std::int32_t fail_peer_access_rank = -1;
};

/// A rank failed or timed out; the communicators were aborted and the backend runs no more steps.
class tensor_parallel_error : public std::runtime_error {
 public:
  tensor_parallel_error(std::int32_t rank, const std::string& what) : std::runtime_error(what), rank_(rank) {}
  /// The first rank that failed, or -1 for a step that timed out with no rank failing.
  [[nodiscard]] std::int32_t rank() const noexcept { return rank_; }

 private:
  std::int32_t rank_;
};

/// Whether tensor parallelism over `size` GPUs can run here: the build has it, NCCL opens and
/// `size` GPUs are visible. `why` says what is missing.
bool tensor_parallel_available(std::int32_t size, std::string* why = nullptr);

/// The backend over options.size GPUs: `weights` (sharded at load, each rank's slice converted to
/// bf16 and uploaded by its worker) or random weights of config's shape when null. config (and
/// weights) must outlive it. Errors: pagedkv::error (invalid_argument) for a size or config the
/// plan refuses (make_tensor_parallel_plan), a fail_rank or fail_peer_access_rank that is neither
/// -1 nor a rank (checked before NCCL or any GPU), without NCCL, or with fewer GPUs than ranks,
/// naming them; what a rank's cuda_backend throws; nccl_error from NCCL's set-up.
std::unique_ptr<model_backend> make_tensor_parallel_backend(const llama_config& config, const llama_weights* weights,
                                                            const tensor_parallel_options& options);

/// What a tensor-parallel backend's steps spent communicating, from rank 0's view (CUDA events
/// around each collective: the transfer and any wait for the other ranks).
struct tensor_parallel_stats {
  std::int32_t ranks = 1;
  std::int64_t steps = 0;
  std::int64_t all_reduces = 0;          ///< after the embedding, O and down
  double all_reduce_seconds = 0.0;       ///< GPU time inside them
  /// The same all-reduces as the rank that arrived last saw each (the least of the ranks' times):
  /// the collective itself, without a rank's wait for a slower one.
  double all_reduce_alone_seconds = 0.0;
  double all_reduce_bytes = 0.0;         ///< their message bytes (one rank's buffer)
  double gather_seconds = 0.0;           ///< GPU time of the logits' and greedy choices' gathers
  double busy_seconds = 0.0;             ///< rank 0's GPU time of whole steps
  cuda_graph_stats graphs{};             ///< rank 0's decode graphs (every rank's are alike)
  /// Decode graph replays whose collectives were not timed (time_graph_collectives off): the
  /// all-reduce counts and times leave their steps out.
  std::int64_t untimed_replays = 0;
  /// (message bytes, all-reduces of that size), ascending: what nccl_all_reduce_seconds is asked for.
  std::vector<std::pair<std::int64_t, std::int64_t>> all_reduce_sizes;
  /// Whether the peer reduce is on (tensor_parallel_options::peer_reduce): then the all-reduces
  /// after O and down are its kernels, each timed with the add and RMSNorm it does too; else why not.
  bool peer_reduce = false;
  std::string peer_reduce_off;
  std::int64_t eager_peer_reduces = 0;  ///< rank 0's peer reduces launched outside graphs
  std::size_t peer_reduce_bytes = 0;    ///< GPU memory every rank together holds for the peer reduce
  std::int64_t buffer_growths = 0;      ///< rank 0's (cuda_step_stats::buffer_growths; every rank's alike)
};

/// The stats of a tensor-parallel backend; nullopt-like zeros (ranks 1) for any other backend.
tensor_parallel_stats tensor_parallel_stats_of(const model_backend& backend);

/// NCCL's own time for an all-reduce of each count of bf16 elements on the backend's
/// communicators (the mean of 20 after 5 warm-up ones, every rank at once): the ceiling for the
/// communication in tensor_parallel_stats. Empty for another backend.
std::vector<double> nccl_all_reduce_seconds(const model_backend& backend, std::span<const std::int64_t> bf16_counts);

/// Bytes of GPU memory free for the KV cache on the tightest GPU of a tensor-parallel backend
/// (cuda_kv_budget_bytes's rule on each).
std::uint64_t tensor_parallel_kv_budget_bytes(const model_backend& backend, double utilization);

}  // namespace pagedkv::llama
