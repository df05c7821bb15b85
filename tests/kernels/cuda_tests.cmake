# GPU tests of the CUDA kernels. They compile wherever nvcc is (CI included) and skip, visibly,
# where there is no GPU. The decode kernels come precompiled from pagedkv_decode_instances
# (kernels/CMakeLists.txt).
foreach(t test_decode_cuda test_cache_ops_cuda test_merge_cuda test_kv_pool_cuda)
  pagedkv_add_test(${t} SOURCES ${t}.cu LIBS pagedkv_decode_instances LABELS "kernels;cuda")
endforeach()
