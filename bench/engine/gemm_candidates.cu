// cuBLASLt's candidates for the CUDA model's products at a prefill step's row count, each timed
// alone: the engine's product (examples/llama/cuda/gemm.cpp: y[n, out] = x[n, in] W[out, in]^T,
// bf16 in, f32 accumulation, bf16 out, a 32 MiB workspace), the heuristic's first 16 candidates,
// median of 20 runs after 3 warm-ups over random inputs. Prints, per shape, each candidate's
// time and TFLOP/s, its tile, stages and split-K, the heuristic's first marked. Built by hand
// (CI builds nothing of it):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/engine/gemm_candidates.cu -lcublasLt -o gemm_candidates
//   ./gemm_candidates ROWS IN:OUT [IN:OUT...]     e.g. ./gemm_candidates 2027 4096:12288 4096:4096 4096:22016 11008:4096
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cublaslt_bench.cuh"

using pagedkv::bench::algo_config;
using pagedkv::bench::fill_random;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROWS IN:OUT [IN:OUT...]\n", argv[0]);
    return 2;
  }
  const long long n = std::atoll(argv[1]);
  cublasLtHandle_t handle;
  PAGEDKV_BENCH_LT_CHECK(cublasLtCreate(&handle));
  const size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  cudaStream_t stream;
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventCreate(&start));
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventCreate(&stop));
  for (int a = 2; a < argc; ++a) {
    long long in = 0, out = 0;
    if (std::sscanf(argv[a], "%lld:%lld", &in, &out) != 2) {
      std::fprintf(stderr, "bad shape %s\n", argv[a]);
      return 2;
    }
    __nv_bfloat16 *x, *w, *y;
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&x, size_t(n * in) * 2));
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&w, size_t(out * in) * 2));
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&y, size_t(n * out) * 2));
    fill_random<<<1024, 256, 0, stream>>>(x, n * in, 1, 1.0f);
    fill_random<<<1024, 256, 0, stream>>>(w, out * in, 2, 1.0f / 64);
    PAGEDKV_BENCH_CUDA_CHECK(cudaGetLastError());
    // The engine's descriptors (gemm.cpp): column-major y^T [out, n] = W [out, in] x^T [in, n].
    cublasLtMatmulDesc_t desc;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtMatrixLayout_t la, lb, ld;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, n, in));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, out, n, out));
    cublasLtMatmulPreference_t pref;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t results[16];
    int found = 0;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 16, results, &found));
    const double flop = 2.0 * double(n) * double(in) * double(out);
    std::printf("== n %lld, in %lld, out %lld: %.1f GFLOP, %d candidates\n", n, in, out, flop * 1e-9, found);
    const float alpha = 1.0f, beta = 0.0f;
    for (int c = 0; c < found; ++c) {
      const cublasLtMatmulAlgo_t& algo = results[c].algo;
      std::vector<float> ms;
      bool ok = true;
      for (int r = 0; r < 23 && ok; ++r) {
        PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(start, stream));
        ok = cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, y, ld, y, ld, &algo, workspace, workspace_bytes,
                            stream) == CUBLAS_STATUS_SUCCESS;
        PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(stop, stream));
        PAGEDKV_BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        PAGEDKV_BENCH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        if (r >= 3) ms.push_back(t);
      }
      if (!ok) {
        std::printf("  %2d failed\n", c);
        continue;
      }
      std::sort(ms.begin(), ms.end());
      const float med = ms[ms.size() / 2];
      std::printf("  %2d%s %8.1f us %6.1f TFLOP/s  algo %d tile %d stages %d splitK %d swizzle %d cluster %d ws %zu\n", c,
                  c == 0 ? "*" : " ", med * 1e3, flop / (med * 1e-3) * 1e-12,
                  algo_config<int>(algo, CUBLASLT_ALGO_CONFIG_ID), algo_config<int>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  algo_config<int>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                  algo_config<int>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), algo_config<int>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                  algo_config<int>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), results[c].workspaceSize);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(y);
    cudaFree(w);
    cudaFree(x);
  }
  return 0;
}
