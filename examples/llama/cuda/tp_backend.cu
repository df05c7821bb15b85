// The tensor-parallel backend (tp_backend.hpp): a worker thread per GPU, each owning its rank's
// nccl_rank and cuda_backend; every call fans out to the workers and waits for all of them, or
// for the first failure or the step's deadline, whichever comes first.
#include "cuda/tp_backend.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/error.hpp>

#include "cuda/cuda_backend.hpp"
#include "cuda/nccl_rank.hpp"
#include "rank_group.hpp"
#include "sharding.hpp"

namespace pagedkv::llama {

namespace {

using pagedkv::detail::fail;

/// The failure injection's ranks: -1 (off) or a rank of options.size, each named where it is not.
void check_failure_injection(const tensor_parallel_options& options) {
  for (const auto& [name, rank] : {std::pair{"fail_rank", options.fail_rank},
                                   std::pair{"fail_peer_access_rank", options.fail_peer_access_rank}})
    if (rank != -1 && (rank < 0 || rank >= options.size))
      fail(errc::invalid_argument, "tensor_parallel_options::", name, " is ", rank, ": -1 (off) or a rank in [0, ",
           options.size - 1, "] of tensor-parallel size ", options.size);
}

class tp_backend final : public model_backend {
 public:
  tp_backend(const llama_config& config, const llama_weights* weights, const tensor_parallel_options& options);
  ~tp_backend() override;

  [[nodiscard]] std::int64_t vocab_size() const noexcept override { return config_.vocab_size; }
  [[nodiscard]] kernels::kv_cache_layout kv_layout(std::int32_t num_blocks, std::int32_t block_size) const override {
    return backends_.front()->kv_layout(num_blocks, block_size);  // every rank's: the same local KV heads
  }
  void allocate_kv_cache(const kv_cache_options& kv) override {
    refuse_while_launched("allocate_kv_cache");
    run_all("allocate_kv_cache", [&](std::size_t r) { backends_[r]->allocate_kv_cache(kv); });
  }
  void reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs) override {
    check_reserve_steps(max_tokens, max_seqs);  // before any rank runs: bad sizes are not a failed rank
    refuse_while_launched("reserve_steps");
    run_all("reserve_steps", [&](std::size_t r) { backends_[r]->reserve_steps(max_tokens, max_seqs); });
  }
  std::span<const float> execute(const step_plan& plan) override {
    std::span<const float> logits;
    step([&](std::size_t r) {
      const std::span<const float> l = backends_[r]->execute(plan);
      if (r == 0) logits = l;
    });
    return logits;
  }
  step_samples execute_sampled(const step_plan& plan, const sampling_batch& sampling) override {
    if (!launched_.empty()) fail(errc::invalid_argument, "execute_sampled with launched steps not collected");
    launch_sampled(plan, sampling, {});
    return collect_sampled();
  }
  /// Every rank enqueues the step and returns (asynchronous scheduling: the host plans the next
  /// step meanwhile); the deadline covers the enqueueing here and the GPU work in collect_sampled.
  void launch_sampled(const step_plan& plan, const sampling_batch& sampling,
                      std::span<const std::int32_t> token_sources) override {
    if (launched_.size() >= 2) fail(errc::invalid_argument, "launch_sampled: two launched steps are not collected yet");
    // Refusals before any rank runs: a bad batch is not a failed rank.
    check_sampling_batch(sampling, std::size_t(std::count_if(plan.batch.begin(), plan.batch.end(),
                                                             [](const scheduled_sequence& q) { return q.produces_logits; })),
                         vocab_size());
    check_token_sources(plan, token_sources, previous_draws_);
    const std::int64_t index = steps_;
    run_all("step " + std::to_string(index), [&](std::size_t r) {
      inject_failure(r, index);
      ranks_[r]->begin_step();
      backends_[r]->launch_sampled(plan, sampling, token_sources);
    });
    ++steps_;
    launched_.push_back(index);
    previous_draws_ = sampling.uniforms.size();
  }
  /// The oldest launched step's results. A graphed step is collected like an eager one: each
  /// replay of a decode graph records its collectives' times into the set of events the replay
  /// before it did not (nccl_rank::launch), so two steps in flight time apart.
  step_samples collect_sampled() override {
    if (launched_.empty()) fail(errc::invalid_argument, "collect_sampled: no launched step to collect");
    const std::int64_t index = launched_.front();
    launched_.pop_front();
    return collect_ranks(index);
  }

  [[nodiscard]] tensor_parallel_stats stats() const {
    const cuda::collective_stats& c = ranks_.front()->stats();
    return {.ranks = plan_.ranks, .steps = steps_, .all_reduces = c.all_reduces,
            .all_reduce_seconds = c.all_reduce_seconds, .all_reduce_alone_seconds = alone_seconds_,
            .all_reduce_bytes = c.all_reduce_bytes,
            .gather_seconds = c.gather_seconds, .busy_seconds = cuda_busy_seconds(*backends_.front()),
            .graphs = cuda_graph_stats_of(*backends_.front()), .untimed_replays = c.untimed_replays,
            .all_reduce_sizes = {c.all_reduce_sizes.begin(), c.all_reduce_sizes.end()},
            .peer_reduce = peer_reduce_off_.empty(), .peer_reduce_off = peer_reduce_off_,
            .eager_peer_reduces = c.eager_peer_reduces, .peer_reduce_bytes = peer_reduce_bytes(),
            .buffer_growths = cuda_step_stats_of(*backends_.front()).buffer_growths};
  }
  /// What every rank holds for the peer reduce (host-side counts: no CUDA call).
  [[nodiscard]] std::size_t peer_reduce_bytes() const {
    std::size_t bytes = 0;
    for (const auto& rank : ranks_) bytes += rank->peer_reduce_bytes();
    return bytes;
  }
  std::vector<double> all_reduce_seconds(std::span<const std::int64_t> counts) {
    std::vector<double> seconds(counts.size());
    run_all("all-reduce timing", [&](std::size_t r) {
      cudaStream_t stream = nullptr;
      PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      for (std::size_t i = 0; i < counts.size(); ++i) {
        const double s = ranks_[r]->time_all_reduce(counts[i], 20, stream);
        if (r == 0) seconds[i] = s;
      }
      PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
    });
    return seconds;
  }
  std::uint64_t kv_budget_bytes(double utilization) {
    std::vector<std::uint64_t> bytes(backends_.size());
    run_all("kv budget", [&](std::size_t r) { bytes[r] = cuda_kv_budget_bytes(*backends_[r], utilization); });
    return *std::min_element(bytes.begin(), bytes.end());
  }

 private:
  /// The options' failure injection: rank fail_rank throws, or hangs until the abort, at step
  /// fail_at_step.
  void inject_failure(std::size_t r, std::int64_t index) const {
    if (std::int32_t(r) != options_.fail_rank || index != options_.fail_at_step) return;
    const std::string where = " of rank " + std::to_string(r) + " at step " + std::to_string(index);
    if (!options_.fail_by_hanging) throw std::runtime_error("injected failure" + where);
    while (!ranks_[r]->aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    throw std::runtime_error("injected hang" + where + ", ended by the abort");
  }

  /// The ranks refuse a resize while a launched step is not collected (cuda_backend): refused here
  /// first, so that the misuse is not a failed rank.
  void refuse_while_launched(const char* what) const {
    if (!launched_.empty())
      fail(errc::invalid_argument, "tensor-parallel ", what, " with ", launched_.size(), " launched steps not collected");
  }

  /// Every rank's results of launched step `index`, waiting for them; rank 0's (all chose alike).
  step_samples collect_ranks(std::int64_t index) {
    step_samples samples;
    run_all("step " + std::to_string(index), [&](std::size_t r) {
      const step_samples s = backends_[r]->collect_sampled();
      ranks_[r]->end_step();
      if (r == 0) samples = s;
    });
    count_alone();
    return samples;
  }

  /// One synchronous step on every rank (execute: the logits gathered).
  void step(const std::function<void(std::size_t)>& run) {
    if (!launched_.empty()) fail(errc::invalid_argument, "execute with launched steps not collected");
    const std::int64_t index = steps_;
    run_all("step " + std::to_string(index), [&](std::size_t r) {
      inject_failure(r, index);
      ranks_[r]->begin_step();
      run(r);  // cuda_backend waits for its stream at the end of a step: the events are complete
      ranks_[r]->end_step();
    });
    ++steps_;
    previous_draws_ = 0;
    count_alone();
  }

  /// Each all-reduce of the step just ended, as the rank that arrived last saw it: the shortest of
  /// the ranks' times (the others' include their wait for it), summed into alone_seconds_.
  void count_alone() {
    const std::vector<float>& first = ranks_.front()->stats().last_step_ms;
    for (std::size_t i = 0; i < first.size(); ++i) {
      float least = first[i];
      for (const auto& rank : ranks_) {
        const std::vector<float>& t = rank->stats().last_step_ms;
        if (i < t.size()) least = std::min(least, t[i]);
      }
      alone_seconds_ += 1e-3 * double(least);
    }
  }

  /// job(r) on every rank's worker; returns when all are done. On the first failure, or at the
  /// deadline, aborts every communicator, waits for the ranks to return and throws.
  void run_all(const std::string& what, const std::function<void(std::size_t)>& job, double timeout_s = 0.0) {
    if (failed_) throw tensor_parallel_error(-1, "pagedkv: the tensor-parallel backend failed earlier: " + failure_);
    if (timeout_s <= 0.0) timeout_s = options_.step_timeout_s;
    // The other ranks may wait in a collective for the failed one for ever: every communicator is
    // aborted, on a thread of its own, since ncclCommAbort sets NCCL's abort flags at once (ending
    // the collectives in flight, eager or in a graph) but then waits until no CUDA graph holds a
    // collective of its communicator; the graphs are destroyed below, once the ranks have returned
    // and their streams are idle.
    const std::optional<rank_group::failure> f = workers_->run(
        [&](std::int32_t r) { job(std::size_t(r)); }, timeout_s, [&] { start_abort(); });
    if (!f) return;
    failed_ = true;
    if (f->all_returned && loaded_)
      for (const auto& b : backends_) cuda_release_graphs(*b);
    const bool aborted = f->all_returned && finish_abort(30.0);
    std::ostringstream seconds;
    seconds << timeout_s;
    failure_ = f->rank >= 0 ? "rank " + std::to_string(f->rank) + " failed in " + what + ": " + f->what
                            : what + " passed its deadline of " + seconds.str() + " s";
    if (!aborted) stuck_ = true;
    throw tensor_parallel_error(f->rank, "pagedkv: tensor parallelism: " + failure_ +
                                             "; the NCCL communicators were aborted" +
                                             (!f->all_returned ? " and a rank did not return within 30 s"
                                              : aborted        ? ""
                                                               : " and the abort did not end within 30 s"));
  }

  /// Aborts every rank's communicator on a thread of its own (abort_thread_).
  void start_abort() {
    auto done = std::make_shared<std::promise<void>>();
    abort_done_ = done->get_future();
    abort_thread_ = std::thread([this, done] {
      for (const auto& rank : ranks_) rank->abort();
      done->set_value();
    });
  }
  /// Whether the abort ended within timeout_s (then its thread is joined; else left running).
  bool finish_abort(double timeout_s) {
    if (!abort_thread_.joinable()) return true;
    if (abort_done_.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) return false;
    abort_thread_.join();
    return true;
  }

  void load(const llama_weights* weights);
  void open_peer_reduce();
  void abandon();

  const llama_config& config_;
  tensor_parallel_options options_;
  tensor_parallel_plan plan_;
  std::vector<std::unique_ptr<cuda::nccl_rank>> ranks_;
  std::unique_ptr<rank_group> workers_;  // after ranks_: destroyed first, its jobs done
  std::vector<std::unique_ptr<model_backend>> backends_;
  std::int64_t steps_ = 0;
  std::deque<std::int64_t> launched_;  // the indices of the steps launched and not collected
  std::size_t previous_draws_ = 0;     // draws of the step launched last
  double alone_seconds_ = 0.0;         // count_alone's sum
  std::thread abort_thread_;           // start_abort's
  std::future<void> abort_done_;
  bool loaded_ = false;  // backends_ all made: the abort may reach them from this thread
  bool failed_ = false, stuck_ = false;
  std::string failure_;
  std::string peer_reduce_off_;  // why the peer reduce is off; empty: on
};

tp_backend::tp_backend(const llama_config& config, const llama_weights* weights, const tensor_parallel_options& options)
    : config_(config), options_(options), plan_(make_tensor_parallel_plan(config, options.size)) {
  check_failure_injection(options);  // before NCCL or a GPU: a rank out of range would never fail
  const cuda::nccl_library& nccl = cuda::nccl();  // throws, naming why, without NCCL
  int devices = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < options.size)
    fail(errc::invalid_argument, "tensor-parallel size ", options.size, " needs ", options.size, " GPUs; ", devices,
         devices == 1 ? " is" : " are", " visible");
  const auto n = std::size_t(options.size);
  std::vector<int> device_list(n);
  for (std::size_t r = 0; r < n; ++r) device_list[r] = int(r);
  std::vector<ncclComm_t> comms(n);
  PAGEDKV_NCCL_CHECK(nccl.comm_init_all(comms.data(), options.size, device_list.data()), nullptr);
  for (std::size_t r = 0; r < n; ++r) ranks_.push_back(
        std::make_unique<cuda::nccl_rank>(comms[r], plan_, std::int32_t(r), options.time_graph_collectives));
  // Each worker makes its GPU current once: every CUDA call of a rank runs on its worker.
  workers_ = std::make_unique<rank_group>(options.size, [](std::int32_t r) { PAGEDKV_CUDA_CHECK(cudaSetDevice(r)); });
  backends_.resize(n);
  try {
    load(weights);
    open_peer_reduce();
  } catch (...) {
    if (stuck_) abandon();  // the members' destructors would wait for the stuck threads
    throw;
  }
  loaded_ = true;
}

void tp_backend::load(const llama_weights* weights) {
  const tensor_parallel_options& options = options_;
  const llama_config& config = config_;
  // Each worker slices its shard (a copy of a 1/size of the weights at a time) and uploads it.
  // Slicing and uploading a 13B model's shards takes seconds; the deadline is for a stuck rank.
  run_all("loading the weights", [&](std::size_t r) {
    const tensor_parallel_shard& shard = plan_.shards[r];
    const cuda_backend_options rank_options{.kv_dtype = options.kv_dtype,
                                           .device = int(r),
                                           .random_seed = options.random_seed + r,
                                           .cuda_graphs = options.cuda_graphs,
                                           .tensor_parallel = ranks_[r].get()};
    if (weights) {
      const llama_weights sliced = shard_weights(config, *weights, shard);
      backends_[r] = make_cuda_backend(shard.config, &sliced, rank_options);
    } else {
      backends_[r] = make_cuda_backend(shard.config, nullptr, rank_options);
    }
  }, std::max(600.0, options.step_timeout_s));
}

/// The peer reduce on every rank, or on none (naming why in peer_reduce_off_): each rank's
/// buffers and flags, then every GPU's access to the others' memory. Where any part fails (a GPU
/// that cannot reach another's memory, or a throw), every rank's buffers are freed again.
void tp_backend::open_peer_reduce() {
  const std::int64_t dim = config_.embedding_dim;
  if (!options_.peer_reduce) {
    peer_reduce_off_ = "off (tensor_parallel_options::peer_reduce)";
    return;
  }
  if (!cuda::peer_reduce_fits(dim)) {
    peer_reduce_off_ = "off: its kernel does not take a hidden size of " + std::to_string(dim);
    return;
  }
  // Frees every rank's buffers, each on its worker, unless the reduce was turned on; after a
  // rank's throw too (the workers have all returned then; a stuck one is left, as abandon does).
  struct closer {
    tp_backend& self;
    bool keep = false;
    ~closer() {
      if (keep || self.stuck_) return;
      try {
        const auto f = self.workers_->run([this](std::int32_t r) { self.ranks_[std::size_t(r)]->close_peer_reduce(); },
                                          30.0, [] {});
        if (f && !f->all_returned) self.stuck_ = true;
      } catch (...) {  // a destructor must not throw: the buffers are then kept, as before this closer
      }
    }
  } closing{*this};
  const auto n = std::size_t(options_.size);
  std::vector<cuda::peer_window> windows(n);
  const std::int64_t rows = std::max<std::int64_t>(options_.peer_reduce_tokens, 1);
  run_all("the peer reduce's buffers", [&](std::size_t r) { windows[r] = ranks_[r]->open_peer_reduce(rows, dim); });
  std::vector<std::string> why(n);
  std::vector<char> connected(n);
  run_all("peer access", [&](std::size_t r) {
    if (std::int32_t(r) == options_.fail_peer_access_rank) {
      why[r] = "peer access unavailable on GPU " + std::to_string(r) + " (tensor_parallel_options::fail_peer_access_rank)";
      return;
    }
    connected[r] = ranks_[r]->connect_peers(windows, &why[r]);
  });
  for (std::size_t r = 0; r < n; ++r)
    if (!connected[r]) {
      peer_reduce_off_ = "off: " + why[r];
      return;
    }
  for (const auto& rank : ranks_) rank->enable_peer_reduce();
  closing.keep = true;
}

/// A rank or the abort never returned: their threads and memory are left to the process's end.
void tp_backend::abandon() {
  if (abort_thread_.joinable()) abort_thread_.detach();
  workers_->abandon();
  for (auto& b : backends_) (void)b.release();
  for (auto& r : ranks_) (void)r.release();
}

tp_backend::~tp_backend() {
  if (stuck_) {
    abandon();
    return;
  }
  // Each rank's backend (its graphs first) and communicator go on its own thread (its GPU
  // current), all at once: ncclCommDestroy finalizes, which waits for the other ranks'
  // communicators to quiesce, and for the graphs holding its collectives to be destroyed.
  (void)workers_->run([this](std::int32_t r) {
    backends_[std::size_t(r)].reset();
    ranks_[std::size_t(r)].reset();
  }, 600.0, [] {});
}

}  // namespace

bool tensor_parallel_available(std::int32_t size, std::string* why) {
  std::string reason;
  int devices = 0;
  if (!cuda::nccl_available(&reason)) {
  } else if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < size) {
    (void)cudaGetLastError();
    reason = "tensor-parallel size " + std::to_string(size) + " needs " + std::to_string(size) + " GPUs; " +
             std::to_string(devices) + (devices == 1 ? " is" : " are") + " visible";
  }
  if (why) *why = reason;
  return reason.empty();
}

std::unique_ptr<model_backend> make_tensor_parallel_backend(const llama_config& config, const llama_weights* weights,
                                                            const tensor_parallel_options& options) {
  return std::make_unique<tp_backend>(config, weights, options);
}

tensor_parallel_stats tensor_parallel_stats_of(const model_backend& backend) {
  const auto* tp = dynamic_cast<const tp_backend*>(&backend);
  return tp ? tp->stats() : tensor_parallel_stats{};
}

std::vector<double> nccl_all_reduce_seconds(const model_backend& backend, std::span<const std::int64_t> bf16_counts) {
  // Timing runs collectives on scratch buffers: the backend's model and KV state stay as they were.
  auto* tp = dynamic_cast<tp_backend*>(const_cast<model_backend*>(&backend));
  return tp ? tp->all_reduce_seconds(bf16_counts) : std::vector<double>{};
}

std::uint64_t tensor_parallel_kv_budget_bytes(const model_backend& backend, double utilization) {
  auto* tp = dynamic_cast<tp_backend*>(const_cast<model_backend*>(&backend));
  return tp ? tp->kv_budget_bytes(utilization) : cuda_kv_budget_bytes(backend, utilization);
}

}  // namespace pagedkv::llama
