// The tensor-parallel backend (tp_backend.hpp): a worker thread per GPU, each owning its rank's
// nccl_rank and cuda_backend; every call fans out to the workers and waits for all of them, or
// for the first failure or the step's deadline, whichever comes first.
#include "cuda/tp_backend.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
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

class tp_backend final : public model_backend {
 public:
  tp_backend(const llama_config& config, const llama_weights* weights, const tensor_parallel_options& options);
  ~tp_backend() override;

  [[nodiscard]] std::int64_t vocab_size() const noexcept override { return config_.vocab_size; }
  [[nodiscard]] kernels::kv_cache_layout kv_layout(std::int32_t num_blocks, std::int32_t block_size) const override {
    return backends_.front()->kv_layout(num_blocks, block_size);  // every rank's: the same local KV heads
  }
  void allocate_kv_cache(const kv_cache_options& kv) override {
    run_all("allocate_kv_cache", [&](std::size_t r) { backends_[r]->allocate_kv_cache(kv); });
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
    step_samples samples;  // every rank samples the same gathered rows alike: rank 0's
    step([&](std::size_t r) {
      const step_samples s = backends_[r]->execute_sampled(plan, sampling);
      if (r == 0) samples = s;
    });
    return samples;
  }

  [[nodiscard]] tensor_parallel_stats stats() const {
    const cuda::collective_stats& c = ranks_.front()->stats();
    return {.ranks = plan_.ranks, .steps = steps_, .all_reduces = c.all_reduces,
            .all_reduce_seconds = c.all_reduce_seconds, .all_reduce_bytes = c.all_reduce_bytes,
            .gather_seconds = c.gather_seconds, .busy_seconds = cuda_busy_seconds(*backends_.front()),
            .graphs = cuda_graph_stats_of(*backends_.front()),
            .all_reduce_sizes = {c.all_reduce_sizes.begin(), c.all_reduce_sizes.end()}};
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
  /// One step on every rank, with the failure injection of the options.
  void step(const std::function<void(std::size_t)>& run) {
    const std::int64_t index = steps_;
    run_all("step " + std::to_string(index), [&](std::size_t r) {
      if (std::int32_t(r) == options_.fail_rank && index == options_.fail_at_step) {
        const std::string where = " of rank " + std::to_string(r) + " at step " + std::to_string(index);
        if (!options_.fail_by_hanging) throw std::runtime_error("injected failure" + where);
        while (!ranks_[r]->aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        throw std::runtime_error("injected hang" + where + ", ended by the abort");
      }
      ranks_[r]->begin_step();
      run(r);  // cuda_backend waits for its stream at the end of a step: the events are complete
      ranks_[r]->end_step();
    });
    ++steps_;
  }

  /// job(r) on every rank's worker; returns when all are done. On the first failure, or at the
  /// deadline, aborts every communicator, waits for the ranks to return and throws.
  void run_all(const std::string& what, const std::function<void(std::size_t)>& job, double timeout_s = 0.0) {
    if (failed_) throw tensor_parallel_error(-1, "pagedkv: the tensor-parallel backend failed earlier: " + failure_);
    if (timeout_s <= 0.0) timeout_s = options_.step_timeout_s;
    const std::optional<rank_group::failure> f = workers_->run(
        [&](std::int32_t r) { job(std::size_t(r)); }, timeout_s,
        [&] {  // the other ranks may wait in a collective for the failed one for ever
          // ncclCommAbort waits until no CUDA graph holds a collective of its communicator: the
          // graphs go first (one in flight is freed when the abort has ended it).
          if (loaded_)
            for (const auto& b : backends_) cuda_release_graphs(*b);
          for (const auto& rank : ranks_) rank->abort();
        });
    if (!f) return;
    failed_ = true;
    std::ostringstream seconds;
    seconds << timeout_s;
    failure_ = f->rank >= 0 ? "rank " + std::to_string(f->rank) + " failed in " + what + ": " + f->what
                            : what + " passed its deadline of " + seconds.str() + " s";
    if (!f->all_returned) stuck_ = true;
    throw tensor_parallel_error(f->rank, "pagedkv: tensor parallelism: " + failure_ +
                                             "; the NCCL communicators were aborted" +
                                             (f->all_returned ? "" : " and a rank did not return within 30 s"));
  }

  const llama_config& config_;
  tensor_parallel_options options_;
  tensor_parallel_plan plan_;
  std::vector<std::unique_ptr<cuda::nccl_rank>> ranks_;
  std::unique_ptr<rank_group> workers_;  // after ranks_: destroyed first, its jobs done
  std::vector<std::unique_ptr<model_backend>> backends_;
  std::int64_t steps_ = 0;
  bool loaded_ = false;  // backends_ all made: the abort may reach them from this thread
  bool failed_ = false, stuck_ = false;
  std::string failure_;
};

tp_backend::tp_backend(const llama_config& config, const llama_weights* weights, const tensor_parallel_options& options)
    : config_(config), options_(options), plan_(make_tensor_parallel_plan(config, options.size)) {
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
  for (std::size_t r = 0; r < n; ++r) ranks_.push_back(std::make_unique<cuda::nccl_rank>(comms[r], plan_, std::int32_t(r)));
  // Each worker makes its GPU current once: every CUDA call of a rank runs on its worker.
  workers_ = std::make_unique<rank_group>(options.size, [](std::int32_t r) { PAGEDKV_CUDA_CHECK(cudaSetDevice(r)); });
  backends_.resize(n);
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
  loaded_ = true;
}

tp_backend::~tp_backend() {
  if (stuck_) {  // a rank never returned from its step: leave its thread and memory to the process's end
    workers_->abandon();
    for (auto& b : backends_) (void)b.release();
    for (auto& r : ranks_) (void)r.release();
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
