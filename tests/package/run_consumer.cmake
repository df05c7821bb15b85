# Script mode: builds pagedkv's consumer project against a fresh install (MODE=find_package) or
# against the source tree (MODE=add_subdirectory), then runs its two programs: the engine-style
# consumer and the conformance kit run over its own free lists; after the install, also
# docs/testing.md's policy test, built with the page's own CMake lines. Any failing step fails the
# test.
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
# Sanitizer flags from the outer build must not leak in: the consumer builds plainly.
set(plain -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DPAGEDKV_ENABLE_CUDA=OFF)
if(MODE STREQUAL "find_package")
  step(${CMAKE_COMMAND} -S ${PAGEDKV_SOURCE} -B ${WORK}/pagedkv-build ${plain}
       -DPAGEDKV_BUILD_TESTS=OFF -DPAGEDKV_BUILD_BENCHMARKS=OFF -DPAGEDKV_BUILD_EXAMPLES=OFF
       -DCMAKE_INSTALL_PREFIX=${WORK}/prefix)
  step(${CMAKE_COMMAND} --install ${WORK}/pagedkv-build)
  step(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer-build ${plain}
       -DCONSUMER_MODE=find_package -DCMAKE_PREFIX_PATH=${WORK}/prefix)
else()
  step(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer-build ${plain}
       -DCONSUMER_MODE=add_subdirectory -DPAGEDKV_SOURCE=${PAGEDKV_SOURCE})
endif()
step(${CMAKE_COMMAND} --build ${WORK}/consumer-build)
step(${WORK}/consumer-build/consumer)
step(${WORK}/consumer-build/conformance_consumer)

# docs/testing.md's policy test as the page shows it: its CMake lines and its code, a project of
# their own built against the install, run with 200 command sequences a property (about a second).
if(MODE STREQUAL "find_package")
  file(READ ${PAGEDKV_SOURCE}/docs/testing.md page)
  string(REGEX MATCH "<!-- example-cmake:begin -->\n```cmake\n([^`]*)```\n<!-- example-cmake:end -->" found
         "${page}")
  set(cmake_lines "${CMAKE_MATCH_1}")
  string(REGEX MATCH "<!-- example:begin -->\n```cpp\n(.*)```\n<!-- example:end -->" found_code "${page}")
  if(NOT found OR NOT found_code)
    message(FATAL_ERROR "docs/testing.md: no ```cmake or ```cpp block between the example markers")
  endif()
  file(WRITE ${WORK}/docs-example/CMakeLists.txt
       "cmake_minimum_required(VERSION 3.25)\nproject(my_policy_test LANGUAGES CXX)\n${cmake_lines}")
  file(WRITE ${WORK}/docs-example/my_policy_test.cpp "${CMAKE_MATCH_1}")
  step(${CMAKE_COMMAND} -S ${WORK}/docs-example -B ${WORK}/docs-example-build ${plain}
       -DCMAKE_PREFIX_PATH=${WORK}/prefix)
  step(${CMAKE_COMMAND} --build ${WORK}/docs-example-build)
  step(${CMAKE_COMMAND} -E env RC_PARAMS=max_success=200 ${WORK}/docs-example-build/my_policy_test)
endif()
