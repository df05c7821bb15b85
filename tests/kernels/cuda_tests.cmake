# GPU tests of the CUDA kernels. They compile wherever nvcc is (CI included) and skip, visibly,
# where there is no GPU. The decode kernels are compiled once, one KV type per translation unit,
# into pagedkv_decode_instances, which the tests and benchmarks share.
set(decode_instance_sources)
foreach(kv float __half __nv_bfloat16 __nv_fp8_e4m3)
  if(PAGEDKV_KERNELS_FULL_SWEEP OR kv STREQUAL "__nv_bfloat16" OR kv STREQUAL "__nv_fp8_e4m3")
    set(PAGEDKV_INSTANTIATE 1)
  else()
    set(PAGEDKV_INSTANTIATE 0)
  endif()
  set(PAGEDKV_KV_TYPE ${kv})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/decode_instantiation_${kv}.cu)
  configure_file(${CMAKE_CURRENT_SOURCE_DIR}/decode_instantiation.cu.in ${out} @ONLY)
  list(APPEND decode_instance_sources ${out})
endforeach()
add_library(pagedkv_decode_instances STATIC ${decode_instance_sources})
target_link_libraries(pagedkv_decode_instances PUBLIC pagedkv::kernels)
target_compile_definitions(pagedkv_decode_instances PUBLIC PAGEDKV_DECODE_SEPARATE_INSTANTIATION=1)
set_target_properties(pagedkv_decode_instances PROPERTIES POSITION_INDEPENDENT_CODE OFF)

foreach(t test_decode_cuda test_cache_ops_cuda)
  pagedkv_add_test(${t} SOURCES ${t}.cu LIBS pagedkv_decode_instances LABELS "kernels;cuda")
endforeach()
