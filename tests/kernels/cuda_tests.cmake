# GPU tests of the CUDA kernels. They compile wherever nvcc is (CI included) and skip, visibly,
# where there is no GPU. The decode kernels come precompiled from pagedkv_decode_instances
# (kernels/CMakeLists.txt).
foreach(t test_decode_cuda test_cache_ops_cuda test_merge_cuda test_kv_pool_cuda)
  pagedkv_add_test(${t} SOURCES ${t}.cu LIBS pagedkv_decode_instances LABELS "kernels;cuda")
endforeach()

# Every .cuh header compiles on its own, with nvcc. The decode instantiations are declared extern
# (PAGEDKV_DECODE_SEPARATE_INSTANTIATION), as in the tests: dispatch.cuh alone would otherwise
# compile every decode kernel, once for each header that includes it.
pagedkv_add_header_check(pagedkv_kernels_cuda_header_check BASE ${PROJECT_SOURCE_DIR}/kernels PATTERN pagedkv/*.cuh
                         CUDA LIBS pagedkv::kernels)
target_compile_definitions(pagedkv_kernels_cuda_header_check PRIVATE PAGEDKV_DECODE_SEPARATE_INSTANTIATION=1
                                                                   PAGEDKV_PREFILL_SEPARATE_INSTANTIATION=1)
# The prefill's kernels come precompiled from pagedkv_prefill_instances; a mixed step runs both.
pagedkv_add_test(test_prefill_cuda SOURCES test_prefill_cuda.cu LIBS pagedkv_prefill_instances LABELS "kernels;cuda")
pagedkv_add_test(test_attention_step_cuda SOURCES test_attention_step_cuda.cu
                 LIBS pagedkv_prefill_instances pagedkv_decode_instances LABELS "kernels;cuda")
