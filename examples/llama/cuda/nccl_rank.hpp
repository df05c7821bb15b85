// One rank of the tensor-parallel backend (tp_backend.hpp): the tensor_parallel_rank calls over an
// NCCL communicator, timed with CUDA events around each collective (inside a CUDA graph too: the
// captured collectives' events are external record nodes, recorded at each replay, and bound to one
// of two sets of events in turn, so that two replays of a graph in flight time apart), and an abort
// that any thread may call. Every other call runs on the rank's worker thread (its GPU current).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <pagedkv/cuda/memory.cuh>

#include "cuda/nccl_library.hpp"
#include "cuda/peer_reduce.cuh"
#include "cuda/tensor_parallel_rank.hpp"
#include "sharding.hpp"

namespace pagedkv::llama::cuda {

/// What a rank's peer reduce shares with the others (nccl_rank::open_peer_reduce): its two buffers
/// and its flag array, device pointers every rank reaches once peer access is on.
struct peer_window {
  __nv_bfloat16* data[2] = {};  ///< [ranks, rows, dim] each
  std::uint32_t* flags = nullptr;
  int ctas = 0;  ///< CTAs of its GPU resident at once (the flags' rows)
};

/// GPU time of a rank's collectives so far.
struct collective_stats {
  std::int64_t all_reduces = 0;
  double all_reduce_seconds = 0.0;
  double all_reduce_bytes = 0.0;
  double gather_seconds = 0.0;
  std::map<std::int64_t, std::int64_t> all_reduce_sizes;  ///< message bytes -> all-reduces of that size
  std::vector<float> last_step_ms;  ///< the last ended step's all-reduces, in order (ms each)
  /// Graph replays whose collectives were not timed (nccl_rank's time_graphs off): the counts and
  /// times above leave them out.
  std::int64_t untimed_replays = 0;
  /// Peer reduces launched outside graph captures (each is one of all_reduces when timed).
  std::int64_t eager_peer_reduces = 0;
};

class nccl_rank final : public tensor_parallel_rank {
 public:
  /// Takes the communicator (destroyed, or aborted, with the rank) of `rank` in `plan`. time_graphs:
  /// whether captured collectives get timing events (else only eager ones are timed).
  nccl_rank(ncclComm_t comm, const tensor_parallel_plan& plan, std::int32_t rank, bool time_graphs = true);
  ~nccl_rank() override;
  nccl_rank(const nccl_rank&) = delete;
  nccl_rank& operator=(const nccl_rank&) = delete;

  [[nodiscard]] std::int64_t vocab_size() const noexcept override { return vocab_size_; }
  void embed(__nv_bfloat16* rows, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t n, std::int64_t dim,
             cudaStream_t stream) override;
  void all_reduce(__nv_bfloat16* data, std::int64_t count, cudaStream_t stream) override;
  [[nodiscard]] __nv_bfloat16* peer_buffer(int which, std::int64_t rows, std::int64_t dim) override;
  void reduce_add_rmsnorm(int which, std::int64_t count, __nv_bfloat16* out, float* x, const float* gain,
                          const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim, float eps, bool dependent,
                          cudaStream_t stream) override;
  bool reserve_rows(std::int64_t rows) override;
  void gather_logits(const float* local, std::int64_t rows, float* out, cudaStream_t stream) override;
  void greedy(const float* local, std::int64_t rows, std::int32_t* tokens, double* logprobs,
              cudaStream_t stream) override;
  void begin_capture() override;
  std::int32_t end_capture() override;
  void instantiated(std::int32_t graph, cudaGraph_t captured) override;
  void launch(cudaGraphExec_t exec, std::int32_t graph, cudaStream_t stream) override;

  /// ncclCommAbort: the rank's pending collectives return, its later calls throw. Any thread; waits
  /// up to 5 s for a call being enqueued to finish enqueueing (then aborts under it: a call stuck
  /// inside NCCL is what the abort is for), never for the GPU.
  void abort() noexcept;
  [[nodiscard]] bool aborted() const;

  /// Around each step: begin_step before it is enqueued, end_step once it has finished (its stream
  /// waited for); the events of its collectives, eager and in the graphs it replayed, are then read
  /// into stats(). Steps may overlap (asynchronous scheduling): end_step reads the oldest begun.
  void begin_step();
  void end_step();
  [[nodiscard]] const collective_stats& stats() const noexcept { return stats_; }

  /// The peer reduce's set-up, every rank on its own worker (peer_reduce.cuh): open allocates the
  /// rank's two buffers of ranks x rows x dim bf16 and its flags (zeroed, waited for) and returns them;
  /// connect, given every rank's window, turns on this GPU's access to the others' and keeps their
  /// pointers, or returns false naming why in *why (the rank then all-reduces by NCCL); enable
  /// turns the reduce on once every rank connected (peer_buffer answers null before).
  /// close frees what open allocated and turns the reduce off (peer access, once on, stays on:
  /// NCCL's own P2P transport may use it); peer_reduce_bytes is what the rank holds for it.
  peer_window open_peer_reduce(std::int64_t rows, std::int64_t dim);
  bool connect_peers(std::span<const peer_window> windows, std::string* why);
  void enable_peer_reduce() noexcept { peer_.enabled = true; }
  void close_peer_reduce() noexcept;
  [[nodiscard]] std::size_t peer_reduce_bytes() const noexcept { return peer_.bytes; }

  /// Mean seconds of an all-reduce of count bf16 elements over `iterations` (after 5 warm-up
  /// ones) on stream; every rank must call it at once.
  double time_all_reduce(std::int64_t count, int iterations, cudaStream_t stream);

 private:
  struct timed {
    cudaEvent_t start, end;
    bool all_reduce;
    double bytes;
  };
  struct buffer {
    kernels::cuda::owned_bytes<kernels::cuda::device_memory> bytes;
    std::size_t capacity = 0;
  };
  /// A step's eager collectives (events: the first `used` of them) and the graphs it launched,
  /// each with the set of its events that replay recorded.
  struct step_record {
    std::vector<timed> events;
    std::size_t used = 0;
    std::vector<std::pair<std::int32_t, int>> replays;
  };
  /// A captured graph's collectives: sets[0] recorded at the capture, sets[1] alike; nodes[i], the
  /// record nodes of event i's start and end in the captured graph, which its executable graph
  /// records into sets[bound] now. A graph whose nodes were not all found (bindable false), or
  /// captured with time_graphs off, is not timed.
  struct graph_timing {
    std::vector<timed> sets[2];
    std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>> nodes;
    int bound = 0;
    bool bindable = false;
  };
  template <class F>
  void collective(bool all_reduce, double bytes, cudaStream_t stream, F&& call);
  /// guard_, or a throw once the rank is aborted (never waits behind an abort in progress).
  [[nodiscard]] std::unique_lock<std::timed_mutex> lock_unless_aborted() const;
  step_record& current_step();
  static void* reserve(buffer& b, std::size_t bytes);
  static timed& next_event(std::vector<timed>& events, std::size_t& used);
  void count(const timed& t);
  [[noreturn]] void throw_aborted() const;

  mutable std::timed_mutex guard_;  // one NCCL call or the abort at a time
  std::atomic<bool> aborted_{false};  // atomic: abort() may set it without the lock (see abort)
  ncclComm_t comm_;
  std::int32_t rank_, ranks_;
  bool time_graphs_;
  index_range vocab_;
  std::int64_t vocab_shard_, vocab_size_;
  std::deque<step_record> steps_;           // begun and not ended, oldest first
  std::vector<step_record> spare_;          // ended ones, their events kept for reuse
  std::vector<graph_timing> graphs_;  // each captured graph's collectives, by timing id
  std::int32_t capturing_ = -1;             // the id being captured: its first captured_ events
  std::size_t captured_ = 0;
  collective_stats stats_;
  buffer gathered_, partial_, partials_, scratch_;
  /// The peer reduce (open_peer_reduce): the rank's buffers and flags, the kernels' parameters for
  /// each buffer, and the abort flag its kernels poll (pinned host memory, which the GPU reads).
  struct peer_state {
    kernels::cuda::owned_bytes<kernels::cuda::device_memory> data[2], flags, counters;
    std::int64_t rows = 0, dim = 0;
    std::size_t bytes = 0;  // of data, flags and counters
    int ctas = 0;
    peer_reduce_params params[2];
    bool enabled = false;
  };
  peer_state peer_;
  kernels::cuda::owned_bytes<kernels::cuda::pinned_host_memory> abort_flag_;
};

}  // namespace pagedkv::llama::cuda
