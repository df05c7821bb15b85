// The CPU backend: float32 weights in host memory, the forward of model.hpp (OpenBLAS matrix
// products, the kernels' host-reference attention split over a thread pool), and paged float32 KV
// pools in host memory for both the "device" pool and the swap pool. Block moves run the kernels'
// host-reference cache ops, so the CPU path has the semantics the GPU tests check.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <pagedkv/kv_dtype.hpp>

#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model.hpp"
#include "model_backend.hpp"

namespace pagedkv::llama {

class cpu_backend final : public model_backend {
 public:
  /// config and weights must outlive the backend. Errors: pagedkv::error (invalid_argument) for a
  /// kv_dtype other than f32, the only one the CPU forward stores.
  cpu_backend(const llama_config& config, const llama_weights& weights, kernels::dtype kv_dtype = kernels::dtype::f32);

  [[nodiscard]] std::int64_t vocab_size() const noexcept override { return config_.vocab_size; }
  [[nodiscard]] std::vector<kv_cache_spec> kv_cache_groups() const override { return attention_groups_of(config_).specs; }
  [[nodiscard]] kernels::kv_cache_layout kv_layout(std::int32_t num_blocks, std::int32_t block_size) const override;
  void allocate_kv_cache(const kv_cache_options& kv) override;
  std::span<const float> execute(const step_plan& plan) override;

 private:
  void move_blocks(const step_plan& plan);
  void prepare(const step_plan& plan);

  const llama_config& config_;
  const llama_weights& weights_;
  paged_kv_cache device_cache_;  ///< the pool the forward reads and writes
  paged_kv_cache host_cache_;    ///< swap preemption's pool; empty without one
  forward_state state_;          ///< scratch buffers and the attention's thread pool
  forward_batch batch_;          ///< the plan's forward, rebuilt each step
};

}  // namespace pagedkv::llama
