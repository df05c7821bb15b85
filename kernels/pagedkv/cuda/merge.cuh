// merge_states on the GPU (merge_params.hpp): a row to a group of lanes, a 16-byte chunk of it a
// lane at a time (head_dim 128 in bf16: 16 lanes a row, two rows a warp). Every lane computes the
// row's weights from the LSEs (broadcast loads) while its first chunks of the first four states
// are in flight, then accumulates its chunks of every state in fp32, four states' loads in flight
// at once. Memory-bound: it reads num_states rows for each one it writes.
#pragma once

#include <cstdint>
#include <type_traits>

#include <pagedkv/error.hpp>

#include "../merge_params.hpp"
#include "check.cuh"
#include "dependent_launch.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

inline constexpr int merge_threads = 128;

/// Elements of T that a lane merges at once: a 16-byte chunk where the rows allow it (Vector),
/// else one.
template <class T, bool Vector>
inline constexpr int merge_vec = Vector ? vec16<T> : 1;

/// What a lane loads of one state at once: a 16-byte chunk (Vector), or one element.
template <class T, bool Vector>
using merge_raw_t = std::conditional_t<Vector, uint4, T>;

template <class T, bool Vector>
__device__ __forceinline__ void widen(const merge_raw_t<T, Vector>& raw, float* out) {
  if constexpr (Vector) chunk16_to_float<T>(raw, out);
  else out[0] = to_float(raw);
}

template <class T, bool Vector>
__device__ __forceinline__ void store_from_float(T* p, const float* x) {
  constexpr int vec = merge_vec<T, Vector>;
  if constexpr (Vector) {
    union {
      T e[vec];
      uint4 raw;
    } chunk;
#pragma unroll
    for (int j = 0; j < vec; ++j) chunk.e[j] = from_float<T>(x[j]);
    *reinterpret_cast<uint4*>(p) = chunk.raw;
  } else {
    *p = from_float<T>(x[0]);
  }
}

/// row_lanes: lanes a row, a power of two up to 32 (merge_row_lanes). States: the number of
/// states where it is known at compile time (2, cascade attention's), 0 for p.num_states. The
/// states' chunks stay raw (16 bytes, 4 registers) until they are accumulated, so that a thread
/// needs few registers and an SM runs many (benchmarks.md, "merge_states"; decode-kernel.md,
/// "merge_states registers"). The bounds hold 2 states to 40 registers (12 CTAs an SM) and any
/// count to 64 (8), without spills.
template <class T, bool Vector, int States>
__global__ void __launch_bounds__(merge_threads, States == 2 ? 12 : 8)
    merge_states_kernel(const merge_states_params p, int row_lanes) {
  constexpr int vec = merge_vec<T, Vector>, group = States > 0 ? States : 4;  // loads in flight a lane
  using raw_t = merge_raw_t<T, Vector>;
  wait_for_the_grid_before();
  let_dependents_launch();
  const int lane = int(threadIdx.x) % row_lanes;
  const std::int64_t row = std::int64_t(blockIdx.x) * (merge_threads / row_lanes) + int(threadIdx.x) / row_lanes;
  const bool active = row < p.num_rows;  // no early return: every lane meets the __syncwarp
  const std::int64_t lse_stride = p.lse_stride(), o_stride = p.o_stride();
  const int n = States > 0 ? States : p.num_states, e0 = lane * vec, step = row_lanes * vec;
  const T* in = static_cast<const T*>(p.o_in) + row * p.head_dim;
  raw_t x[group];  // a group of states' chunks at e
  const auto load_group = [&](int e, int s0) {
#pragma unroll
    for (int u = 0; u < group; ++u)
      if (s0 + u < n) x[u] = *reinterpret_cast<const raw_t*>(in + (s0 + u) * o_stride + e);
  };
  if (active && e0 < p.head_dim) load_group(e0, 0);  // in flight beside the LSEs: one round trip, not two
  float m = -INFINITY, sum = 0.0f;
  if (active) {
#pragma unroll
    for (int s = 0; s < n; ++s) m = fmaxf(m, p.lse_in[s * lse_stride + row]);
    const auto weight = [&](int s) {  // unnormalised; an empty state weighs 0
      const float lse = p.lse_in[s * lse_stride + row];
      return lse == -INFINITY ? 0.0f : expf(lse - m);
    };
#pragma unroll
    for (int s = 0; s < n; ++s) sum += weight(s);
    const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out = static_cast<T*>(p.o) + row * p.head_dim;
    for (int e = e0; e < p.head_dim; e += step) {
      float acc[vec] = {};
      for (int s0 = 0; s0 < n; s0 += group) {
        if (e != e0 || s0 != 0) load_group(e, s0);
#pragma unroll
        for (int u = 0; u < group; ++u) {
          if (s0 + u >= n) break;
          const float w = weight(s0 + u) * inv_sum;
          float f[vec];
          widen<T, Vector>(x[u], f);
#pragma unroll
          for (int j = 0; j < vec; ++j) acc[j] += w * f[j];
        }
      }
      store_from_float<T, Vector>(out + e, acc);  // this lane read its chunk of state 0: in place is safe
    }
  }
  __syncwarp();  // every lane has read the LSEs before state 0's may be overwritten
  if (active && lane == 0 && p.lse) p.lse[row] = sum > 0.0f ? m + logf(sum) : -INFINITY;
}

/// Lanes a row: its chunks of `vec` elements, rounded up to a power of two, at most a warp.
inline int merge_row_lanes(std::int32_t head_dim, int vec) {
  const int chunks = (head_dim + vec - 1) / vec;
  int lanes = 1;
  while (lanes < chunks && lanes < 32) lanes *= 2;
  return lanes;
}

}  // namespace detail

/// Merges the attention states of merge_states_params on stream (a dependent launch, like every
/// kernel of the library): o and lse may be state 0's (in place); no other overlap. Throws
/// errc::invalid_argument naming a bad value, cuda_error on a failed launch.
inline void merge_states(const merge_states_params& p, cudaStream_t stream = nullptr) {
  check(p);
  if (p.num_rows == 0) return;
  const auto launch = [&]<class T>() {
    const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    const bool vector = p.head_dim % vec16<T> == 0 && p.o_stride() % vec16<T> == 0 && aligned(p.o_in) && aligned(p.o);
    const int lanes = detail::merge_row_lanes(p.head_dim, vector ? vec16<T> : 1);
    const std::int64_t rows_per_cta = detail::merge_threads / lanes;
    const dim3 grid(unsigned((p.num_rows + rows_per_cta - 1) / rows_per_cta));
    const auto kernel = p.num_states == 2 ? (vector ? detail::merge_states_kernel<T, true, 2>
                                                    : detail::merge_states_kernel<T, false, 2>)
                                          : (vector ? detail::merge_states_kernel<T, true, 0>
                                                    : detail::merge_states_kernel<T, false, 0>);
    detail::launch_dependent(kernel, grid, detail::merge_threads, 0, stream, p, lanes);
  };
  switch (p.o_dtype) {
    case dtype::f32: launch.template operator()<float>(); break;
    case dtype::f16: launch.template operator()<__half>(); break;
    case dtype::bf16: launch.template operator()<__nv_bfloat16>(); break;
    case dtype::fp8_e4m3: break;  // refused by check
  }
}

}  // namespace pagedkv::kernels::cuda
