# Script mode: builds pagedkv's consumer project against a fresh install (MODE=find_package) or
# against the source tree (MODE=add_subdirectory), then runs its two programs: the engine-style
# consumer and the conformance kit run over its own free lists. Any failing step fails the test.
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
