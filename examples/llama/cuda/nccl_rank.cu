// One rank's collectives over NCCL (nccl_rank.hpp): the vocabulary-parallel embedding, the
// all-reduce of row-parallel products, and the logits' gathers.
#include "cuda/nccl_rank.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include <cub/block/block_reduce.cuh>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/error.hpp>

namespace pagedkv::llama::cuda {

namespace {

constexpr int threads = 256;

unsigned blocks_for(std::int64_t n) { return unsigned(std::min<std::int64_t>((n + threads - 1) / threads, 65535 * 4)); }

/// x[t, :] = embedding[tokens[t] - first] for the tokens of [first, first + count), else 0.
__global__ void embed_shard_kernel(float* x, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t dim,
                                   std::int64_t first, std::int64_t count) {
  const std::int64_t t = blockIdx.x, id = std::int64_t(tokens[t]) - first;
  const bool mine = id >= 0 && id < count;
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    x[t * dim + i] = mine ? __bfloat162float(embedding[id * dim + i]) : 0.0f;
}

/// One rank's view of a logits row over its columns: the largest logit, its token id, and the sum
/// of exp(logit - max) (0: nothing seen).
struct partial_choice {
  float max;
  std::int32_t token;
  float sum;
};

struct merge_choices {
  __device__ partial_choice operator()(const partial_choice& a, const partial_choice& b) const {
    if (a.sum == 0.0f) return b;
    if (b.sum == 0.0f) return a;
    const float m = fmaxf(a.max, b.max);
    const std::int32_t token = a.max > b.max ? a.token : b.max > a.max ? b.token : min(a.token, b.token);
    return {m, token, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
  }
};

constexpr int greedy_threads = 1024;

/// Row r of local [rows, pitch]: its first `valid` columns, which are token ids first.. -> out[r].
/// sample_kernel's first reduction (sampling_kernels.cuh) over a column range with the ids offset;
/// that header defines a __global__ kernel, which a second translation unit cannot include.
__global__ void partial_greedy_kernel(const float* local, std::int64_t pitch, std::int64_t valid, std::int32_t first,
                                      partial_choice* out) {
  using reduce = cub::BlockReduce<partial_choice, greedy_threads>;
  __shared__ typename reduce::TempStorage storage;
  const float* row = local + std::int64_t(blockIdx.x) * pitch;
  partial_choice mine{-INFINITY, 0, 0.0f};
  for (std::int64_t i = threadIdx.x; i < valid; i += greedy_threads) {  // ascending: the first maximum stays
    const float x = row[i];
    if (mine.sum == 0.0f || x > mine.max) {
      mine.sum = mine.sum * __expf(mine.max - x) + 1.0f;
      mine.max = x;
      mine.token = first + std::int32_t(i);
    } else {
      mine.sum += __expf(x - mine.max);
    }
  }
  const partial_choice all = reduce(storage).Reduce(mine, merge_choices{});
  if (threadIdx.x == 0) out[blockIdx.x] = all;
}

/// partials [ranks, rows] (every rank's view of each row) -> tokens[r], logprobs[r].
__global__ void merge_greedy_kernel(const partial_choice* partials, std::int32_t ranks, std::int64_t rows,
                                    std::int32_t* tokens, double* logprobs) {
  const std::int64_t r = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  partial_choice all{-INFINITY, 0, 0.0f};
  for (std::int32_t k = 0; k < ranks; ++k) all = merge_choices{}(all, partials[k * rows + r]);
  tokens[r] = all.token;
  logprobs[r] = -log(double(all.sum));
}

/// gathered [ranks, rows, shard] -> out [rows, vocab]: column v is rank v / shard's column v % shard.
__global__ void arrange_logits_kernel(float* out, const float* gathered, std::int64_t rows, std::int64_t shard,
                                      std::int64_t vocab) {
  const std::int64_t n = rows * vocab;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / vocab, v = i % vocab;
    out[i] = gathered[(v / shard) * rows * shard + r * shard + v % shard];
  }
}

}  // namespace

nccl_rank::nccl_rank(ncclComm_t comm, const tensor_parallel_plan& plan, std::int32_t rank)
    : comm_(comm),
      rank_(rank),
      ranks_(plan.ranks),
      vocab_(plan.shards[std::size_t(rank)].vocab),
      vocab_shard_(plan.vocab_shard),
      vocab_size_(plan.vocab_size) {}

nccl_rank::~nccl_rank() {
  for (const timed& t : events_) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.end);
  }
  const std::lock_guard lock(guard_);
  if (!aborted_) nccl().comm_destroy(comm_);
}

void nccl_rank::abort() noexcept {
  std::unique_lock lock(guard_, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::seconds(5));
  if (aborted_) return;
  aborted_ = true;
  nccl().comm_abort(comm_);
}

bool nccl_rank::aborted() const {
  const std::lock_guard lock(guard_);
  return aborted_;
}

template <class F>
void nccl_rank::collective(bool all_reduce, double bytes, cudaStream_t stream, F&& call) {
  const std::lock_guard lock(guard_);  // abort() waits (up to 5 s) for a call being enqueued
  if (aborted_) throw_aborted();
  if (used_ == events_.size()) {
    timed t{};
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&t.start));
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&t.end));
    events_.push_back(t);
  }
  timed& t = events_[used_++];
  t.all_reduce = all_reduce;
  PAGEDKV_CUDA_CHECK(cudaEventRecord(t.start, stream));
  PAGEDKV_NCCL_CHECK(call(), comm_);
  PAGEDKV_CUDA_CHECK(cudaEventRecord(t.end, stream));
  if (all_reduce) {
    ++stats_.all_reduces;
    stats_.all_reduce_bytes += bytes;
    ++stats_.all_reduce_sizes[std::int64_t(bytes)];
  }
}

void nccl_rank::throw_aborted() const {
  throw nccl_error(ncclInvalidUsage, "pagedkv: tensor-parallel rank " + std::to_string(rank_) +
                                         ": its NCCL communicator was aborted");
}

void nccl_rank::begin_step() { used_ = 0; }

void nccl_rank::end_step() {
  for (std::size_t i = 0; i < used_; ++i) {
    float ms = 0.0f;
    PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i].start, events_[i].end));
    (events_[i].all_reduce ? stats_.all_reduce_seconds : stats_.gather_seconds) += 1e-3 * ms;
  }
  used_ = 0;
}

void nccl_rank::embed(float* x, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t n,
                      std::int64_t dim, cudaStream_t stream) {
  embed_shard_kernel<<<unsigned(n), threads, 0, stream>>>(x, embedding, tokens, dim, vocab_.begin, vocab_.size());
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  collective(true, double(n * dim) * sizeof(float), stream, [&] {
    return nccl().all_reduce(x, x, std::size_t(n * dim), ncclFloat32, ncclSum, comm_, stream);
  });
}

void nccl_rank::all_reduce(__nv_bfloat16* data, std::int64_t count, cudaStream_t stream) {
  collective(true, double(count) * sizeof(__nv_bfloat16), stream, [&] {
    return nccl().all_reduce(data, data, std::size_t(count), ncclBfloat16, ncclSum, comm_, stream);
  });
}

void nccl_rank::gather_logits(const float* local, std::int64_t rows, float* out, cudaStream_t stream) {
  float* gathered = static_cast<float*>(reserve(gathered_, std::size_t(ranks_ * rows * vocab_shard_) * sizeof(float)));
  collective(false, 0.0, stream, [&] {
    return nccl().all_gather(local, gathered, std::size_t(rows * vocab_shard_), ncclFloat32, comm_, stream);
  });
  arrange_logits_kernel<<<blocks_for(rows * vocab_size_), threads, 0, stream>>>(out, gathered, rows, vocab_shard_,
                                                                                vocab_size_);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

void nccl_rank::greedy(const float* local, std::int64_t rows, std::int32_t* tokens, double* logprobs,
                       cudaStream_t stream) {
  const std::size_t row_bytes = sizeof(partial_choice) * std::size_t(rows);
  auto* mine = static_cast<partial_choice*>(reserve(partial_, row_bytes));
  auto* all = static_cast<partial_choice*>(reserve(partials_, row_bytes * std::size_t(ranks_)));
  partial_greedy_kernel<<<unsigned(rows), greedy_threads, 0, stream>>>(local, vocab_shard_, vocab_.size(),
                                                                       std::int32_t(vocab_.begin), mine);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  collective(false, 0.0, stream, [&] { return nccl().all_gather(mine, all, row_bytes, ncclUint8, comm_, stream); });
  merge_greedy_kernel<<<blocks_for(rows), threads, 0, stream>>>(all, ranks_, rows, tokens, logprobs);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

double nccl_rank::time_all_reduce(std::int64_t count, int iterations, cudaStream_t stream) {
  auto* data = static_cast<__nv_bfloat16*>(reserve(scratch_, std::size_t(std::max<std::int64_t>(count, 1)) * 2));
  PAGEDKV_CUDA_CHECK(cudaMemsetAsync(data, 0, std::size_t(count) * 2, stream));
  const auto once = [&] {
    const std::lock_guard lock(guard_);
    if (aborted_) throw_aborted();
    PAGEDKV_NCCL_CHECK(nccl().all_reduce(data, data, std::size_t(count), ncclBfloat16, ncclSum, comm_, stream), comm_);
  };
  for (int i = 0; i < 5; ++i) once();
  cudaEvent_t start = nullptr, end = nullptr;
  PAGEDKV_CUDA_CHECK(cudaEventCreate(&start));
  PAGEDKV_CUDA_CHECK(cudaEventCreate(&end));
  PAGEDKV_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iterations; ++i) once();
  PAGEDKV_CUDA_CHECK(cudaEventRecord(end, stream));
  PAGEDKV_CUDA_CHECK(cudaEventSynchronize(end));
  float ms = 0.0f;
  PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return 1e-3 * double(ms) / iterations;
}

void* nccl_rank::reserve(buffer& b, std::size_t bytes) {
  if (bytes > b.capacity) {
    b.bytes.reset();
    b.bytes = kernels::cuda::allocate<kernels::cuda::device_memory>(std::max<std::size_t>(bytes, 16));
    b.capacity = bytes;
  }
  return b.bytes.get();
}

}  // namespace pagedkv::llama::cuda
