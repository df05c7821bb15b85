#include "gemm.hpp"

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
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_lt(status, "cublasLtMatmulAlgoGetHeuristic", n, in, out);
  if (found == 0) check_lt(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic (no algorithm)", n, in, out);
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
