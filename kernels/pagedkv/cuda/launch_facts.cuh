// Per-device facts of a kernel's launch (the SM count) and its shared-memory opt-in, made once
// per (kernel, device): a process may drive several GPUs (tensor parallelism runs one rank a GPU),
// and cudaFuncSetAttribute's limit holds for the current device only.
#pragma once

#include <cstddef>
#include <mutex>

#include <cuda_runtime.h>

#include <pagedkv/error.hpp>

#include "check.cuh"

namespace pagedkv::kernels::cuda::detail {

/// What a launch needs to know about a kernel on the current device: looked up once per
/// (kernel, device), since the lookups cost host time that small decode launches cannot afford.
struct launch_facts {
  int num_sms = 0;
};

/// Tag is a type unique to the kernel or kernels of one dispatch (a shared-memory map, or the
/// set of CTA shapes), so each has its own facts; prepare() raises their shared-memory limits.
/// Host threads may launch concurrently: each (Tag, device) entry is filled once, under
/// std::call_once; a failed lookup throws and leaves it to be tried again.
template <class Tag, class Prepare>
const launch_facts& facts_of(Prepare&& prepare) {
  constexpr int max_devices = 64;
  static launch_facts facts[max_devices];
  static std::once_flag filled[max_devices];
  int device = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= max_devices) pagedkv::detail::fail(errc::invalid_argument, "device ", device, " beyond ", max_devices);
  std::call_once(filled[device], [&] {
    launch_facts& f = facts[device];
    prepare();
    PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&f.num_sms, cudaDevAttrMultiProcessorCount, device));
  });
  return facts[device];
}

/// Lets `kernel` use smem_bytes of dynamic shared memory (beyond the default 48 KiB).
template <class Kernel>
void allow_smem(Kernel kernel, std::size_t smem_bytes) {
  PAGEDKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
}

}  // namespace pagedkv::kernels::cuda::detail
