// What the GPU benchmarks share: CUDA-event timing of a CUDA graph of back-to-back launches (host
// launch overhead stays out of the numbers, the GPU is never idle between launches), and main.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/cuda/device_buffer.cuh>

struct event_timer {
  cudaEvent_t start, stop;
  event_timer() {
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&start));
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~event_timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  /// Seconds from start to stop, once stop has happened.
  double seconds() {
    PAGEDKV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) * 1e-3;
  }
};

/// Sets of `bytes_per_set` that touch at least 512 MB together (1 to 64 of them), so that small
/// shapes are not served from the 50 MB L2, and a graph of at least 8 launches that visits each
/// set equally often.
struct rotation {
  int sets, reps;
  explicit rotation(double bytes_per_set)
      : sets(int(std::clamp(std::ceil(512e6 / bytes_per_set), 1.0, 64.0))), reps(sets * std::max(1, (8 + sets - 1) / sets)) {}
};

/// Times run(0) .. run(count - 1), each once every iteration of `state` (so that drift hits all
/// alike; the iteration's manual time is their mean). Returns each one's mean seconds.
inline std::vector<double> seconds_of_each(benchmark::State& state, int count, const std::function<void(int)>& run) {
  event_timer timer;
  std::vector<double> total(std::size_t(count), 0.0);
  double iters = 0;
  for (auto _ : state) {
    double sum = 0;
    for (int which = 0; which < count; ++which) {
      PAGEDKV_CUDA_CHECK(cudaEventRecord(timer.start));
      run(which);
      PAGEDKV_CUDA_CHECK(cudaEventRecord(timer.stop));
      const double s = timer.seconds();
      PAGEDKV_CUDA_CHECK(cudaGetLastError());
      total[std::size_t(which)] += s;
      sum += s;
    }
    state.SetIterationTime(sum / count);
    ++iters;
  }
  for (double& t : total) t = iters > 0 ? t / iters : 0.0;
  return total;
}

/// Runs launch(k, stream) for k = 0 .. reps - 1 once (module load, every input set once), captures
/// the same calls as one CUDA graph (the caller rotates its inputs by k), then times one replay
/// each iteration of `state` (manual time). Returns the mean seconds a launch.
inline double seconds_per_launch(benchmark::State& state, int reps,
                                 const std::function<void(int, cudaStream_t)>& launch) {
  cudaStream_t stream;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int k = 0; k < reps; ++k) launch(k, stream);
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < reps; ++k) launch(k, stream);
  PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  event_timer timer;
  double total = 0;
  std::int64_t launches = 0;
  for (auto _ : state) {
    PAGEDKV_CUDA_CHECK(cudaEventRecord(timer.start, stream));
    PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PAGEDKV_CUDA_CHECK(cudaEventRecord(timer.stop, stream));
    const double sec = timer.seconds();
    state.SetIterationTime(sec);
    total += sec;
    launches += reps;
  }
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return launches ? total / double(launches) : 0.0;
}

/// The main of a GPU benchmark binary: registers its benchmarks and runs them, or says that there
/// is nothing to measure where there is no GPU.
inline int run_gpu_benchmarks(const char* binary, int argc, char** argv, void (*register_all)()) {
  if (!pagedkv::kernels::cuda::have_gpu()) {
    std::printf("%s: no CUDA device, nothing to measure\n", binary);
    return 0;
  }
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
