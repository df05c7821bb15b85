// One rank's side of tensor parallelism as the CUDA backend sees it (cuda_backend_options::
// tensor_parallel): the backend runs its shard's model (sharding.hpp) and calls these where the
// ranks meet. All on the backend's stream, asynchronous like the rest of its step.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <pagedkv/types.hpp>

namespace pagedkv::llama::cuda {

class tensor_parallel_rank {
 public:
  virtual ~tensor_parallel_rank() = default;

  /// The whole model's vocabulary: the width of the logits rows the backend returns.
  [[nodiscard]] virtual std::int64_t vocab_size() const noexcept = 0;

  /// rows [n, dim] bf16 = each token's embedding row: the rank's vocabulary slice `embedding`
  /// [vocab_shard, dim] bf16 gives the rows of the tokens it holds, zero for the others, and an
  /// all-reduce sums the ranks' rows (exactly: one term of each sum is not zero).
  virtual void embed(__nv_bfloat16* rows, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t n,
                     std::int64_t dim, cudaStream_t stream) = 0;

  /// data [count] bf16: the rank's partial product of a row-parallel layer (O, down), replaced by
  /// the sum over ranks.
  virtual void all_reduce(__nv_bfloat16* data, std::int64_t count, cudaStream_t stream) = 0;

  /// Where the backend writes a row-parallel product of rows x dim bf16 for reduce_add_rmsnorm:
  /// buffer `which` (0 or 1, used in turn: O's product, then down's) of the rank's two, which the
  /// reduce pushes to every other rank over NVLink (peer_reduce.cuh); null where the rank has none
  /// for this step (no peer access, more rows than the buffers hold, a dim the kernel does not
  /// take, or turned off): then all_reduce, and add_rmsnorm after it. Every rank answers alike for
  /// the same step.
  [[nodiscard]] virtual __nv_bfloat16* peer_buffer(int which, std::int64_t rows, std::int64_t dim) = 0;

  /// The all-reduce of buffer `which` (its first `count` elements, rows x dim) fused with the add
  /// and RMSNorm after it: for each row r of num_rows, s = rows[r] (or r when rows is null),
  /// x[s] += the sum over ranks of row s, out[r] = x[s] / rms * gain (add_rmsnorm's work), a
  /// programmatic dependent of the grid before where `dependent`. Every rank calls it alike.
  virtual void reduce_add_rmsnorm(int which, std::int64_t count, __nv_bfloat16* out, float* x, const float* gain,
                                  const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim, float eps,
                                  bool dependent, cudaStream_t stream) = 0;

  /// Sizes what gather_logits and greedy use for up to `rows` rows now, so that neither allocates
  /// (a growth frees device memory, which waits for the GPU) once the step's collectives are
  /// enqueued. Returns whether a buffer grew.
  virtual bool reserve_rows(std::int64_t rows) = 0;

  /// local [rows, vocab_shard] f32 (the rank's logit columns) -> out [rows, vocab_size()] f32.
  virtual void gather_logits(const float* local, std::int64_t rows, float* out, cudaStream_t stream) = 0;

  /// The greedy choice of each row over every rank's columns: tokens[r], the largest logit (the
  /// lowest id among equal ones), and logprobs[r], its log-probability at temperature 1.
  virtual void greedy(const float* local, std::int64_t rows, std::int32_t* tokens, double* logprobs,
                      cudaStream_t stream) = 0;

  /// A CUDA graph's capture of the backend's stream: the collectives enqueued between begin_capture
  /// and end_capture are captured into the graph (each rank captures its own, on its own thread),
  /// their timing with them; end_capture returns the new graph's timing id. instantiated hands the
  /// rank the captured graph once its executable graph is made (the graph outlives that): a rank
  /// may rebind the executable graph's timing events per replay, so that two replays in flight
  /// time apart.
  virtual void begin_capture() = 0;
  virtual std::int32_t end_capture() = 0;
  virtual void instantiated(std::int32_t graph, cudaGraph_t captured) = 0;
  /// Launches a graph captured with collectives (`graph`: its timing id) on stream, as a collective
  /// call is enqueued: never after, or during, an abort (its collectives would use a freed
  /// communicator); they count in the step's statistics.
  virtual void launch(cudaGraphExec_t exec, std::int32_t graph, cudaStream_t stream) = 0;
};

}  // namespace pagedkv::llama::cuda
