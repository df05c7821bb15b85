// The one place where runtime values become compile-time ones. Each list below is what gets
// compiled; a value outside it is an error that names the value and the list, never a silent
// fallback. The default lists keep CI's nvcc build short; PAGEDKV_KERNELS_FULL_SWEEP compiles
// every supported value (what the GPU tests and benchmarks use).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include <pagedkv/error.hpp>

#include "../attention_params.hpp"
#include "../decode_plan.hpp"
#include "decode_cuda_core.cuh"
#include "decode_mma.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {

template <int... Values>
struct value_list {
  static std::string describe() {
    std::ostringstream s;
    ((s << Values << ' '), ...);
    std::string r = s.str();
    if (!r.empty()) r.pop_back();
    return r;
  }
};

#if defined(PAGEDKV_KERNELS_FULL_SWEEP) && PAGEDKV_KERNELS_FULL_SWEEP
using decode_head_dims = value_list<64, 80, 96, 128, 256>;
/// Group sizes round up to a bucket: the CTA computes the bucket's heads and stores group_size().
using decode_group_buckets = value_list<1, 2, 4, 8, 16>;
inline constexpr bool decode_all_kv_dtypes = true;
#else
using decode_head_dims = value_list<64, 128>;
using decode_group_buckets = value_list<1, 2, 8, 16>;
inline constexpr bool decode_all_kv_dtypes = false;  // bf16 and fp8 e4m3 only
#endif
/// Largest GQA group of the tensor-core body, which takes every group up to it, over 16-bit KV and
/// over fp8 KV under a 16-bit q: faster than the CUDA-core body for every group, MHA included
/// (benchmarks.md, decode table and "fp8 e4m3 KV against bf16 KV"; decode-kernel.md, "Tensor-core
/// body").
inline constexpr int decode_mma_max_group = 16;

namespace detail {

/// Calls f.template operator()<V>() for the V in Values equal to value; false if none is.
template <class F, int... Values>
bool visit_exact(int value, value_list<Values...>, F&& f) {
  return ((value == Values ? (f.template operator()<Values>(), true) : false) || ...);
}
/// Same, for the smallest V >= value (Values ascending).
template <class F, int... Values>
bool visit_bucket(int value, value_list<Values...>, F&& f) {
  bool done = false;
  ((!done && value <= Values ? (f.template operator()<Values>(), done = true) : false), ...);
  return done;
}

}  // namespace detail

/// Decode for KV element type TKV: dispatches head_dim and the group bucket.
template <class TKV>
decode_plan launch_decode_kv(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                             cudaStream_t stream, bool launch) {
  decode_plan plan;
  bool group_ok = true;
  const bool dim_ok = detail::visit_exact(p.head_dim, decode_head_dims{}, [&]<int D>() {
    // Tensor cores (decode_mma.cuh): 16-bit KV, and fp8 KV under a 16-bit q.
    const bool mma_group = p.group_size() <= decode_mma_max_group;
    if constexpr (sizeof(TKV) == 2) {
      // Every group up to 16 runs on tensor cores; no CUDA-core body is compiled for 16-bit KV.
      if (mma_group) plan = launch_decode_mma<TKV, TKV, D>(p, workspace, workspace_bytes, stream, launch);
      else group_ok = false;
    } else {
      if constexpr (std::is_same_v<TKV, __nv_fp8_e4m3>) {
        // Under an f16 q in every build, as under a bf16 one: the default build compiled these
        // kernels already (a run-time condition does not keep a template from being instantiated).
        if (mma_group && p.q_dtype == dtype::bf16) {
          plan = launch_decode_mma<__nv_bfloat16, TKV, D>(p, workspace, workspace_bytes, stream, launch);
          return;
        }
        if (mma_group && p.q_dtype == dtype::f16) {
          plan = launch_decode_mma<__half, TKV, D>(p, workspace, workspace_bytes, stream, launch);
          return;
        }
      }
      group_ok = detail::visit_bucket(p.group_size(), decode_group_buckets{}, [&]<int G>() {
        plan = launch_decode<TKV, D, G>(p, workspace, workspace_bytes, stream, launch);
      });
    }
  });
  if (!dim_ok)
    pagedkv::detail::fail(errc::invalid_argument, "decode: head_dim ", p.head_dim,
                          " is not compiled (compiled: ", decode_head_dims::describe(), ")");
  if (!group_ok)
    pagedkv::detail::fail(errc::invalid_argument, "decode: GQA group size ", p.group_size(),
                          " is not compiled (largest bucket of: ", decode_group_buckets::describe(), ")");
  return plan;
}

#if defined(PAGEDKV_DECODE_SEPARATE_INSTANTIATION)
// Builds that compile the four KV types in separate translation units (in parallel) define this
// and instantiate launch_decode_kv<T> once each; see kernels/decode_instantiation.cu.in.
#define PAGEDKV_DECODE_EXTERN(T)                                                                     \
  extern template decode_plan launch_decode_kv<T>(const attention_params&, void*, std::size_t, cudaStream_t, bool);
PAGEDKV_DECODE_EXTERN(float)
PAGEDKV_DECODE_EXTERN(__half)
PAGEDKV_DECODE_EXTERN(__nv_bfloat16)
PAGEDKV_DECODE_EXTERN(__nv_fp8_e4m3)
#undef PAGEDKV_DECODE_EXTERN
#endif

namespace detail {

inline void check_decode(const attention_params& p) {
  check(p);
  if (p.q_indptr) pagedkv::detail::fail(errc::invalid_argument, "decode takes one query token a sequence: q_indptr must be nullptr");
  if (p.num_seqs == 0) return;
  const std::size_t es = size_of(p.kv_dtype);
  const auto misaligned = [&](std::int64_t elems) { return (std::size_t(elems) * es) % 16 != 0; };
  if (reinterpret_cast<std::uintptr_t>(p.k) % 16 || reinterpret_cast<std::uintptr_t>(p.v) % 16)
    pagedkv::detail::fail(errc::invalid_argument, "decode: k and v must be 16-byte aligned");
  if (misaligned(p.block_stride) || misaligned(p.token_stride) || misaligned(p.head_stride) || misaligned(p.head_dim))
    pagedkv::detail::fail(errc::invalid_argument, "decode: block, token and head strides and head_dim ", p.head_dim,
                          " must be multiples of 16 bytes of ", to_string(p.kv_dtype));
  if (std::int64_t(p.num_seqs) * p.num_kv_heads > 0x7fffffff)
    pagedkv::detail::fail(errc::invalid_argument, "decode: num_seqs * num_kv_heads too large");
}

template <class F>
decode_plan dispatch_kv_dtype(const attention_params& p, F&& f) {
  if (!decode_all_kv_dtypes && p.kv_dtype != dtype::bf16 && p.kv_dtype != dtype::fp8_e4m3)
    pagedkv::detail::fail(errc::invalid_argument, "decode: kv_dtype ", to_string(p.kv_dtype),
                          " is not compiled (build with PAGEDKV_KERNELS_FULL_SWEEP)");
  switch (p.kv_dtype) {
    case dtype::f32: return f.template operator()<float>();
    case dtype::f16: return f.template operator()<__half>();
    case dtype::bf16: return f.template operator()<__nv_bfloat16>();
    case dtype::fp8_e4m3: break;
  }
  return f.template operator()<__nv_fp8_e4m3>();
}

}  // namespace detail

/// The split plan decode would use for p (workspace_bytes says how much scratch to pass).
/// Reads no device memory. Throws errc::invalid_argument naming an unsupported value.
inline decode_plan plan_decode(const attention_params& p) {
  detail::check_decode(p);
  return detail::dispatch_kv_dtype(p, [&]<class TKV>() {
    if constexpr (!decode_all_kv_dtypes && !std::is_same_v<TKV, __nv_bfloat16> && !std::is_same_v<TKV, __nv_fp8_e4m3>)
      return decode_plan{};
    else
      return launch_decode_kv<TKV>(p, nullptr, 0, nullptr, false);
  });
}

/// Decode attention: o (and lse) for one query token per sequence over its paged K/V.
/// workspace: device scratch of plan_decode(p).workspace_bytes bytes (none when it is 0).
/// Enqueues on stream; never synchronises, never reads device memory on the host, so it can be
/// captured in a CUDA graph. Throws errc::invalid_argument naming an unsupported value,
/// errc::buffer_too_small for a short workspace, cuda_error on a failed launch.
inline decode_plan decode(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream = nullptr) {
  detail::check_decode(p);
  return detail::dispatch_kv_dtype(p, [&]<class TKV>() {
    if constexpr (!decode_all_kv_dtypes && !std::is_same_v<TKV, __nv_bfloat16> && !std::is_same_v<TKV, __nv_fp8_e4m3>)
      return decode_plan{};
    else
      return launch_decode_kv<TKV>(p, workspace, workspace_bytes, stream, true);
  });
}

}  // namespace pagedkv::kernels::cuda
