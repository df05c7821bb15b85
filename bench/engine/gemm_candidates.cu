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

#define CHECK_CUDA(x)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)
#define CHECK_LT(x)                                                                     \
  do {                                                                                  \
    cublasStatus_t s_ = (x);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_));   \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

__global__ void fill_random(__nv_bfloat16* p, long long n, unsigned long long seed, float scale) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long z = seed + (unsigned long long)i * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    p[i] = __float2bfloat16(scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f));
  }
}

template <class T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROWS IN:OUT [IN:OUT...]\n", argv[0]);
    return 2;
  }
  const long long n = std::atoll(argv[1]);
  cublasLtHandle_t handle;
  CHECK_LT(cublasLtCreate(&handle));
  const size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int a = 2; a < argc; ++a) {
    long long in = 0, out = 0;
    if (std::sscanf(argv[a], "%lld:%lld", &in, &out) != 2) {
      std::fprintf(stderr, "bad shape %s\n", argv[a]);
      return 2;
    }
    __nv_bfloat16 *x, *w, *y;
    CHECK_CUDA(cudaMalloc(&x, size_t(n * in) * 2));
    CHECK_CUDA(cudaMalloc(&w, size_t(out * in) * 2));
    CHECK_CUDA(cudaMalloc(&y, size_t(n * out) * 2));
    fill_random<<<1024, 256, 0, stream>>>(x, n * in, 1, 1.0f);
    fill_random<<<1024, 256, 0, stream>>>(w, out * in, 2, 1.0f / 64);
    CHECK_CUDA(cudaGetLastError());
    // The engine's descriptors (gemm.cpp): column-major y^T [out, n] = W [out, in] x^T [in, n].
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtMatrixLayout_t la, lb, ld;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, n, in));
    CHECK_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, out, n, out));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t results[16];
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 16, results, &found));
    const double flop = 2.0 * double(n) * double(in) * double(out);
    std::printf("== n %lld, in %lld, out %lld: %.1f GFLOP, %d candidates\n", n, in, out, flop * 1e-9, found);
    const float alpha = 1.0f, beta = 0.0f;
    for (int c = 0; c < found; ++c) {
      const cublasLtMatmulAlgo_t& algo = results[c].algo;
      std::vector<float> ms;
      bool ok = true;
      for (int r = 0; r < 23 && ok; ++r) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        ok = cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, y, ld, y, ld, &algo, workspace, workspace_bytes,
                            stream) == CUBLAS_STATUS_SUCCESS;
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
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
                  algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_ID), algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                  algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                  algo_attr<int>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), results[c].workspaceSize);
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
