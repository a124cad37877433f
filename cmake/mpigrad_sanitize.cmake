# Sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh).
#
# MPIGRAD_SANITIZE=address,undefined compiles and links everything in this project (library,
# programs, tests) with -fsanitize=<list>; UBSan findings stop the program
# (-fno-sanitize-recover) so that ctest sees them as failures. The flags are also put on the
# installed mpigrad target's link interface, so a find_package consumer (tests/consumer) links
# the sanitizer runtimes that libmpigrad needs.
#
# MPIGRAD_BUILD_FUZZ=ON (clang only) adds libFuzzer's coverage instrumentation
# (-fsanitize=fuzzer-no-link) to every object and builds the targets in fuzz/ with
# -fsanitize=fuzzer; it implies MPIGRAD_SANITIZE=address,undefined when that is empty.
set(MPIGRAD_SANITIZE "" CACHE STRING
    "Build with these sanitizers (-fsanitize=<list>), e.g. address,undefined; empty: none")
option(MPIGRAD_BUILD_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

if(MPIGRAD_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MPIGRAD_BUILD_FUZZ=ON needs clang (libFuzzer): configure with "
                        "CC=clang CXX=clang++ (scripts/fuzz.sh does)")
  endif()
  if(NOT MPIGRAD_SANITIZE)
    set(MPIGRAD_SANITIZE address,undefined)
  endif()
endif()

set(MPIGRAD_SANITIZE_LINK_OPTIONS "")
if(MPIGRAD_SANITIZE)
  set(flags -fsanitize=${MPIGRAD_SANITIZE} -fno-omit-frame-pointer)
  if(MPIGRAD_SANITIZE MATCHES "undefined")
    list(APPEND flags -fno-sanitize-recover=undefined)
  endif()
  if(MPIGRAD_BUILD_FUZZ)
    list(APPEND flags -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX,Fortran>:${flags}>")
  set(MPIGRAD_SANITIZE_LINK_OPTIONS -fsanitize=${MPIGRAD_SANITIZE})
  add_link_options(${MPIGRAD_SANITIZE_LINK_OPTIONS})
  message(STATUS "mpigrad: sanitizers ${MPIGRAD_SANITIZE}")
endif()
