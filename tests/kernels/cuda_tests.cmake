# GPU tests of the CUDA kernels. They compile wherever nvcc is (CI included) and skip, visibly,
# where there is no GPU. The decode kernels come precompiled from pagedkv_decode_instances
# (kernels/CMakeLists.txt).
foreach(t test_decode_cuda test_merge_cuda test_kv_pool_cuda)
  pagedkv_add_test(${t} SOURCES ${t}.cu LIBS pagedkv_decode_instances LABELS "kernels;cuda")
endforeach()
# The cache operations need no decode kernel: built without them, the device call that runs this
# test does not wait for every decode instantiation to compile.
pagedkv_add_test(test_cache_ops_cuda SOURCES test_cache_ops_cuda.cu LIBS pagedkv::kernels LABELS "kernels;cuda")

# Every .cuh header compiles on its own, with nvcc. The decode instantiations are declared extern
# (PAGEDKV_DECODE_SEPARATE_INSTANTIATION), as in the tests: dispatch.cuh alone would otherwise
# compile every decode kernel, once for each header that includes it.
pagedkv_add_header_check(pagedkv_kernels_cuda_header_check BASE ${PROJECT_SOURCE_DIR}/kernels PATTERN pagedkv/*.cuh
                         CUDA LIBS pagedkv::kernels)
if(TARGET pagedkv_kernels_cuda_header_check)  # not made when PAGEDKV_HEADER_CHECKS is off
  target_compile_definitions(pagedkv_kernels_cuda_header_check PRIVATE PAGEDKV_DECODE_SEPARATE_INSTANTIATION=1
                                                                     PAGEDKV_PREFILL_SEPARATE_INSTANTIATION=1)
endif()
# Two translation units that both include <pagedkv/cuda.cuh> link into one program: building it
# is the check (a kernel defined in a header outside a template is a duplicate symbol); it runs
# without a GPU.
add_executable(two_units_link_check two_units/first.cu two_units/second.cu)
target_link_libraries(two_units_link_check PRIVATE pagedkv::kernels pagedkv_prefill_instances pagedkv_decode_instances)
add_test(NAME kernels.two_units_link_check COMMAND two_units_link_check)
set_tests_properties(kernels.two_units_link_check PROPERTIES LABELS kernels)
# The prefill's kernels come precompiled from pagedkv_prefill_instances; a mixed step runs both.
pagedkv_add_test(test_prefill_cuda SOURCES test_prefill_cuda.cu LIBS pagedkv_prefill_instances LABELS "kernels;cuda")
pagedkv_add_test(test_attention_step_cuda SOURCES test_attention_step_cuda.cu
                 LIBS pagedkv_prefill_instances pagedkv_decode_instances LABELS "kernels;cuda")
