// NCCL's own all-reduce time on two GPUs of one process, at the message sizes of a TP2 decode step
// (bf16 [tokens, dim]), under whatever NCCL_* variables the environment sets: the tuning sweep of
// issue 24 (run_tp_device.sh runs it once per setting, each in its own process, as NCCL reads its
// variables once). One thread per GPU, as the tensor-parallel backend has; each size timed as the
// mean of 200 in-place all-reduces after 20 warm-ups, by events on rank 0's stream. With
// SWEEP_SYMMETRIC=1 the buffer is NCCL's symmetric memory (ncclMemAlloc, registered with
// ncclCommWindowRegister and NCCL_WIN_COLL_SYMMETRIC: NCCL 2.27 or later), else cudaMalloc's.
// (pagedkv all-reduces in plain buffers: docs/journal/tensor-parallel.md, 12:17 UTC, says why.)
//   nvcc -O2 -std=c++17 -I<nccl include> nccl_sweep.cu -ldl -o nccl_sweep; nccl_sweep DIM TOKENS...
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK(x)                                                             \
  do {                                                                       \
    if (auto e = (x); e != 0) {                                              \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, int(e), __LINE__); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: nccl_sweep DIM TOKENS...\n");
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast on these machines
  void* lib = dlopen("libnccl.so.2", RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "no libnccl.so.2: %s\n", dlerror());
    return 1;
  }
  auto init_all = reinterpret_cast<ncclResult_t (*)(ncclComm_t*, int, const int*)>(dlsym(lib, "ncclCommInitAll"));
  auto all_reduce = reinterpret_cast<ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                                      ncclComm_t, cudaStream_t)>(dlsym(lib, "ncclAllReduce"));
  auto destroy = reinterpret_cast<ncclResult_t (*)(ncclComm_t)>(dlsym(lib, "ncclCommDestroy"));
  auto mem_alloc = reinterpret_cast<ncclResult_t (*)(void**, size_t)>(dlsym(lib, "ncclMemAlloc"));
  auto mem_free = reinterpret_cast<ncclResult_t (*)(void*)>(dlsym(lib, "ncclMemFree"));
  auto window_register = reinterpret_cast<ncclResult_t (*)(ncclComm_t, void*, size_t, void**, int)>(
      dlsym(lib, "ncclCommWindowRegister"));
  auto window_deregister = reinterpret_cast<ncclResult_t (*)(ncclComm_t, void*)>(dlsym(lib, "ncclCommWindowDeregister"));
  const char* sym = std::getenv("SWEEP_SYMMETRIC");
  const bool symmetric = sym && *sym == '1';
  if (symmetric && !(mem_alloc && mem_free && window_register && window_deregister)) {
    std::fprintf(stderr, "SWEEP_SYMMETRIC=1: this NCCL has no symmetric memory (2.27 or later)\n");
    return 1;
  }
  const long dim = std::atol(argv[1]);
  std::vector<long> tokens;
  for (int i = 2; i < argc; ++i) tokens.push_back(std::atol(argv[i]));
  long most = 0;
  for (long t : tokens) most = t > most ? t : most;
  ncclComm_t comms[2];
  const int devices[2] = {0, 1};
  CHECK(init_all(comms, 2, devices));
  std::vector<double> us(tokens.size());
  auto rank = [&](int r) {
    CHECK(cudaSetDevice(r));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* data = nullptr;
    void* window = nullptr;
    const size_t bytes = (size_t(most * dim) * 2 + 4095) / 4096 * 4096;
    if (symmetric) {
      CHECK(mem_alloc(&data, bytes));
      CHECK(window_register(comms[r], data, bytes, &window, 0x01 /* NCCL_WIN_COLL_SYMMETRIC */));
      if (!window) {
        std::fprintf(stderr, "rank %d: ncclCommWindowRegister made no window\n", r);
        std::exit(1);
      }
    } else {
      CHECK(cudaMalloc(&data, bytes));
    }
    CHECK(cudaMemset(data, 0, size_t(most * dim) * 2));  // zeros: sums stay zero, no overflow to inf
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    for (size_t i = 0; i < tokens.size(); ++i) {
      const size_t count = size_t(tokens[i] * dim);
      for (int k = 0; k < 20; ++k) CHECK(all_reduce(data, data, count, ncclBfloat16, ncclSum, comms[r], stream));
      CHECK(cudaEventRecord(start, stream));
      for (int k = 0; k < 200; ++k) CHECK(all_reduce(data, data, count, ncclBfloat16, ncclSum, comms[r], stream));
      CHECK(cudaEventRecord(end, stream));
      CHECK(cudaEventSynchronize(end));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, end));
      if (r == 0) us[i] = 1e3 * ms / 200;
    }
    if (symmetric) {
      CHECK(window_deregister(comms[r], window));
      CHECK(mem_free(data));
    } else {
      CHECK(cudaFree(data));
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  const char* proto = std::getenv("NCCL_PROTO");
  const char* algo = std::getenv("NCCL_ALGO");
  const char* channels = std::getenv("NCCL_MAX_NCHANNELS");
  std::printf("nccl_sweep %sPROTO=%s ALGO=%s MAX_NCHANNELS=%s:", symmetric ? "SYMMETRIC " : "", proto ? proto : "-",
              algo ? algo : "-", channels ? channels : "-");
  for (size_t i = 0; i < tokens.size(); ++i)
    std::printf(" %ld tok (%.0f KiB) %.2f us%s", tokens[i], double(tokens[i] * dim * 2) / 1024, us[i],
                i + 1 < tokens.size() ? ";" : "\n");
  for (int r = 0; r < 2; ++r) {
    CHECK(cudaSetDevice(r));
    destroy(comms[r]);
  }
  return 0;
}
