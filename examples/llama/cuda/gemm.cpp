#include "gemm.hpp"

#include <cmath>

#include <cstdio>
#include <cstdlib>
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
  cublasLtMatmulAlgo_t algo{};
  ~plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

gemm::gemm(std::size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  // Experiment switches (docs/journal/engine-gpu.md, session 3): PAGEDKV_GEMM_CHOICE=fill picks by
  // wave fill, PAGEDKV_GEMM_LOG=1 prints each plan's candidates.
  const char* choice = std::getenv("PAGEDKV_GEMM_CHOICE");
  fill_sms_ = choice && std::string(choice) == "fill";
  log_plans_ = std::getenv("PAGEDKV_GEMM_LOG") != nullptr;
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

const gemm::plan& gemm::plan_for(std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out) {
  auto& slot = plans_[{n, in, out, f32_out}];
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
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", n, in, out);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  constexpr int max_candidates = 8;
  cublasLtMatmulHeuristicResult_t results[max_candidates]{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref,
                                                               max_candidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_lt(status, "cublasLtMatmulAlgoGetHeuristic", n, in, out);
  if (found == 0) check_lt(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic (no algorithm)", n, in, out);
  // The heuristic's first choice, or (fill_sms_, weight-streaming products of at most 256 rows)
  // the first candidate whose last wave keeps at least 90% of the SMs busy: wave fill is
  // waves / ceil(waves).
  int chosen = 0;
  if (fill_sms_ && n <= 256) {
    const auto fill = [](float waves) { return waves > 0 ? waves / std::ceil(waves) : 0.0f; };
    if (fill(results[0].wavesCount) < 0.9f)
      for (int i = 1; i < found; ++i)
        if (fill(results[i].wavesCount) >= 0.9f) {
          chosen = i;
          break;
        }
  }
  if (log_plans_) {
    std::fprintf(stderr, "gemm plan n=%lld in=%lld out=%lld%s: chose %d of", static_cast<long long>(n),
                 static_cast<long long>(in), static_cast<long long>(out), f32_out ? " f32" : "", chosen);
    for (int i = 0; i < found; ++i) {
      int tile = 0, splitk = 0;
      std::size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                           &written);
      std::fprintf(stderr, " [%d: waves %.2f tile %d splitk %d]", i, double(results[i].wavesCount), tile, splitk);
    }
    std::fprintf(stderr, "\n");
  }
  const cublasLtMatmulHeuristicResult_t& result = results[chosen];
  p->algo = result.algo;
  slot = std::move(p);
  return *slot;
}

void gemm::run(void* y, const void* x, const void* w, std::int64_t n, std::int64_t in, std::int64_t out, bool f32_out,
               cudaStream_t stream) {
  if (n == 0) return;
  const plan& p = plan_for(n, in, out, f32_out);
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo, workspace_,
                          workspace_bytes_, stream),
           "cublasLtMatmul", n, in, out);
}

}  // namespace pagedkv::llama::cuda
