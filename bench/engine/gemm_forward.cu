// Where a decode product's time goes in the forward (issue 20, helper lt, session 6): llama3-8b's
// products run 8-18% longer under ncu in the engine's step (run e1) than alone on cold weights
// (run lt1, gemm_space.cu). This times, per row count, in captured graphs over `layers` layers'
// own weights (so every product reads its weights from memory, as in a forward):
//  A. each product alone: a graph of that product over every layer's weights;
//  B. the products in forward order (QKV, O, gate/up, down a layer), back to back;
//  C. B with stand-ins for the kernels between them: a norm-like pass (rows x dim: f32 read and
//     written, bf16 written) before QKV and gate/up, an attention-like read of `kv_mb` MiB a layer
//     after QKV, a SwiGLU-like pass (rows x 2 ffn bf16 read, rows x ffn written) before down;
//  D. the stand-ins alone, in the same order.
// A's sum against B says what back-to-back products cost each other; C against B + D what the
// kernels between them cost the products (launch, drain and ramp at each boundary). The engine's
// products (gemm.cpp): bf16, f32 accumulation, bf16 out, the heuristic's first choice, 32 MiB
// workspace. Built by hand (CI builds nothing of it):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/engine/gemm_forward.cu \
//     -lcublasLt -o gemm_forward
//   ./gemm_forward --rows 64,128,200,256 --dim 4096 --qkv 6144 --ffn 14336 --layers 32 --kv-mb 190
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cublaslt_bench.cuh"

namespace {

using pagedkv::bench::fill_random;
using pagedkv::bench::parse_list;
using pagedkv::bench::read_words;

// Stand-in for RMSNorm with the residual add: x (f32) read and written, xb (bf16) written.
__global__ void norm_like(float4* x, __nv_bfloat162* xb, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
    float4 v = x[i];
    v.x *= 0.999f, v.y *= 0.999f, v.z *= 0.999f, v.w *= 0.999f;
    x[i] = v;
    xb[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    xb[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// Stand-in for SwiGLU: gate/up [rows, 2 ffn] read, h [rows, ffn] written.
__global__ void swiglu_like(const __nv_bfloat162* gu, __nv_bfloat162* h, long long rows, long long ffn2) {
  const long long n = rows * ffn2;  // pairs of h
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / ffn2, c = i % ffn2;
    const float2 g = __bfloat1622float2(gu[r * 2 * ffn2 + c]), u = __bfloat1622float2(gu[r * 2 * ffn2 + ffn2 + c]);
    h[i] = __floats2bfloat162_rn(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
  }
}

struct product {
  long long in, out;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<__nv_bfloat16*> weights;  // one a layer
};

struct context {
  cublasLtHandle_t handle;
  void* workspace;
  size_t workspace_bytes = size_t(32) << 20;
  cudaStream_t stream;
  int sms = 0;
};

void plan(const context& c, product& p, long long rows) {
  if (p.desc) {
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatmulDescDestroy(p.desc);
  }
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, p.in, p.out, p.in));
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, p.in, rows, p.in));
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, p.out, rows, p.out));
  cublasLtMatmulPreference_t pref;
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c.workspace_bytes,
                                                sizeof(c.workspace_bytes)));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(c.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) {
    std::fprintf(stderr, "no algorithm for %lld x %lld\n", p.in, p.out);
    std::exit(1);
  }
  p.algo = result.algo;
}

void run(const context& c, const product& p, int layer, const void* x, void* y) {
  const float alpha = 1.0f, beta = 0.0f;
  PAGEDKV_BENCH_LT_CHECK(cublasLtMatmul(c.handle, p.desc, &alpha, p.weights[size_t(layer)], p.a, x, p.b, &beta, y, p.d, y, p.d,
                          &p.algo, c.workspace, c.workspace_bytes, c.stream));
}

/// Milliseconds of one replay of what `body` enqueues, captured once: the median of 7 after one.
template <class Body>
double graph_ms(const context& c, Body body) {
  cudaGraph_t graph;
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
  body();
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamEndCapture(c.stream, &graph));
  cudaGraphExec_t exec;
  PAGEDKV_BENCH_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventCreate(&start));
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < 8; ++r) {
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(start, c.stream));
    PAGEDKV_BENCH_CUDA_CHECK(cudaGraphLaunch(exec, c.stream));
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(stop, c.stream));
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (r > 0) ms.push_back(t);
  }
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventDestroy(start));
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventDestroy(stop));
  PAGEDKV_BENCH_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PAGEDKV_BENCH_CUDA_CHECK(cudaGraphDestroy(graph));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> rows_list = {64, 128, 200, 256};
  long long dim = 4096, qkv = 6144, ffn = 14336, kv_mb = 190;
  int layers = 32;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string arg = argv[a];
    if (arg == "--rows") rows_list = parse_list(argv[a + 1]);
    else if (arg == "--dim") dim = std::atoll(argv[a + 1]);
    else if (arg == "--qkv") qkv = std::atoll(argv[a + 1]);
    else if (arg == "--ffn") ffn = std::atoll(argv[a + 1]);
    else if (arg == "--layers") layers = std::atoi(argv[a + 1]);
    else if (arg == "--kv-mb") kv_mb = std::atoll(argv[a + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--rows R,R..] [--dim D] [--qkv Q] [--ffn F] [--layers L] [--kv-mb M]\n", argv[0]);
      return 2;
    }
  }
  if ((argc - 1) % 2 != 0 || dim % 8 || ffn % 8 || layers < 1) {
    std::fprintf(stderr, "usage: %s [--rows R,R..] [--dim D] [--qkv Q] [--ffn F] [--layers L] [--kv-mb M]\n", argv[0]);
    return 2;
  }
  context c;
  PAGEDKV_BENCH_LT_CHECK(cublasLtCreate(&c.handle));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&c.workspace, c.workspace_bytes));
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  PAGEDKV_BENCH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  c.sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs, L2 %d MiB, cuBLASLt %zu; %d layers, dim %lld, qkv %lld, ffn %lld, kv %lld MiB a layer\n",
              prop.name, c.sms, prop.l2CacheSize >> 20, cublasLtGetVersion(), layers, dim, qkv, ffn, kv_mb);
  product prods[4] = {{dim, qkv}, {dim, dim}, {dim, 2 * ffn}, {ffn, dim}};
  const char* names[4] = {"QKV", "O", "gate/up", "down"};
  double weight_bytes = 0;
  for (product& p : prods)
    for (int l = 0; l < layers; ++l) {
      __nv_bfloat16* w;
      PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&w, size_t(p.in * p.out) * 2));
      fill_random<<<1024, 256, 0, c.stream>>>(w, p.in * p.out, 7 + l * 4 + (&p - prods), 1.0f / 64);
      p.weights.push_back(w);
      weight_bytes += double(p.in * p.out) * 2;
    }
  const long long max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  __nv_bfloat16 *xb, *qkv_out, *att, *gu, *h, *delta;
  float* x;
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&x, size_t(max_rows * dim) * 4));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&xb, size_t(max_rows * dim) * 2));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&qkv_out, size_t(max_rows * qkv) * 2));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&att, size_t(max_rows * dim) * 2));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&gu, size_t(max_rows * 2 * ffn) * 2));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&h, size_t(max_rows * ffn) * 2));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&delta, size_t(max_rows * dim) * 2));
  PAGEDKV_BENCH_CUDA_CHECK(cudaMemset(x, 0, size_t(max_rows * dim) * 4));
  fill_random<<<1024, 256, 0, c.stream>>>(xb, max_rows * dim, 1, 1.0f);
  fill_random<<<1024, 256, 0, c.stream>>>(att, max_rows * dim, 2, 1.0f);
  fill_random<<<1024, 256, 0, c.stream>>>(gu, max_rows * 2 * ffn, 3, 1.0f);
  fill_random<<<1024, 256, 0, c.stream>>>(h, max_rows * ffn, 4, 1.0f);
  const size_t kv_bytes = size_t(kv_mb) << 20;
  std::vector<void*> kv(static_cast<size_t>(layers));
  for (void*& k : kv) {
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&k, kv_bytes));
    PAGEDKV_BENCH_CUDA_CHECK(cudaMemset(k, 0, kv_bytes));
  }
  unsigned* sink;
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&sink, 1 << 20));
  PAGEDKV_BENCH_CUDA_CHECK(cudaGetLastError());
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  std::printf("weights %.2f GB, K/V %.2f GB\n", weight_bytes * 1e-9, double(kv_bytes) * layers * 1e-9);

  const unsigned grid = unsigned(c.sms * 8);
  const auto norm = [&](long long rows) {
    norm_like<<<grid, 256, 0, c.stream>>>(reinterpret_cast<float4*>(x), reinterpret_cast<__nv_bfloat162*>(xb),
                                          rows * dim / 4);
  };
  const auto attention = [&](int l) {
    read_words<<<grid, 512, 0, c.stream>>>(static_cast<const uint4*>(kv[size_t(l)]), (long long)(kv_bytes / 16), sink);
  };
  const auto swiglu = [&](long long rows) {
    swiglu_like<<<grid, 256, 0, c.stream>>>(reinterpret_cast<const __nv_bfloat162*>(gu),
                                            reinterpret_cast<__nv_bfloat162*>(h), rows, ffn / 2);
  };
  const void* inputs[4] = {xb, att, xb, h};
  void* outputs[4] = {qkv_out, delta, gu, delta};
  std::printf("\n%5s | %-44s | %9s | %9s %6s | %11s | %9s | %9s\n", "rows", "A: each product alone over the layers (ms)",
              "A sum", "B: order", "B/A", "C: between", "D: alone", "C-(B+D)");
  for (const long long rows : rows_list) {
    for (product& p : prods) plan(c, p, rows);
    double alone[4], sum = 0;
    for (int i = 0; i < 4; ++i) {
      alone[i] = graph_ms(c, [&] {
        for (int l = 0; l < layers; ++l) run(c, prods[i], l, inputs[i], outputs[i]);
      });
      sum += alone[i];
    }
    const double in_order = graph_ms(c, [&] {
      for (int l = 0; l < layers; ++l)
        for (int i = 0; i < 4; ++i) run(c, prods[i], l, inputs[i], outputs[i]);
    });
    const double with_between = graph_ms(c, [&] {
      for (int l = 0; l < layers; ++l) {
        norm(rows);
        run(c, prods[0], l, inputs[0], outputs[0]);
        attention(l);
        run(c, prods[1], l, inputs[1], outputs[1]);
        norm(rows);
        run(c, prods[2], l, inputs[2], outputs[2]);
        swiglu(rows);
        run(c, prods[3], l, inputs[3], outputs[3]);
      }
    });
    const double between = graph_ms(c, [&] {
      for (int l = 0; l < layers; ++l) {
        norm(rows);
        attention(l);
        norm(rows);
        swiglu(rows);
      }
    });
    PAGEDKV_BENCH_CUDA_CHECK(cudaGetLastError());
    char each[64];
    std::snprintf(each, sizeof(each), "%.3f %.3f %.3f %.3f", alone[0], alone[1], alone[2], alone[3]);
    std::printf("%5lld | %-44s | %9.3f | %9.3f %5.3fx | %11.3f | %9.3f | %+9.3f\n", rows, each, sum, in_order,
                in_order / sum, with_between, between, with_between - in_order - between);
    std::printf("      per layer, us: %s %.1f, %s %.1f, %s %.1f, %s %.1f\n", names[0], 1e3 * alone[0] / layers, names[1],
                1e3 * alone[1] / layers, names[2], 1e3 * alone[2] / layers, names[3], 1e3 * alone[3] / layers);
    std::fflush(stdout);
  }
  return 0;
}
