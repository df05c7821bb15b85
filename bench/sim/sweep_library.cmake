# pagedkv_sim_sweep: the trace sweep's runs (trace_sweep.cpp, every free list x eviction policy of
# the scheduler), compiled once for pagedkv-sim and test_trace_file, whichever is configured first.
if(NOT TARGET pagedkv_sim_sweep)
  add_library(pagedkv_sim_sweep STATIC ${CMAKE_CURRENT_LIST_DIR}/trace_sweep.cpp)
  target_include_directories(pagedkv_sim_sweep PUBLIC ${PROJECT_SOURCE_DIR}/bench)
  target_link_libraries(pagedkv_sim_sweep PUBLIC pagedkv::pagedkv)
  target_compile_options(pagedkv_sim_sweep PRIVATE -Wall -Wextra -Werror)
endif()
