// One rank's collectives over NCCL (nccl_rank.hpp): the vocabulary-parallel embedding, the
// all-reduce of row-parallel products, and the logits' gathers; and the peer reduce's set-up and
// launches (cuda/peer_reduce.cuh), which need no NCCL call.
#include "cuda/nccl_rank.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include <cub/block/block_reduce.cuh>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/error.hpp>

#include "cuda/model_kernels.cuh"
#include "cuda/sampling_kernels.cuh"

namespace pagedkv::llama::cuda {

namespace {

constexpr int threads = 256;

unsigned blocks_for(std::int64_t n) { return unsigned(std::min<std::int64_t>((n + threads - 1) / threads, 65535 * 4)); }

/// Row r of local [rows, pitch]: its first `valid` columns, which are token ids first.. -> out[r].
__global__ void __launch_bounds__(sample_threads) partial_greedy_kernel(const float* local, std::int64_t pitch,
                                                                        std::int64_t valid, int first, row_max_sum* out) {
  __shared__ cub::BlockReduce<row_max_sum, sample_threads>::TempStorage storage;
  const row_max_sum all = block_row_max_sum(storage, local + std::int64_t(blockIdx.x) * pitch, valid, first);
  if (threadIdx.x == 0) out[blockIdx.x] = all;
}

/// partials [ranks, rows] (every rank's view of each row) -> tokens[r], logprobs[r].
__global__ void merge_greedy_kernel(const row_max_sum* partials, std::int32_t ranks, std::int64_t rows,
                                    std::int32_t* tokens, double* logprobs) {
  const std::int64_t r = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  row_max_sum all{-INFINITY, 0, 0.0f};
  for (std::int32_t k = 0; k < ranks; ++k) all = merge_row_max_sum{}(all, partials[k * rows + r]);
  tokens[r] = all.index;
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

nccl_rank::nccl_rank(ncclComm_t comm, const tensor_parallel_plan& plan, std::int32_t rank, bool time_graphs)
    : comm_(comm),
      rank_(rank),
      ranks_(plan.ranks),
      time_graphs_(time_graphs),
      vocab_(plan.shards[std::size_t(rank)].vocab),
      vocab_shard_(plan.vocab_shard),
      vocab_size_(plan.vocab_size) {
  // Pinned host memory is mapped into every GPU's address space (unified addressing): the peer
  // reduce's kernels poll it, abort() sets it.
  abort_flag_ = kernels::cuda::allocate<kernels::cuda::pinned_host_memory>(sizeof(int));
  *static_cast<volatile int*>(abort_flag_.get()) = 0;
}

nccl_rank::~nccl_rank() {
  const auto destroy = [](const std::vector<timed>& events) {
    for (const timed& t : events) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
    }
  };
  for (const step_record& r : steps_) destroy(r.events);
  for (const step_record& r : spare_) destroy(r.events);
  for (const graph_timing& g : graphs_) {
    destroy(g.sets[0]);
    destroy(g.sets[1]);
  }
  const std::lock_guard lock(guard_);
  if (!aborted_) nccl().comm_destroy(comm_);
}

void nccl_rank::abort() noexcept {
  if (aborted_.exchange(true)) return;  // first: a call that comes now throws instead of waiting
  *static_cast<volatile int*>(abort_flag_.get()) = 1;  // a peer reduce waiting for a failed rank returns
  std::unique_lock lock(guard_, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::seconds(5));
  nccl().comm_abort(comm_);
}

bool nccl_rank::aborted() const { return aborted_; }

std::unique_lock<std::timed_mutex> nccl_rank::lock_unless_aborted() const {
  // An abort may hold the lock for long (ncclCommAbort waits for the rank's graphs to go, which
  // waits for this rank's thread to return): a call arriving meanwhile gives up.
  std::unique_lock lock(guard_, std::defer_lock);
  while (!lock.try_lock_for(std::chrono::milliseconds(1)))
    if (aborted_) throw_aborted();
  if (aborted_) throw_aborted();
  return lock;
}

nccl_rank::step_record& nccl_rank::current_step() {
  if (steps_.empty()) begin_step();  // a collective outside begin_step/end_step counts with the next end_step
  return steps_.back();
}

/// events[used], created when the list is that short, and used + 1.
nccl_rank::timed& nccl_rank::next_event(std::vector<timed>& events, std::size_t& used) {
  if (used == events.size()) {
    timed t{};
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&t.start));
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&t.end));
    events.push_back(t);
  }
  return events[used++];
}

template <class F>
void nccl_rank::collective(bool all_reduce, double bytes, cudaStream_t stream, F&& call) {
  const auto lock = lock_unless_aborted();  // abort() waits (up to 5 s) for a call being enqueued
  // Under capture the events become record nodes of the graph (external: recorded at each replay).
  const bool capture = capturing_ >= 0;
  if (capture && !time_graphs_) {
    PAGEDKV_NCCL_CHECK(call(), comm_);
    return;
  }
  step_record* step = capture ? nullptr : &current_step();
  timed& t = capture ? next_event(graphs_[std::size_t(capturing_)].sets[0], captured_)
                     : next_event(step->events, step->used);
  t.all_reduce = all_reduce;
  t.bytes = bytes;
  const unsigned flags = capture ? cudaEventRecordExternal : cudaEventRecordDefault;
  PAGEDKV_CUDA_CHECK(cudaEventRecordWithFlags(t.start, stream, flags));
  PAGEDKV_NCCL_CHECK(call(), comm_);
  PAGEDKV_CUDA_CHECK(cudaEventRecordWithFlags(t.end, stream, flags));
}

void nccl_rank::throw_aborted() const {
  throw nccl_error(ncclInvalidUsage, "pagedkv: tensor-parallel rank " + std::to_string(rank_) +
                                         ": its NCCL communicator was aborted");
}

void nccl_rank::begin_capture() {
  // Always a new timing id: a replay of the graph being replaced may be in flight, its events
  // still to be read by end_step.
  capturing_ = std::int32_t(graphs_.size());
  graphs_.emplace_back();
  captured_ = 0;
}

std::int32_t nccl_rank::end_capture() { return std::exchange(capturing_, -1); }

void nccl_rank::instantiated(std::int32_t graph, cudaGraph_t captured) {
  if (graph < 0) return;
  graph_timing& g = graphs_[std::size_t(graph)];
  const std::vector<timed>& events = g.sets[0];
  if (events.empty()) return;
  std::size_t count = 0;
  PAGEDKV_CUDA_CHECK(cudaGraphGetNodes(captured, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  PAGEDKV_CUDA_CHECK(cudaGraphGetNodes(captured, nodes.data(), &count));
  std::map<cudaEvent_t, std::pair<std::size_t, bool>> where;  // event -> (index, whether the start)
  for (std::size_t i = 0; i < events.size(); ++i) {
    where[events[i].start] = {i, true};
    where[events[i].end] = {i, false};
  }
  g.nodes.assign(events.size(), {nullptr, nullptr});
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    PAGEDKV_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeEventRecord) continue;
    cudaEvent_t event = nullptr;
    PAGEDKV_CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(node, &event));
    const auto found = where.find(event);
    if (found == where.end()) continue;
    auto& [start, end] = g.nodes[found->second.first];
    (found->second.second ? start : end) = node;
  }
  g.bindable = std::all_of(g.nodes.begin(), g.nodes.end(), [](const auto& n) { return n.first && n.second; });
  if (!g.bindable) return;
  std::size_t made = 0;
  for (const timed& t : events) {
    timed& twin = next_event(g.sets[1], made);
    twin.all_reduce = t.all_reduce;
    twin.bytes = t.bytes;
  }
}

void nccl_rank::launch(cudaGraphExec_t exec, std::int32_t graph, cudaStream_t stream) {
  const auto lock = lock_unless_aborted();
  step_record& step = current_step();
  graph_timing* g = graph >= 0 ? &graphs_[std::size_t(graph)] : nullptr;
  if (g && g->bindable) {
    // Each replay records the set the last one did not: that one may be in flight, its events
    // unread (at most two steps are, launch_sampled's bound); the one before was read.
    const int next = 1 - g->bound;
    const std::vector<timed>& set = g->sets[next];
    for (std::size_t i = 0; i < set.size(); ++i) {
      PAGEDKV_CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(exec, g->nodes[i].first, set[i].start));
      PAGEDKV_CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(exec, g->nodes[i].second, set[i].end));
    }
    g->bound = next;
  }
  PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  if (g && g->bindable) step.replays.emplace_back(graph, g->bound);
  else ++stats_.untimed_replays;
}

void nccl_rank::begin_step() {
  if (spare_.empty()) {
    steps_.emplace_back();
  } else {
    steps_.push_back(std::move(spare_.back()));
    spare_.pop_back();
  }
  steps_.back().used = 0;
  steps_.back().replays.clear();
}

void nccl_rank::count(const timed& t) {
  float ms = 0.0f;
  PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.end));
  (t.all_reduce ? stats_.all_reduce_seconds : stats_.gather_seconds) += 1e-3 * ms;
  if (t.all_reduce) {
    stats_.last_step_ms.push_back(ms);
    ++stats_.all_reduces;
    stats_.all_reduce_bytes += t.bytes;
    ++stats_.all_reduce_sizes[std::int64_t(t.bytes)];
  }
}

void nccl_rank::end_step() {
  if (steps_.empty()) return;
  step_record step = std::move(steps_.front());
  steps_.pop_front();
  stats_.last_step_ms.clear();
  const auto recycle = [&] { spare_.push_back(std::move(step)); };
  try {
    for (std::size_t i = 0; i < step.used; ++i) count(step.events[i]);
    for (const auto& [g, set] : step.replays)
      for (const timed& t : graphs_[std::size_t(g)].sets[set]) count(t);
  } catch (...) {
    recycle();
    throw;
  }
  recycle();
}

void nccl_rank::embed(__nv_bfloat16* rows, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t n,
                      std::int64_t dim, cudaStream_t stream) {
  embed_kernel<__nv_bfloat16><<<unsigned(n), row_threads, 0, stream>>>(rows, embedding, tokens, dim, vocab_.begin,
                                                                      vocab_.size());
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  all_reduce(rows, n * dim, stream);
}

void nccl_rank::all_reduce(__nv_bfloat16* data, std::int64_t count, cudaStream_t stream) {
  collective(true, double(count) * sizeof(__nv_bfloat16), stream, [&] {
    return nccl().all_reduce(data, data, std::size_t(count), ncclBfloat16, ncclSum, comm_, stream);
  });
}

peer_window nccl_rank::open_peer_reduce(std::int64_t rows, std::int64_t dim) {
  using kernels::cuda::allocate;
  using kernels::cuda::device_memory;
  int device = 0, sms = 0, per_sm = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PAGEDKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, peer_reduce_kernel_for(dim), row_threads, 0));
  // Two CTAs an SM at most: every CTA is resident at once even beside a dependent grid's.
  peer_.ctas = sms * std::clamp(per_sm, 1, 2);
  peer_.rows = rows;
  peer_.dim = dim;
  const std::size_t bytes = std::size_t(ranks_) * std::size_t(rows * dim) * sizeof(__nv_bfloat16);
  for (auto& d : peer_.data) d = allocate<device_memory>(bytes);
  const std::size_t flag_bytes = std::size_t(peer_.ctas) * std::size_t(ranks_) * sizeof(std::uint32_t);
  peer_.flags = allocate<device_memory>(flag_bytes);
  peer_.counters = allocate<device_memory>(std::size_t(peer_.ctas) * sizeof(std::uint32_t));
  PAGEDKV_CUDA_CHECK(cudaMemset(peer_.flags.get(), 0, flag_bytes));
  peer_.bytes = 2 * bytes + flag_bytes + std::size_t(peer_.ctas) * sizeof(std::uint32_t);
  PAGEDKV_CUDA_CHECK(cudaMemset(peer_.counters.get(), 0, std::size_t(peer_.ctas) * sizeof(std::uint32_t)));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  return {.data = {static_cast<__nv_bfloat16*>(peer_.data[0].get()), static_cast<__nv_bfloat16*>(peer_.data[1].get())},
          .flags = static_cast<std::uint32_t*>(peer_.flags.get()), .ctas = peer_.ctas};
}

bool nccl_rank::connect_peers(std::span<const peer_window> windows, std::string* why) {
  if (std::int32_t(windows.size()) != ranks_) {
    *why = std::to_string(windows.size()) + " peer windows for " + std::to_string(ranks_) + " ranks";
    return false;
  }
  if (ranks_ > peer_reduce_max_ranks) {
    *why = std::to_string(ranks_) + " ranks (at most " + std::to_string(peer_reduce_max_ranks) + ")";
    return false;
  }
  int device = 0, devices = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  PAGEDKV_CUDA_CHECK(cudaGetDeviceCount(&devices));
  for (int k = 0; k < ranks_; ++k) {
    if (k == rank_) continue;
    int can = 0;
    // tp_backend puts rank k on GPU k.
    PAGEDKV_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, k));
    if (!can) {
      *why = "GPU " + std::to_string(device) + " cannot access GPU " + std::to_string(k) + "'s memory";
      return false;
    }
    const cudaError_t enabled = cudaDeviceEnablePeerAccess(k, 0);
    if (enabled == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();  // NCCL's P2P may have
    else PAGEDKV_CUDA_CHECK(enabled);
  }
  // Every rank's grid alike: the fewest CTAs any rank's GPU holds at once.
  for (const peer_window& w : windows) peer_.ctas = std::min(peer_.ctas, w.ctas);
  for (int which = 0; which < 2; ++which) {
    peer_reduce_params& p = peer_.params[which];
    p.slot = peer_.rows * peer_.dim;
    p.rank = rank_;
    p.ranks = ranks_;
    p.counters = static_cast<std::uint32_t*>(peer_.counters.get());
    p.abort = static_cast<const volatile int*>(abort_flag_.get());
    for (int k = 0; k < ranks_; ++k) {
      p.buffers[k] = windows[std::size_t(k)].data[which];
      p.peer_flags[k] = windows[std::size_t(k)].flags;
    }
  }
  return true;
}

void nccl_rank::close_peer_reduce() noexcept {
  peer_ = peer_state{};  // owned_bytes: each buffer freed
}

__nv_bfloat16* nccl_rank::peer_buffer(int which, std::int64_t rows, std::int64_t dim) {
  if (!peer_.enabled || rows > peer_.rows || dim != peer_.dim || which < 0 || which > 1) return nullptr;
  return static_cast<__nv_bfloat16*>(peer_.data[which].get()) + rank_ * peer_.rows * peer_.dim;  // the rank's part
}

void nccl_rank::reduce_add_rmsnorm(int which, std::int64_t count, __nv_bfloat16* out, float* x, const float* gain,
                                   const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim, float eps,
                                   bool dependent, cudaStream_t stream) {
  if (num_rows <= 0) return;  // every rank alike: the flags stay in step
  // Timed as an all-reduce of `count` elements (with the norm it replaces); never enqueued after
  // an abort, like NCCL's calls.
  collective(true, double(count) * sizeof(__nv_bfloat16), stream, [&] {
    if (capturing_ < 0) ++stats_.eager_peer_reduces;  // counted once past the abort check
    peer_reduce_add_rmsnorm(peer_.params[which], peer_.ctas, out, x, gain, rows, num_rows, dim, eps, dependent, stream);
    return ncclSuccess;
  });
}

bool nccl_rank::reserve_rows(std::int64_t rows) {
  const std::size_t before = gathered_.capacity + partial_.capacity + partials_.capacity;
  const std::size_t row_bytes = sizeof(row_max_sum) * std::size_t(rows);
  reserve(gathered_, std::size_t(ranks_ * rows * vocab_shard_) * sizeof(float));
  reserve(partial_, row_bytes);
  reserve(partials_, row_bytes * std::size_t(ranks_));
  return gathered_.capacity + partial_.capacity + partials_.capacity != before;
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
  const std::size_t row_bytes = sizeof(row_max_sum) * std::size_t(rows);
  auto* mine = static_cast<row_max_sum*>(reserve(partial_, row_bytes));
  auto* all = static_cast<row_max_sum*>(reserve(partials_, row_bytes * std::size_t(ranks_)));
  partial_greedy_kernel<<<unsigned(rows), sample_threads, 0, stream>>>(local, vocab_shard_, vocab_.size(),
                                                                       int(vocab_.begin), mine);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  collective(false, 0.0, stream, [&] { return nccl().all_gather(mine, all, row_bytes, ncclUint8, comm_, stream); });
  merge_greedy_kernel<<<blocks_for(rows), threads, 0, stream>>>(all, ranks_, rows, tokens, logprobs);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

double nccl_rank::time_all_reduce(std::int64_t count, int iterations, cudaStream_t stream) {
  auto* data = static_cast<__nv_bfloat16*>(reserve(scratch_, std::size_t(std::max<std::int64_t>(count, 1)) * 2));
  PAGEDKV_CUDA_CHECK(cudaMemsetAsync(data, 0, std::size_t(count) * 2, stream));
  const auto once = [&] {
    const auto lock = lock_unless_aborted();
    PAGEDKV_NCCL_CHECK(nccl().all_reduce(data, data, std::size_t(count), ncclBfloat16, ncclSum, comm_, stream), comm_);
  };
  for (int i = 0; i < 5; ++i) once();
  const kernels::cuda::owned_event start = kernels::cuda::make_event(), end = kernels::cuda::make_event();
  PAGEDKV_CUDA_CHECK(cudaEventRecord(start.get(), stream));
  for (int i = 0; i < iterations; ++i) once();
  PAGEDKV_CUDA_CHECK(cudaEventRecord(end.get(), stream));
  PAGEDKV_CUDA_CHECK(cudaEventSynchronize(end.get()));
  float ms = 0.0f;
  PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), end.get()));
  return 1e-3 * double(ms) / iterations;
}

void* nccl_rank::reserve(buffer& b, std::size_t bytes) {
  if (bytes > b.capacity) {
    b.bytes.reset();
    b.capacity = 0;  // until the allocation succeeds: a throw leaves no capacity the pointer lacks
    b.bytes = kernels::cuda::allocate<kernels::cuda::device_memory>(std::max<std::size_t>(bytes, 16));
    b.capacity = bytes;
  }
  return b.bytes.get();
}

}  // namespace pagedkv::llama::cuda
