#include "model_backend.hpp"

#include <algorithm>
#include <array>

#include <pagedkv/error.hpp>

#include "cpu_backend.hpp"
#include "cuda/cuda_backend.hpp"

namespace pagedkv::llama {

step_samples model_backend::execute_sampled(const step_plan& plan, const sampling_batch& sampling) {
  const auto rows = std::size_t(std::count_if(plan.batch.begin(), plan.batch.end(),
                                              [](const scheduled_sequence& q) { return q.produces_logits; }));
  check_sampling_batch(sampling, rows, vocab_size());  // before the step runs: nothing changes on a refusal
  const std::span<const float> logits = execute(plan);
  if (logits.size() != rows * std::size_t(vocab_size()))
    detail::fail(errc::invalid_argument, "the model backend returned ", logits.size(), " logits for ", rows, " rows of ",
                 vocab_size());
  return sample_rows(logits, vocab_size(), sampling, draws_, candidates_);
}

std::size_t kv_bytes_per_block(const model_backend& backend, std::int32_t block_size) {
  return backend.kv_layout(1, block_size).bytes_per_block();
}

std::int32_t kv_blocks_for_bytes(const model_backend& backend, std::int32_t block_size, std::uint64_t budget_bytes) {
  const kernels::kv_cache_layout layout = backend.kv_layout(1, block_size);  // the count is ignored
  return kernels::blocks_for_budget(std::size_t(budget_bytes), layout.shape, layout.kv_dtype);
}

namespace {
constexpr std::array<std::string_view, 2> devices = {"cpu", "cuda"};
}  // namespace

std::span<const std::string_view> model_backend_devices() noexcept { return devices; }

std::unique_ptr<model_backend> make_model_backend(const llama_config& config, const llama_weights& weights,
                                                  const backend_options& options) {
  if (options.device == "cpu")
    return std::make_unique<cpu_backend>(config, weights, options.kv_dtype.value_or(kernels::dtype::f32));
  if (options.device == "cuda")  // refuses, naming why, in a build without CUDA or on a machine without a GPU
    return make_cuda_backend(config, &weights, {.kv_dtype = options.kv_dtype.value_or(kernels::dtype::bf16),
                                                .cuda_graphs = !options.enforce_eager});
  std::string known;
  for (const std::string_view d : devices) known += (known.empty() ? "" : ", ") + std::string(d);
  detail::fail(errc::invalid_argument, "no model backend for device '", options.device, "' (this build has: ", known,
               ")");
}

}  // namespace pagedkv::llama
