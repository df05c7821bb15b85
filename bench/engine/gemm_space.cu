// cuBLASLt's configurable algorithm space for the CUDA model's decode products, each candidate
// timed on cold weights against the heuristic's choice and the read ceiling (issue 20, helper
// lt, session 6). The engine's product (examples/llama/cuda/gemm.cpp): y[n, out] =
// x[n, in] W[out, in]^T, bf16 in, f32 accumulation, a bf16 (or f32, ":f32") output, a 32 MiB
// workspace.
//
// For each shape and row count:
//  - the space: every algorithm id cuBLASLt lists for the types (cublasLtMatmulAlgoGetIds), each
//    with every tile and stages id its capabilities list, split-K of 1, 2, 3, 4, 5, 6, 8, 12 and
//    16 where supported, each reduction scheme its mask allows; those cublasLtMatmulAlgoCheck
//    accepts within the workspace. The best of these (--expand) again with each CTA swizzle,
//    custom option and cluster shape (1x1, 2x1, 1x2, 4x1, 1x4, 2x2) cublasLtMatmulAlgoCheck
//    accepts. Plus the heuristic's first 32 candidates as it returns them.
//  - timing: each candidate in a captured graph of launches over several copies of the weights
//    (their bytes at least 3x the L2, so every launch reads its weights from memory, as in a
//    forward); a screen of one replay each in a fixed shuffled order (--budget seconds a (shape,
//    rows), half as much for the expansion), then the best --refine (and the heuristic's first
//    8) again as the median of 7 replays. Time a launch = replay / launches.
//  - checked: every refined candidate's output against the heuristic's first choice's,
//    ||y - y0|| / ||y0|| (<= 1e-2 with bf16 outputs; more is printed and the candidate dropped).
// Prints, per (shape, rows): the heuristic's first choice, the best of its first 8, the best of
// the space (each as us, GB/s of weights + activations, % of the read ceiling measured by this
// binary in this run, and its config), and writes the best --top distinct configs per (shape,
// rows) to --out as lines "in out f32_out rows algo tile stages splitk reduction swizzle custom
// inner cluster us" (run lt2 fed them to the engine's whole-step tuning, for no gain:
// docs/journal/engine-gpu.md, session 6). Tile, stages and cluster ids are cublasLt.h's enums.
// Built by hand (CI builds nothing of it):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/engine/gemm_space.cu \
//     -lcublasLt -o gemm_space
//   ./gemm_space --rows 64,128,200,256 --out cand.txt 4096:6144 4096:4096 14336:4096 4096:28672
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cublaslt_bench.cuh"

namespace {

using pagedkv::bench::fill_random;
using pagedkv::bench::parse_list;
using pagedkv::bench::read_words;

struct config {
  int algo = 0;
  unsigned tile = 0, stages = 0;
  int splitk = 1;
  unsigned reduction = 0, swizzle = 0, custom = 0;
  unsigned short inner = 0, cluster = 0;
  auto tie() const { return std::tie(algo, tile, stages, splitk, reduction, swizzle, custom, inner, cluster); }
  bool operator<(const config& o) const { return tie() < o.tie(); }
};

config config_of(const cublasLtMatmulAlgo_t& a) {
  config c;
  c.algo = pagedkv::bench::algo_config<int>(a, CUBLASLT_ALGO_CONFIG_ID);
  c.tile = pagedkv::bench::algo_config<unsigned>(a, CUBLASLT_ALGO_CONFIG_TILE_ID);
  c.stages = pagedkv::bench::algo_config<unsigned>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID);
  c.splitk = pagedkv::bench::algo_config<int>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  c.reduction = pagedkv::bench::algo_config<unsigned>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  c.swizzle = pagedkv::bench::algo_config<unsigned>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
  c.custom = pagedkv::bench::algo_config<unsigned>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
  c.inner = pagedkv::bench::algo_config<unsigned short>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID);
  c.cluster = pagedkv::bench::algo_config<unsigned short>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  return c;
}

std::string describe(const config& c) {
  char s[160];
  std::snprintf(s, sizeof(s), "algo %d tile %u stages %u splitK %d red %u swz %u custom %u inner %u cluster %u", c.algo,
                c.tile, c.stages, c.splitk, c.reduction, c.swizzle, c.custom, unsigned(c.inner), unsigned(c.cluster));
  return s;
}

template <class T>
std::vector<T> cap_array(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {T{}};
  std::vector<T> v(bytes / sizeof(T));
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), bytes, &written) != CUBLAS_STATUS_SUCCESS) return {T{}};
  v.resize(written / sizeof(T));
  if (v.empty()) v.push_back(T{});
  return v;
}

template <class T>
T cap_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

struct problem {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cudaDataType_t out_type;
  void* workspace;
  size_t workspace_bytes;
  cudaStream_t stream;
  std::vector<__nv_bfloat16*> weights;  // copies
  __nv_bfloat16* x;
  void* y;
  long long n, in, out;
  bool f32;
};

bool build(const problem& p, const config& c, cublasLtMatmulAlgo_t& algo) {
  if (cublasLtMatmulAlgoInit(p.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, p.out_type, p.out_type,
                             c.algo, &algo) != CUBLAS_STATUS_SUCCESS)
    return false;
  const auto set = [&](cublasLtMatmulAlgoConfigAttributes_t attr, const void* v, size_t size) {
    return cublasLtMatmulAlgoConfigSetAttribute(&algo, attr, v, size) == CUBLAS_STATUS_SUCCESS;
  };
  if (!set(CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof(c.tile)) ||
      !set(CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof(c.stages)) ||
      !set(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splitk, sizeof(c.splitk)) ||
      !set(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.reduction, sizeof(c.reduction)) ||
      !set(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle, sizeof(c.swizzle)) ||
      !set(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof(c.custom)) ||
      !set(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof(c.inner)) ||
      !set(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof(c.cluster)))
    return false;
  cublasLtMatmulHeuristicResult_t result{};
  if (cublasLtMatmulAlgoCheck(p.handle, p.desc, p.a, p.b, p.d, p.d, &algo, &result) != CUBLAS_STATUS_SUCCESS)
    return false;
  return result.workspaceSize <= p.workspace_bytes;
}

bool launch(const problem& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* w) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(p.handle, p.desc, &alpha, w, p.a, p.x, p.b, &beta, p.y, p.d, p.y, p.d, &algo, p.workspace,
                        p.workspace_bytes, p.stream) == CUBLAS_STATUS_SUCCESS;
}

/// Microseconds a launch: the median of `replays` replays of a graph of `launches` launches over
/// the weight copies in turn, after one; a negative value where it did not run.
double time_us(const problem& p, const cublasLtMatmulAlgo_t& algo, int launches, int replays, cudaEvent_t start,
               cudaEvent_t stop) {
  cudaGraph_t graph = nullptr;
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamBeginCapture(p.stream, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  for (int i = 0; i < launches && ok; ++i) ok = launch(p, algo, p.weights[size_t(i) % p.weights.size()]);
  const cudaError_t ended = cudaStreamEndCapture(p.stream, &graph);
  if (!ok || ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return -1;
  }
  std::vector<float> ms;
  for (int r = 0; r <= replays; ++r) {
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(start, p.stream));
    PAGEDKV_BENCH_CUDA_CHECK(cudaGraphLaunch(exec, p.stream));
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(stop, p.stream));
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    PAGEDKV_BENCH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (r > 0) ms.push_back(t);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return 1e3 * double(ms[ms.size() / 2]) / launches;
}

/// The output of `algo` over the first weight copy (y poisoned with NaN first), as floats on the
/// host; empty where it did not run.
std::vector<float> output_of(const problem& p, const cublasLtMatmulAlgo_t& algo) {
  PAGEDKV_BENCH_CUDA_CHECK(cudaMemsetAsync(p.y, 0xff, size_t(p.n * p.out) * (p.f32 ? 4 : 2), p.stream));
  if (!launch(p, algo, p.weights[0])) return {};
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamSynchronize(p.stream));
  std::vector<float> y(size_t(p.n * p.out));
  if (p.f32) {
    PAGEDKV_BENCH_CUDA_CHECK(cudaMemcpy(y.data(), p.y, y.size() * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<__nv_bfloat16> h(y.size());
    PAGEDKV_BENCH_CUDA_CHECK(cudaMemcpy(h.data(), p.y, h.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); ++i) y[i] = __bfloat162float(h[i]);
  }
  return y;
}

/// ||y - y0|| / ||y0|| of the output of `algo` against `reference` (host copies); 1e30 where either
/// did not run or y is not finite.
double rel_error(const problem& p, const cublasLtMatmulAlgo_t& algo, const std::vector<float>& reference) {
  const std::vector<float> y = output_of(p, algo);
  if (y.empty() || y.size() != reference.size()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) return 1e30;
    num += double(y[i] - reference[i]) * double(y[i] - reference[i]);
    den += double(reference[i]) * double(reference[i]);
  }
  return den > 0 ? std::sqrt(num / den) : 1e30;
}

struct timed {
  config c;
  cublasLtMatmulAlgo_t algo;
  double us = -1;
  int heuristic = -1;  // index among the heuristic's candidates, or -1
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> rows = {64, 128, 200, 256};
  int expand = 24, refine = 12, top = 4;
  double budget_s = 6;  // screening time a (shape, rows) at most, and half of it for the expansion
  const char* out_path = nullptr;
  std::vector<std::tuple<long long, long long, bool>> shapes;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--rows" && a + 1 < argc) rows = parse_list(argv[++a]);
    else if (arg == "--expand" && a + 1 < argc) expand = std::atoi(argv[++a]);
    else if (arg == "--refine" && a + 1 < argc) refine = std::atoi(argv[++a]);
    else if (arg == "--top" && a + 1 < argc) top = std::atoi(argv[++a]);
    else if (arg == "--budget" && a + 1 < argc) budget_s = std::atof(argv[++a]);
    else if (arg == "--out" && a + 1 < argc) out_path = argv[++a];
    else {
      long long in = 0, out = 0;
      char f32[8] = {};
      const int got = std::sscanf(argv[a], "%lld:%lld:%7s", &in, &out, f32);
      if (got < 2 || in < 1 || out < 1) {
        std::fprintf(stderr, "usage: %s [--rows R,R..] [--expand N] [--refine N] [--top N] [--budget S] [--out FILE] IN:OUT[:f32]...\n", argv[0]);
        return 2;
      }
      shapes.emplace_back(in, out, got == 3 && std::strcmp(f32, "f32") == 0);
    }
  }
  FILE* out_file = out_path ? std::fopen(out_path, "w") : nullptr;
  if (out_path && !out_file) {
    std::fprintf(stderr, "cannot write %s\n", out_path);
    return 2;
  }
  if (out_file)
    std::fprintf(out_file, "# gemm_space: in out f32_out rows algo tile stages splitk reduction swizzle custom inner cluster us\n");

  cudaDeviceProp prop{};
  PAGEDKV_BENCH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MiB, cuBLASLt %zu\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              cublasLtGetVersion());
  cudaStream_t stream;
  PAGEDKV_BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventCreate(&start));
  PAGEDKV_BENCH_CUDA_CHECK(cudaEventCreate(&stop));

  // the read ceiling, as the engine measures it
  double ceiling = 0;
  {
    const size_t bytes = size_t(512) << 20;
    void *buf, *sink;
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&buf, bytes));
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&sink, 1 << 20));
    PAGEDKV_BENCH_CUDA_CHECK(cudaMemset(buf, 0, bytes));
    std::vector<float> ms;
    for (int r = 0; r < 11; ++r) {
      PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(start, stream));
      read_words<<<unsigned(prop.multiProcessorCount * 8), 512, 0, stream>>>(static_cast<const uint4*>(buf),
                                                                              (long long)(bytes / 16),
                                                                              static_cast<unsigned*>(sink));
      PAGEDKV_BENCH_CUDA_CHECK(cudaGetLastError());
      PAGEDKV_BENCH_CUDA_CHECK(cudaEventRecord(stop, stream));
      PAGEDKV_BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      PAGEDKV_BENCH_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (r > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    ceiling = double(bytes) / (1e-3 * ms[ms.size() / 2]);
    cudaFree(buf);
    cudaFree(sink);
  }
  std::printf("read ceiling %.0f GB/s\n", ceiling * 1e-9);

  cublasLtHandle_t handle;
  PAGEDKV_BENCH_LT_CHECK(cublasLtCreate(&handle));
  const size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));

  std::printf("\n%-16s %5s | %-26s | %-26s | %-26s | %s\n", "shape in:out", "rows", "heuristic's first",
              "best of heuristic's 8", "best of the space", "space best's config");
  for (const auto& [in, out, f32] : shapes) {
    const double w_bytes = double(in) * double(out) * 2;
    const int copies = std::max(2, int(std::ceil(3.0 * prop.l2CacheSize / w_bytes)));
    const int launches = std::max(copies, 8) / copies * copies;
    problem p{};
    p.handle = handle;
    p.workspace = workspace;
    p.workspace_bytes = workspace_bytes;
    p.stream = stream;
    p.in = in;
    p.out = out;
    p.f32 = f32;
    p.out_type = f32 ? CUDA_R_32F : CUDA_R_16BF;
    const long long max_rows = *std::max_element(rows.begin(), rows.end());
    for (int c = 0; c < copies; ++c) {
      __nv_bfloat16* w;
      PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&w, size_t(in * out) * 2));
      fill_random<<<1024, 256, 0, stream>>>(w, in * out, 2 + c, 1.0f / 64);
      p.weights.push_back(w);
    }
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&p.x, size_t(max_rows * in) * 2));
    PAGEDKV_BENCH_CUDA_CHECK(cudaMalloc(&p.y, size_t(max_rows * out) * 4));
    fill_random<<<1024, 256, 0, stream>>>(p.x, max_rows * in, 1, 1.0f);
    PAGEDKV_BENCH_CUDA_CHECK(cudaGetLastError());
    PAGEDKV_BENCH_CUDA_CHECK(cudaStreamSynchronize(stream));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, in, out, in));
    int ids[512];
    int num_ids = 0;
    PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, p.out_type,
                                      p.out_type, 512, ids, &num_ids));
    for (const long long n : rows) {
      const auto t0 = std::chrono::steady_clock::now();
      p.n = n;
      PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, in, n, in));
      PAGEDKV_BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, p.out_type, out, n, out));
      const double bytes = w_bytes + double(n) * double(in) * 2 + double(n) * double(out) * (f32 ? 4 : 2);
      // the heuristic's candidates
      cublasLtMatmulPreference_t pref;
      PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof(workspace_bytes)));
      cublasLtMatmulHeuristicResult_t results[32];
      int found = 0;
      PAGEDKV_BENCH_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 32, results, &found));
      cublasLtMatmulPreferenceDestroy(pref);
      if (found == 0) {  // no first choice to time or check the space against
        std::printf("%lld:%lld rows %lld: the heuristic found no algorithm\n", in, out, n);
        cublasLtMatrixLayoutDestroy(p.d);
        cublasLtMatrixLayoutDestroy(p.b);
        continue;
      }
      std::vector<timed> all;
      std::map<config, size_t> seen;
      for (int h = 0; h < found; ++h) {
        timed t{config_of(results[h].algo), results[h].algo, -1, h};
        if (seen.emplace(t.c, all.size()).second) all.push_back(t);
      }
      const size_t heuristic_count = all.size();
      // the space: every id x tile x stages x split-K x reduction scheme the capabilities list
      long long checked = 0;
      for (int i = 0; i < num_ids; ++i) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > 2 * budget_s) {
          std::printf("    enumeration stopped at id %d of %d (time)\n", i, num_ids);
          break;
        }
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, p.out_type,
                                   p.out_type, ids[i], &algo) != CUBLAS_STATUS_SUCCESS)
          continue;
        const auto tiles = cap_array<unsigned>(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
        const auto stages = cap_array<unsigned>(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
        const int splitk_support = cap_value<int>(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT);
        const unsigned reduction_mask = cap_value<unsigned>(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
        for (const unsigned tile : tiles)
          for (const unsigned st : stages) {
            config base;
            base.algo = ids[i];
            base.tile = tile;
            base.stages = st;
            ++checked;
            cublasLtMatmulAlgo_t built;
            if (!build(p, base, built)) continue;  // split-K only where the tile and stages run at all
            if (seen.emplace(base, all.size()).second) all.push_back({base, built, -1, -1});
            if (!splitk_support) continue;
            for (const int splitk : {2, 3, 4, 5, 6, 8, 12, 16}) {
              if (in / splitk < 256) continue;
              for (const unsigned red : {1u, 2u, 4u}) {
                if (!(reduction_mask & red)) continue;
                config c = base;
                c.splitk = splitk;
                c.reduction = red;
                ++checked;
                if (seen.count(c) || !build(p, c, built)) continue;
                seen.emplace(c, all.size());
                all.push_back({c, built, -1, -1});
              }
            }
          }
      }
      // screened in a fixed pseudo-random order, so that a screen the budget cuts short samples
      // the whole space rather than its first algorithm ids
      {
        unsigned long long z = 0x9e3779b97f4a7c15ULL;
        for (size_t i = all.size(); i > heuristic_count + 1; --i) {
          z ^= z << 13, z ^= z >> 7, z ^= z << 17;
          std::swap(all[i - 1], all[heuristic_count + size_t(z % (i - heuristic_count))]);
        }
      }
      const size_t space = all.size();
      // screen: one replay of `launches` each, within the budget
      size_t screened = 0;
      const auto screen = [&](size_t from, double seconds) {
        const auto from_time = std::chrono::steady_clock::now();
        for (size_t i = from; i < all.size(); ++i) {
          if (std::chrono::duration<double>(std::chrono::steady_clock::now() - from_time).count() > seconds &&
              all[i].heuristic < 0)
            break;
          ++screened;
          all[i].us = time_us(p, all[i].algo, launches, 1, start, stop);
        }
      };
      const double enumerate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      screen(0, budget_s);
      const auto by_time = [](const timed& a, const timed& b) {
        if ((a.us > 0) != (b.us > 0)) return a.us > 0;
        return a.us < b.us;
      };
      std::vector<timed> ranked = all;
      std::sort(ranked.begin(), ranked.end(), by_time);
      // expand the best: swizzle, custom options, cluster shapes
      const size_t before_expand = all.size();
      for (int e = 0; e < expand && e < int(ranked.size()) && ranked[size_t(e)].us > 0; ++e) {
        const config base = ranked[size_t(e)].c;
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, p.out_type,
                                   p.out_type, base.algo, &algo) != CUBLAS_STATUS_SUCCESS)
          continue;
        const unsigned swizzle_max = cap_value<unsigned>(algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) ? 1 : 0;
        const int custom_max = std::min(cap_value<int>(algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX), 7);
        for (unsigned swz = 0; swz <= swizzle_max; ++swz)
          for (int custom = 0; custom <= custom_max; ++custom)
            for (const unsigned short cluster : {0, 2, 3, 5, 4, 8, 6}) {
              config c = base;
              c.swizzle = swz;
              c.custom = unsigned(custom);
              c.cluster = cluster;
              cublasLtMatmulAlgo_t built;
              if (seen.count(c) || !build(p, c, built)) continue;
              seen.emplace(c, all.size());
              all.push_back({c, built, -1, -1});
            }
      }
      screen(before_expand, budget_s / 2);
      ranked = all;
      std::sort(ranked.begin(), ranked.end(), by_time);
      // refine the best and the heuristic's first 8: median of 7, and each checked against the first
      std::vector<float> reference = output_of(p, results[0].algo);
      std::vector<timed> refined;
      for (const timed& t : ranked)
        if (t.us > 0 && (int(refined.size()) < refine || (t.heuristic >= 0 && t.heuristic < 8))) refined.push_back(t);
      for (const timed& t : all)
        if (t.heuristic >= 0 && t.heuristic < 8 && t.us <= 0) refined.push_back(t);  // heuristic ones that failed
      for (timed& t : refined) {
        t.us = time_us(p, t.algo, launches, 7, start, stop);
        const double err = rel_error(p, t.algo, reference);
        if (err > 1e-2) {
          std::printf("  %s: output off the heuristic's by %.3g: dropped\n", describe(t.c).c_str(), err);
          t.us = -1;
        }
      }
      std::sort(refined.begin(), refined.end(), by_time);
      const auto gbs = [&](double us) { return bytes / (us * 1e-6) * 1e-9; };
      const auto cell = [&](double us) {
        char s[64];
        if (us <= 0) std::snprintf(s, sizeof(s), "%s", "failed");
        else std::snprintf(s, sizeof(s), "%6.1f us %5.0f GB/s %3.0f%%", us, gbs(us), 100 * bytes / (us * 1e-6) / ceiling);
        return std::string(s);
      };
      double first = -1, best8 = -1;
      for (const timed& t : refined) {
        if (t.heuristic == 0) first = t.us;
        if (t.heuristic >= 0 && t.heuristic < 8 && t.us > 0 && (best8 < 0 || t.us < best8)) best8 = t.us;
      }
      char shape[32];
      std::snprintf(shape, sizeof(shape), "%lld:%lld%s", in, out, f32 ? ":f32" : "");
      std::printf("%-16s %5lld | %-26s | %-26s | %-26s | %s\n", shape, n, cell(first).c_str(), cell(best8).c_str(),
                  cell(refined.empty() ? -1 : refined[0].us).c_str(), refined.empty() ? "" : describe(refined[0].c).c_str());
      std::printf("    %d ids; space %zu configs accepted of %lld checked (%.1f s), %zu after expansion, %zu screened "
                  "(%zu ran), %.1f s in all; heuristic first: %s\n",
                  num_ids, space, checked, enumerate_s, all.size(), screened,
                  size_t(std::count_if(all.begin(), all.end(), [](const timed& t) { return t.us > 0; })),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  describe(config_of(results[0].algo)).c_str());
      for (size_t i = 0; i < refined.size() && i < 6; ++i)
        std::printf("    #%zu %s  heur %2d  %s\n", i, cell(refined[i].us).c_str(), refined[i].heuristic,
                    describe(refined[i].c).c_str());
      int written = 0;
      for (const timed& t : refined) {
        if (written >= top || t.us <= 0) break;
        if (out_file)
          std::fprintf(out_file, "%lld %lld %d %lld %d %u %u %d %u %u %u %u %u %.2f\n", in, out, int(f32), n, t.c.algo,
                       t.c.tile, t.c.stages, t.c.splitk, t.c.reduction, t.c.swizzle, t.c.custom, unsigned(t.c.inner),
                       unsigned(t.c.cluster), t.us);
        ++written;
      }
      std::fflush(stdout);
      if (out_file) std::fflush(out_file);
      cublasLtMatrixLayoutDestroy(p.d);
      cublasLtMatrixLayoutDestroy(p.b);
    }
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatmulDescDestroy(p.desc);
    for (auto* w : p.weights) cudaFree(w);
    cudaFree(p.x);
    cudaFree(p.y);
  }
  if (out_file) std::fclose(out_file);
  return 0;
}
