// make_cuda_backend in a build without CUDA (no nvcc when it was configured): every call refuses
// with the reason, so that `--device cuda` fails clearly instead of at link time.
#include <pagedkv/error.hpp>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_sampling.hpp"

namespace pagedkv::llama {

namespace {
constexpr const char* reason = "this build has no CUDA backend (nvcc was not found when it was configured)";
}  // namespace

bool cuda_backend_available(std::string* why) {
  if (why) *why = reason;
  return false;
}

std::unique_ptr<model_backend> make_cuda_backend(const llama_config&, const llama_weights*, const cuda_backend_options&) {
  detail::fail(errc::invalid_argument, "--device cuda: ", reason);
}

std::uint64_t cuda_kv_budget_bytes(const model_backend&, double) {
  detail::fail(errc::invalid_argument, "--device cuda: ", reason);
}

double cuda_read_bytes_per_s() { detail::fail(errc::invalid_argument, "--device cuda: ", reason); }

double cuda_busy_seconds(const model_backend&) { return 0.0; }

cuda_graph_stats cuda_graph_stats_of(const model_backend&) { return {}; }

cuda_step_stats cuda_step_stats_of(const model_backend&) { return {}; }

std::vector<cuda::gemm_choice> cuda_gemm_choices(const model_backend&) { return {}; }

std::string cuda_gemm_target() { detail::fail(errc::invalid_argument, "--device cuda: ", reason); }

void cuda_release_graphs(model_backend&) {}

step_samples cuda_sample_rows(std::span<const float>, std::int64_t, const sampling_batch&, std::vector<sampled_token>&,
                              std::vector<sampled_token>&) {
  detail::fail(errc::invalid_argument, "GPU sampling: ", reason);
}

}  // namespace pagedkv::llama
