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

void model_backend::reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs) {
  check_reserve_steps(max_tokens, max_seqs);
}

void check_reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs) {
  if (max_tokens < 1 || max_seqs < 1)
    detail::fail(errc::invalid_argument, "reserve_steps: max_tokens ", max_tokens, " and max_seqs ", max_seqs,
                 " must each be at least 1");
}

void check_token_sources(const step_plan& plan, std::span<const std::int32_t> token_sources,
                         std::size_t previous_draws) {
  if (token_sources.empty()) return;
  if (token_sources.size() != plan.input_tokens.size())
    detail::fail(errc::invalid_argument, "launch_sampled: ", token_sources.size(), " token sources for ",
                 plan.input_tokens.size(), " input tokens");
  for (std::size_t i = 0; i < token_sources.size(); ++i)
    if (token_sources[i] < -1 || token_sources[i] >= std::int64_t(previous_draws))
      detail::fail(errc::invalid_argument, "launch_sampled: input token ", i, " comes from draw ", token_sources[i],
                   " of a previous step of ", previous_draws, " draws");
}

void model_backend::launch_sampled(const step_plan& plan, const sampling_batch& sampling,
                                   std::span<const std::int32_t> token_sources) {
  if (launched_.size() >= 2)
    detail::fail(errc::invalid_argument, "launch_sampled: two launched steps are not collected yet");
  check_token_sources(plan, token_sources, previous_draws_.size());
  step_samples got;
  if (token_sources.empty()) {
    got = execute_sampled(plan, sampling);
  } else {
    step_plan own = plan;  // the stand-ins replaced by the previous step's draws
    for (std::size_t i = 0; i < token_sources.size(); ++i)
      if (token_sources[i] >= 0) own.input_tokens[i] = previous_draws_[std::size_t(token_sources[i])].token;
    got = execute_sampled(own, sampling);
  }
  launched_.push_back({{got.draws.begin(), got.draws.end()}, {got.candidates.begin(), got.candidates.end()}});
  previous_draws_ = launched_.back().draws;
}

step_samples model_backend::collect_sampled() {
  if (launched_.empty()) detail::fail(errc::invalid_argument, "collect_sampled: no launched step to collect");
  collected_ = std::move(launched_.front());
  launched_.erase(launched_.begin());
  return {collected_.draws, collected_.candidates};
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
