#include "gemm.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/error.hpp>

namespace pagedkv::llama::cuda {

namespace {

void check_lt(cublasStatus_t status, const char* call, std::int64_t n, std::int64_t in, std::int64_t out) {
  if (status != CUBLAS_STATUS_SUCCESS)
    pagedkv::detail::fail(errc::invalid_argument, call, " failed (cuBLAS status ", int(status), ") for a ", n, " x ",
                          in, " by ", in, " x ", out, " product");
}

template <class T>
T config_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written);
  return value;
}

gemm_config config_of(const cublasLtMatmulAlgo_t& algo) {
  return {.algo = config_attribute<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
          .tile = config_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
          .stages = config_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
          .splitk = config_attribute<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
          .reduction = config_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
          .swizzle = config_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
          .custom = config_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
          .inner = config_attribute<std::uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
          .cluster = config_attribute<std::uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)};
}

}  // namespace

// Column-major, as cuBLASLt sees row-major data: y^T [out, n] = W [out, in] x^T [in, n], with W
// stored as W^T [in, out] (transposed in the op) and x as x^T [in, n].
struct gemm::plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  struct candidate {
    gemm_config config;
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<candidate> candidates;  // the heuristic's first, then in the order they came
  int heuristic_asked = 0;            // how many of the heuristic's candidates are among them
  int choice = 0;
  ~plan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

gemm::gemm(std::size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  check_lt(cublasLtCreate(&handle_), "cublasLtCreate", 0, 0, 0);
  if (const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_); status != cudaSuccess) {
    cublasLtDestroy(handle_);
    throw kernels::cuda_error(status, ("cudaMalloc of the cuBLASLt workspace, " + std::to_string(workspace_bytes_) +
                                       " bytes").c_str(), __FILE__, __LINE__);
  }
}

gemm::~gemm() {
  plans_.clear();
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

/// The heuristic's first `count` candidates among the plan's (at least one, or a failure).
void gemm::ask_heuristic(plan& p, const key& k, int count) {
  const auto [n, in, out, f32_out] = k;
  const auto start = std::chrono::steady_clock::now();
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::size_t(std::max(count, 1)));
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, p.pref,
                                                               int(results.size()), results.data(), &found);
  heuristic_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_lt(status, "cublasLtMatmulAlgoGetHeuristic", n, in, out);
  if (found == 0) check_lt(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic (no algorithm)", n, in, out);
  for (int i = 0; i < found; ++i) {  // the same list for the same shape, longer: only new ones are added
    const gemm_config config = config_of(results[std::size_t(i)].algo);
    if (std::none_of(p.candidates.begin(), p.candidates.end(), [&](const auto& c) { return c.config == config; }))
      p.candidates.push_back({config, results[std::size_t(i)].algo});
  }
  p.heuristic_asked = std::max(p.heuristic_asked, count);
}

/// The index of the plan's candidate with `config`, built and added if cuBLASLt accepts it for the
/// shape within the workspace; -1 if it does not.
int gemm::find_or_add(plan& p, const key& k, const gemm_config& config) {
  for (std::size_t i = 0; i < p.candidates.size(); ++i)
    if (p.candidates[i].config == config) return int(i);
  const cudaDataType_t out_type = std::get<3>(k) ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulAlgo_t algo;
  if (cublasLtMatmulAlgoInit(handle_, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, out_type, out_type,
                             config.algo, &algo) != CUBLAS_STATUS_SUCCESS)
    return -1;
  const auto set = [&](cublasLtMatmulAlgoConfigAttributes_t attr, const auto& value) {
    return cublasLtMatmulAlgoConfigSetAttribute(&algo, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
  };
  cublasLtMatmulHeuristicResult_t checked{};
  if (!set(CUBLASLT_ALGO_CONFIG_TILE_ID, config.tile) || !set(CUBLASLT_ALGO_CONFIG_STAGES_ID, config.stages) ||
      !set(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, config.splitk) ||
      !set(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, config.reduction) ||
      !set(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, config.swizzle) ||
      !set(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, config.custom) ||
      !set(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, config.inner) ||
      !set(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, config.cluster) ||
      cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.d, p.d, &algo, &checked) != CUBLAS_STATUS_SUCCESS ||
      checked.workspaceSize > workspace_bytes_)
    return -1;
  p.candidates.push_back({config, algo});
  return int(p.candidates.size()) - 1;
}

gemm::plan& gemm::plan_for(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out) {
  const key k{n, in, out, f32_out};
  auto& slot = plans_[k];
  if (slot) return *slot;
  auto p = std::make_unique<plan>();
  check_lt(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", n, in, out);
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)),
           "cublasLtMatmulDescSetAttribute", n, in, out);
  check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)),
           "cublasLtMatmulDescSetAttribute", n, in, out);
  check_lt(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, std::uint64_t(in), std::uint64_t(out), in),
           "cublasLtMatrixLayoutCreate", n, in, out);
  check_lt(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, std::uint64_t(in), std::uint64_t(n), in),
           "cublasLtMatrixLayoutCreate", n, in, out);
  check_lt(cublasLtMatrixLayoutCreate(&p->d, f32_out ? CUDA_R_32F : CUDA_R_16BF, std::uint64_t(out), std::uint64_t(n), out),
           "cublasLtMatrixLayoutCreate", n, in, out);
  check_lt(cublasLtMatmulPreferenceCreate(&p->pref), "cublasLtMatmulPreferenceCreate", n, in, out);
  cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  const auto preset = preset_.find(k);
  // with a choice given, the heuristic's first 16: a config of theirs runs as the heuristic gives it
  ask_heuristic(*p, k, preset == preset_.end() ? 1 : 16);
  if (preset != preset_.end()) p->choice = std::max(find_or_add(*p, k, preset->second), 0);
  slot = std::move(p);
  return *slot;
}

int gemm::num_candidates(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int wanted) {
  plan& p = plan_for(n, in, out, f32_out);
  if (p.heuristic_asked < wanted) ask_heuristic(p, {n, in, out, f32_out}, wanted);
  return int(p.candidates.size());
}

std::vector<gemm_config> gemm::heuristic_configs(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
                                                 int count) {
  plan& p = plan_for(n, in, out, f32_out);
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::size_t(std::max(count, 1)));
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, p.pref, int(results.size()),
                                          results.data(), &found),
           "cublasLtMatmulAlgoGetHeuristic", n, in, out);
  std::vector<gemm_config> configs;
  for (int i = 0; i < std::min(found, count); ++i) configs.push_back(config_of(results[std::size_t(i)].algo));
  return configs;
}

int gemm::add_candidates(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
                         const std::vector<gemm_config>& configs) {
  plan& p = plan_for(n, in, out, f32_out);
  for (const gemm_config& c : configs) (void)find_or_add(p, {n, in, out, f32_out}, c);
  return int(p.candidates.size());
}

void gemm::choose(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int index) {
  plan& p = plan_for(n, in, out, f32_out);
  if (index < 0 || index >= int(p.candidates.size()))
    pagedkv::detail::fail(errc::invalid_argument, "gemm::choose: candidate ", index, " of ", p.candidates.size(),
                          " for a ", n, " x ", in, " by ", in, " x ", out, " product");
  p.choice = index;
}

int gemm::chosen(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out) const {
  const auto it = plans_.find({n, in, out, f32_out});
  return it == plans_.end() ? 0 : it->second->choice;
}

void gemm::set_choices(const std::vector<gemm_choice>& choices) {
  for (const gemm_choice& c : choices)  // all checked first: a refused list changes nothing
    if (c.config.algo < 0 || c.config.splitk < 1)
      pagedkv::detail::fail(errc::invalid_argument, "gemm::set_choices: algorithm ", c.config.algo, " with split-K ",
                            c.config.splitk, " for a ", c.n, " x ", c.in, " by ", c.in, " x ", c.out, " product");
  for (const gemm_choice& c : choices) {
    const key k{c.n, c.in, c.out, c.f32_out};
    preset_[k] = c.config;
    if (const auto it = plans_.find(k); it != plans_.end()) {
      num_candidates(c.n, c.in, c.out, c.f32_out, 16);
      it->second->choice = std::max(find_or_add(*it->second, k, c.config), 0);
    }
  }
}

std::vector<gemm_choice> gemm::choices() const {
  std::vector<gemm_choice> out;
  for (const auto& [k, p] : plans_)
    if (p->choice != 0)
      out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k),
                     p->candidates[std::size_t(p->choice)].config});
  return out;
}

void gemm::run(void* y, const void* x, const void* w, std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
               cudaStream_t stream) {
  if (n == 0) return;
  const plan& p = plan_for(n, in, out, f32_out);
  const cublasLtMatmulAlgo_t& algo = p.candidates[std::size_t(p.choice)].algo;
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &algo, workspace_,
                          workspace_bytes_, stream),
           "cublasLtMatmul", n, in, out);
}

}  // namespace pagedkv::llama::cuda
