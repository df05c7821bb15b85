// Umbrella header of the CUDA kernels (pagedkv::kernels).
#pragma once

#include "cuda/cache_ops.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/kv_pool.cuh"
#include "cuda/merge.cuh"
#include "cuda/staged_swap.cuh"
