# Runs a command and checks its exit status and its output, for the CLI's tests: ctest's
# PASS_REGULAR_EXPRESSION alone passes a test on a matched line whatever the exit status.
#
#   cmake -DEXIT_CODE=<n> [-DSTDOUT=<regex>] [-DSTDERR=<regex>] [-DFORBID=<regex>]
#         -P check_command.cmake -- <command> [<arg>...] [--same-stdout-as <command> [<arg>...]]
#
# The command must exit with EXIT_CODE; STDOUT and STDERR must match its outputs (CMake regular
# expressions, searched: anchor them with ^ and $ to match a whole output) and FORBID neither. With
# --same-stdout-as, its stdout must equal the second command's, which must exit 0.
cmake_minimum_required(VERSION 3.25)

set(command)
set(reference)
set(target command)
set(seen_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  set(arg "${CMAKE_ARGV${i}}")
  if(NOT seen_separator)
    if(arg STREQUAL "--")
      set(seen_separator TRUE)
    endif()
  elseif(arg STREQUAL "--same-stdout-as")
    set(target reference)
  else()
    string(REPLACE ";" "\\;" arg "${arg}")  # a semicolon inside an argument must not split it
    list(APPEND ${target} "${arg}")
  endif()
endforeach()
if(NOT command OR NOT DEFINED EXIT_CODE)
  message(FATAL_ERROR "usage: cmake -DEXIT_CODE=<n> [-DSTDOUT=..] [-DSTDERR=..] [-DFORBID=..] -P check_command.cmake -- <command>...")
endif()

execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("exit status: ${status}\n--- stdout\n${out}--- stderr\n${err}---")
set(failures)
if(NOT status STREQUAL EXIT_CODE)
  list(APPEND failures "exit status ${status}, expected ${EXIT_CODE}")
endif()
if(DEFINED STDOUT AND NOT out MATCHES "${STDOUT}")
  list(APPEND failures "stdout does not match: ${STDOUT}")
endif()
if(DEFINED STDERR AND NOT err MATCHES "${STDERR}")
  list(APPEND failures "stderr does not match: ${STDERR}")
endif()
if(DEFINED FORBID AND ("${out}" MATCHES "${FORBID}" OR "${err}" MATCHES "${FORBID}"))
  list(APPEND failures "the output matches the forbidden ${FORBID}")
endif()
if(reference)
  execute_process(COMMAND ${reference} RESULT_VARIABLE reference_status OUTPUT_VARIABLE reference_out)
  if(NOT reference_status STREQUAL "0")
    list(APPEND failures "the reference command exited with ${reference_status}")
  elseif(NOT out STREQUAL reference_out)
    list(APPEND failures "stdout differs from the reference command's:\n${reference_out}")
  endif()
endif()
if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "${text}")
endif()
