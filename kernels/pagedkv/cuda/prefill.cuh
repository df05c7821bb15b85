// Paged prefill attention on the GPU: plan_prefill on the host (from the host copy of q_indptr),
// then prefill, which only enqueues (no allocation, no host synchronisation: it can be captured in
// a CUDA graph). This file is the prefill's one dispatch place: q and KV types and head_dim
// become compile-time values here, and a value outside the compiled lists is refused naming it.
// The bodies are prefill_mma.cuh (every compiled case) and, on sm_90a for head_dim 128 with q
// and KV of one 16-bit type, the warp-specialised prefill_wgmma_ws.cuh; plan_prefill chooses and
// records the choice in the plan. Splits of the KV are merged by merge_states (merge.cuh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <pagedkv/error.hpp>

#include "../attention_params.hpp"
#include "../prefill_plan.hpp"
#include "../prefill_tuning.hpp"
#include "check.cuh"
#include "dependent_launch.cuh"
#include "launch_facts.cuh"
#include "merge.cuh"
#include "prefill_mma.cuh"
#include "prefill_wgmma_ws.cuh"

namespace pagedkv::kernels::cuda {

template <int... Dims>
struct prefill_dims {
  static std::string describe() {
    std::ostringstream s;
    ((s << Dims << ' '), ...);
    std::string r = s.str();
    if (!r.empty()) r.pop_back();
    return r;
  }
};

#if defined(PAGEDKV_KERNELS_FULL_SWEEP) && PAGEDKV_KERNELS_FULL_SWEEP
using prefill_head_dims = prefill_dims<64, 80, 96, 128, 256>;
inline constexpr bool prefill_all_dtypes = true;
#else
using prefill_head_dims = prefill_dims<64, 128>;
/// bf16 KV under a bf16 q, fp8 KV under a bf16 or f16 q; f16 KV only with the full sweep.
inline constexpr bool prefill_all_dtypes = false;
#endif

namespace detail {

/// Calls f.template operator()<D>() for the D in Dims equal to head_dim; false if none is.
template <class F, int... Dims>
bool visit_prefill_dim(int head_dim, prefill_dims<Dims...>, F&& f) {
  return ((head_dim == Dims ? (f.template operator()<Dims>(), true) : false) || ...);
}

template <int... Dims>
constexpr bool prefill_dim_compiled(int head_dim, prefill_dims<Dims...>) {
  return ((head_dim == Dims) || ...);
}

/// The split merge after a body that wrote plan.num_splits partials (none with one split).
template <class T, int D>
void merge_prefill_splits(const attention_params& p, const prefill_plan& plan, void* workspace, cudaStream_t stream) {
  if (plan.num_splits <= 1) return;
  const std::int64_t first_row = std::int64_t(plan.q_first) * p.num_qo_heads;
  merge_states_params m;
  m.o_in = workspace;
  m.lse_in = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + plan.lse_offset(p.num_qo_heads, sizeof(T)));
  m.o = static_cast<T*>(p.o) + first_row * D;
  m.lse = p.lse ? p.lse + first_row : nullptr;
  m.num_rows = plan.merge_rows(p.num_qo_heads);
  m.num_states = plan.num_splits;
  m.head_dim = D;
  m.o_dtype = p.q_dtype;
  merge_states(m, stream);
}

/// The partial outputs and LSEs of a split plan in the workspace (nullptr with one split).
template <class T>
std::pair<T*, float*> prefill_partials(const attention_params& p, const prefill_plan& plan, void* workspace) {
  if (plan.num_splits <= 1) return {nullptr, nullptr};
  return {static_cast<T*>(workspace),
          reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + plan.lse_offset(p.num_qo_heads, sizeof(T)))};
}

inline dim3 prefill_grid(const attention_params& p, const prefill_plan& plan) {
  return dim3(unsigned(plan.num_seqs * plan.q_tiles_per_seq), unsigned(p.num_kv_heads), unsigned(plan.num_splits));
}

/// Launches the body for head_dim D with the CTA shape Policy (a prefill_config; the plan must
/// be made with Policy::tile()), then merge_states over its splits. The first call on a device
/// (planning calls it with launch false) opts the kernel into its shared memory there, so that a
/// run never does.
/// The shipped shape is prefill_policy<D>; bench_prefill times others through this.
template <class T, class TKV, int D, class Policy = prefill_policy<D>>
void launch_prefill_kernel(const attention_params& p, const prefill_plan& plan, void* workspace, cudaStream_t stream,
                           bool launch) {
  using smem_t = prefill_smem<T, TKV, D, Policy>;
  // once a device: above 48 KiB, shared memory is opted into (a second GPU of the process too)
  (void)detail::facts_of<smem_t>([] { detail::allow_smem(prefill_mma_kernel<T, TKV, D, Policy>, smem_t::bytes); });
  if (!launch) return;
  const auto [part_o, part_lse] = prefill_partials<T>(p, plan, workspace);
  launch_dependent(prefill_mma_kernel<T, TKV, D, Policy>, prefill_grid(p, plan), Policy::threads, smem_t::bytes, stream,
                   p, plan, part_o, part_lse);
  merge_prefill_splits<T, D>(p, plan, workspace, stream);
}

/// The same for the wgmma body (head_dim 128, KV of q's type T; the plan made with
/// prefill_wgmma_policy::tile()): where the pool's pages take the bulk tensor copy
/// (prefill_tma_page_rows) and `tma` holds, the layer's K/V tensor maps are made here (host only,
/// a launch each) and the copying warpgroup takes whole page runs by TMA; elsewhere it gathers by
/// cp.async (tma false: every tile, bench_prefill's variant 4). Where the group divides the tile's
/// rows (prefill_tma_q_tokens), q's map is made too and the copying warpgroup takes each whole
/// Q tile by TMA, with tma false as well; other Q tiles it copies by cp.async. Likewise o's map
/// without splits: each computing warp stores its 16 rows by one TMA where they lie within their
/// sequence.
template <class T>
void launch_prefill_wgmma_kernel(const attention_params& p, const prefill_plan& plan, void* workspace,
                                 cudaStream_t stream, bool launch, bool tma = true) {
  using smem_t = prefill_wgmma_ws_smem;
  (void)detail::facts_of<prefill_wgmma_ws_tag<T, false>>(
      [] { detail::allow_smem(prefill_wgmma_ws_kernel<T, false>, smem_t::bytes); });
  (void)detail::facts_of<prefill_wgmma_ws_tag<T, true>>(
      [] { detail::allow_smem(prefill_wgmma_ws_kernel<T, true>, smem_t::bytes); });
  if (!launch) return;
  const auto [part_o, part_lse] = prefill_partials<T>(p, plan, workspace);
  const prefill_tensor_maps maps = make_prefill_tensor_maps(
      p, prefill_wgmma_policy::kv_tokens, prefill_wgmma_policy::q_rows, 16, tma, plan.num_splits <= 1);  // a warp's rows
  if (maps.rows > 0)
    launch_dependent(prefill_wgmma_ws_kernel<T, true>, prefill_grid(p, plan), prefill_wgmma_ws_policy::threads,
                     smem_t::bytes, stream, p, plan, part_o, part_lse, maps);
  else
    launch_dependent(prefill_wgmma_ws_kernel<T, false>, prefill_grid(p, plan), prefill_wgmma_ws_policy::threads,
                     smem_t::bytes, stream, p, plan, part_o, part_lse, maps);
  merge_prefill_splits<T, prefill_wgmma_policy::head_dim>(p, plan, workspace, stream);
}

}  // namespace detail

/// The prefill for q of type T over KV of type TKV: the plan's body, head_dim dispatched
/// (already checked); launch false only prepares the kernel.
template <class T, class TKV>
void launch_prefill(const attention_params& p, const prefill_plan& plan, void* workspace, cudaStream_t stream,
                    bool launch) {
  if (plan.kernel == prefill_kernel::wgmma) {
    if constexpr (std::is_same_v<T, TKV>) {
      detail::launch_prefill_wgmma_kernel<T>(p, plan, workspace, stream, launch);
      return;
    }
    pagedkv::detail::fail(errc::invalid_argument, "prefill: the wgmma kernel takes KV of q's type");
  }
  const bool dim_ok = detail::visit_prefill_dim(p.head_dim, prefill_head_dims{}, [&]<int D>() {
    detail::launch_prefill_kernel<T, TKV, D>(p, plan, workspace, stream, launch);
  });
  if (!dim_ok)
    pagedkv::detail::fail(errc::invalid_argument, "prefill: head_dim ", p.head_dim,
                          " is not compiled (compiled: ", prefill_head_dims::describe(), ")");
}

#if defined(PAGEDKV_PREFILL_SEPARATE_INSTANTIATION)
// Builds that compile each type pair in a translation unit of its own (in parallel) define this
// and instantiate launch_prefill<T, TKV> once each; see kernels/prefill_instantiation.cu.in.
#define PAGEDKV_PREFILL_EXTERN(T, TKV) \
  extern template void launch_prefill<T, TKV>(const attention_params&, const prefill_plan&, void*, cudaStream_t, bool);
PAGEDKV_PREFILL_EXTERN(__nv_bfloat16, __nv_bfloat16)
PAGEDKV_PREFILL_EXTERN(__nv_bfloat16, __nv_fp8_e4m3)
PAGEDKV_PREFILL_EXTERN(__half, __nv_fp8_e4m3)
#if defined(PAGEDKV_KERNELS_FULL_SWEEP) && PAGEDKV_KERNELS_FULL_SWEEP
PAGEDKV_PREFILL_EXTERN(__half, __half)
#endif
#undef PAGEDKV_PREFILL_EXTERN
#endif

namespace detail {

/// What the prefill needs beyond check(p): q_indptr, a 16-bit q, compiled types and head_dim,
/// 16-byte rows. Throws errc::invalid_argument naming the first bad value.
inline void check_prefill(const attention_params& p) {
  using pagedkv::detail::fail;
  check(p);
  if (!p.q_indptr) fail(errc::invalid_argument, "prefill takes q_indptr (query tokens per sequence); it is nullptr");
  if (p.q_dtype != dtype::bf16 && p.q_dtype != dtype::f16)
    fail(errc::invalid_argument, "prefill: q_dtype ", to_string(p.q_dtype),
         " is not supported (tensor cores take bf16 and f16)");
  if (!prefill_all_dtypes && p.kv_dtype == dtype::f16)
    fail(errc::invalid_argument, "prefill: kv_dtype f16 is not compiled (build with PAGEDKV_KERNELS_FULL_SWEEP)");
  if (!detail::prefill_dim_compiled(p.head_dim, prefill_head_dims{}))
    fail(errc::invalid_argument, "prefill: head_dim ", p.head_dim, " is not compiled (compiled: ",
         prefill_head_dims::describe(), ")");
  if (p.num_seqs == 0) return;
  const std::size_t es = size_of(p.kv_dtype);
  const auto misaligned = [&](std::int64_t elems) { return (std::size_t(elems) * es) % 16 != 0; };
  const auto unaligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0; };
  if (unaligned(p.k) || unaligned(p.v) || unaligned(p.q) || unaligned(p.o))
    fail(errc::invalid_argument, "prefill: q, o, k and v must be 16-byte aligned");
  if (misaligned(p.block_stride) || misaligned(p.token_stride) || misaligned(p.head_stride))
    fail(errc::invalid_argument, "prefill: block, token and head strides must be multiples of 16 bytes of ",
         to_string(p.kv_dtype));
}

/// Calls f.template operator()<T, TKV>() for p's (checked) types.
template <class F>
void dispatch_prefill_dtypes(const attention_params& p, F&& f) {
  const bool fp8 = p.kv_dtype == dtype::fp8_e4m3;
  if (p.q_dtype == dtype::bf16) {
    if (fp8) f.template operator()<__nv_bfloat16, __nv_fp8_e4m3>();
    else f.template operator()<__nv_bfloat16, __nv_bfloat16>();
  } else if (fp8) {
    f.template operator()<__half, __nv_fp8_e4m3>();
  } else if constexpr (prefill_all_dtypes) {
    f.template operator()<__half, __half>();
  }
}

/// Whether the current device runs the wgmma body: compute capability 9.0 (Hopper; the build
/// compiles sm_90a code unless it defines PAGEDKV_PREFILL_WGMMA 0).
inline bool device_has_wgmma() {
#if defined(PAGEDKV_PREFILL_WGMMA) && !PAGEDKV_PREFILL_WGMMA
  return false;
#else
  int device = 0, major = 0, minor = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
#endif
}

/// The body a plan of p runs: `wanted`, or with automatic the wgmma body wherever it takes the
/// case. Throws errc::invalid_argument naming why when the wgmma body is asked for a case it does
/// not take.
inline prefill_kernel choose_prefill_kernel(const attention_params& p, prefill_kernel wanted) {
  using pagedkv::detail::fail;
  if (wanted == prefill_kernel::mma) return wanted;
  const char* why = nullptr;
  if (p.head_dim != prefill_wgmma_policy::head_dim) why = "head_dim is not 128";
  else if (p.kv_dtype != p.q_dtype) why = "kv_dtype is not q_dtype";
  else if (!device_has_wgmma()) why = "the device is not sm_90 (Hopper)";
  if (!why) return prefill_kernel::wgmma;
  if (wanted != prefill_kernel::automatic)
    fail(errc::invalid_argument, "prefill: the wgmma kernel does not take this case: ", why, " (head_dim ", p.head_dim,
         ", q ", to_string(p.q_dtype), ", kv ", to_string(p.kv_dtype), ")");
  return prefill_kernel::mma;
}

/// The tile of a plan for `kernel`.
inline prefill_tile_shape prefill_tile_for(prefill_kernel kernel, std::int32_t head_dim) {
  return kernel == prefill_kernel::wgmma ? prefill_wgmma_policy::tile() : prefill_tile_of(head_dim);
}

inline int current_device_sms() {
  int device = 0, sms = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace detail

/// Plans a prefill of p on the current device. host_q_indptr: the host copy of p.q_indptr
/// (num_seqs + 1 entries). kernel: the body (automatic: wgmma on sm_90 where it takes the case,
/// else mma.sync; plan.kernel says which). The plan stays valid for runs whose sequences have at most its
/// max_q_len query tokens each and its num_q_tokens in all (the rows the split merge covers).
/// Throws errc::invalid_argument naming an unsupported or bad value.
inline prefill_plan plan_prefill(const attention_params& p, std::span<const std::int32_t> host_q_indptr,
                                 prefill_kernel kernel = prefill_kernel::automatic) {
  detail::check_prefill(p);
  const prefill_kernel chosen = detail::choose_prefill_kernel(p, kernel);
  prefill_plan plan = plan_prefill(p, host_q_indptr, detail::current_device_sms(),
                                   detail::prefill_tile_for(chosen, p.head_dim), size_of(p.q_dtype));
  plan.kernel = chosen;
  detail::dispatch_prefill_dtypes(p, [&]<class T, class TKV>() { launch_prefill<T, TKV>(p, plan, nullptr, nullptr, false); });
  return plan;
}

/// Prefill attention: o (and lse, when set) of every query token of q_indptr, causal over its
/// sequence's paged K/V (the cached tokens first, then the chunk). workspace: device memory of
/// plan.workspace_bytes bytes (none when 0), 16-byte aligned. Enqueues on stream and returns:
/// never allocates, synchronises or reads device memory on the host. Throws errc::invalid_argument
/// naming an unsupported value or a plan made for other params, errc::buffer_too_small for a
/// short workspace, cuda_error on a failed launch.
inline void prefill(const attention_params& p, const prefill_plan& plan, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream = nullptr) {
  using pagedkv::detail::fail;
  detail::check_prefill(p);
  const prefill_tile_shape tile = detail::prefill_tile_for(plan.kernel, p.head_dim);
  if (plan.num_seqs != p.num_seqs || plan.group != p.group_size() ||
      plan.group_div.divisor != std::uint32_t(plan.group) || plan.head_dim != p.head_dim ||
      plan.seq_div.divisor != std::uint32_t(std::max(p.num_seqs, 1)) ||
      plan.kv_head_div.divisor != std::uint32_t(p.num_kv_heads) ||
      plan.split_div.divisor != std::uint32_t(plan.num_splits) ||
      plan.q_tile_rows != tile.q_rows || plan.kv_tile_tokens != tile.kv_tokens ||
      (plan.kernel == prefill_kernel::wgmma && p.kv_dtype != p.q_dtype))
    fail(errc::invalid_argument, "prefill: the plan was made for ", plan.num_seqs, " sequences, ",
         plan.kv_head_div.divisor, " KV heads, group ", plan.group, ", head_dim ", plan.head_dim,
         "; these params have ", p.num_seqs, ", ", p.num_kv_heads, ", ", p.group_size(), ", ", p.head_dim);
  if (plan.num_splits > 1 && (workspace_bytes < plan.workspace_bytes || !workspace))
    fail(errc::buffer_too_small, "prefill: workspace of ", workspace_bytes, " bytes, the plan needs ",
         plan.workspace_bytes);
  if (plan.num_splits > 1 && reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0)
    fail(errc::invalid_argument, "prefill: workspace must be 16-byte aligned");
  if (p.num_seqs == 0 || plan.max_q_len == 0) return;
  detail::dispatch_prefill_dtypes(p, [&]<class T, class TKV>() { launch_prefill<T, TKV>(p, plan, workspace, stream, true); });
}

}  // namespace pagedkv::kernels::cuda
