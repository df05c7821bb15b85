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

}  // namespace

// Column-major, as cuBLASLt sees row-major data: y^T [out, n] = W [out, in] x^T [in, n], with W
// stored as W^T [in, out] (transposed in the op) and x as x^T [in, n].
struct gemm::plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;  // the heuristic's candidates asked for so far, best first
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

/// The heuristic's first `count` candidates for the plan's shape (at least one, or a failure).
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
  p.algos.clear();
  for (int i = 0; i < found; ++i) p.algos.push_back(results[std::size_t(i)].algo);
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
  const int index = preset == preset_.end() ? 0 : preset->second;
  ask_heuristic(*p, k, index + 1);
  p->choice = index < int(p->algos.size()) ? index : 0;
  slot = std::move(p);
  return *slot;
}

int gemm::num_candidates(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int wanted) {
  plan& p = plan_for(n, in, out, f32_out);
  if (int(p.algos.size()) < wanted) {
    ask_heuristic(p, {n, in, out, f32_out}, wanted);  // the same list for the same shape, longer
    if (p.choice >= int(p.algos.size())) p.choice = 0;
  }
  return int(p.algos.size());
}

void gemm::choose(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out, int index) {
  plan& p = plan_for(n, in, out, f32_out);
  if (index < 0 || index >= int(p.algos.size()))
    pagedkv::detail::fail(errc::invalid_argument, "gemm::choose: candidate ", index, " of ", p.algos.size(), " for a ",
                          n, " x ", in, " by ", in, " x ", out, " product");
  p.choice = index;
}

int gemm::chosen(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out) const {
  const auto it = plans_.find({n, in, out, f32_out});
  return it == plans_.end() ? 0 : it->second->choice;
}

void gemm::set_choices(const std::vector<gemm_choice>& choices) {
  for (const gemm_choice& c : choices)  // all checked first: a refused list changes nothing
    if (c.index < 0)
      pagedkv::detail::fail(errc::invalid_argument, "gemm::set_choices: candidate ", c.index, " for a ", c.n, " x ", c.in,
                            " by ", c.in, " x ", c.out, " product");
  for (const gemm_choice& c : choices) {
    const key k{c.n, c.in, c.out, c.f32_out};
    preset_[k] = c.index;
    if (const auto it = plans_.find(k); it != plans_.end()) {
      num_candidates(c.n, c.in, c.out, c.f32_out, c.index + 1);
      it->second->choice = c.index < int(it->second->algos.size()) ? c.index : 0;
    }
  }
}

std::vector<gemm_choice> gemm::choices() const {
  std::vector<gemm_choice> out;
  for (const auto& [k, p] : plans_)
    if (p->choice != 0) out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), p->choice});
  return out;
}

void gemm::run(void* y, const void* x, const void* w, std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
               cudaStream_t stream) {
  if (n == 0) return;
  const plan& p = plan_for(n, in, out, f32_out);
  const cublasLtMatmulAlgo_t& algo = p.algos[std::size_t(p.choice)];
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &algo, workspace_,
                          workspace_bytes_, stream),
           "cublasLtMatmul", n, in, out);
}

}  // namespace pagedkv::llama::cuda
