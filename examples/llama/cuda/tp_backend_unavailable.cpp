// The tensor-parallel backend in a build without it (no nvcc, or no nccl.h, when it was
// configured): every call refuses with the reason, so that --tensor-parallel-size fails clearly.
#include <pagedkv/error.hpp>

#include "cuda/cuda_backend.hpp"
#include "cuda/tp_backend.hpp"

namespace pagedkv::llama {

namespace {
#ifdef PAGEDKV_TP_NO_NCCL_HEADER
constexpr const char* reason = "this build has no tensor parallelism (nccl.h was not found when it was configured)";
#else
constexpr const char* reason = "this build has no tensor parallelism (nvcc was not found when it was configured)";
#endif
}  // namespace

bool tensor_parallel_available(std::int32_t, std::string* why) {
  if (why) *why = reason;
  return false;
}

std::unique_ptr<model_backend> make_tensor_parallel_backend(const llama_config&, const llama_weights*,
                                                            const tensor_parallel_options&) {
  detail::fail(errc::invalid_argument, "--tensor-parallel-size: ", reason);
}

tensor_parallel_stats tensor_parallel_stats_of(const model_backend&) { return {}; }

std::vector<double> nccl_all_reduce_seconds(const model_backend&, std::span<const std::int64_t>) { return {}; }

std::uint64_t tensor_parallel_kv_budget_bytes(const model_backend& backend, double utilization) {
  return cuda_kv_budget_bytes(backend, utilization);
}

}  // namespace pagedkv::llama
