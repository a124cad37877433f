# Installs the mpigrad build tree into a scratch prefix, then builds and runs tests/consumer (C++),
# tests/consumer_c (C only) and tests/consumer_fortran (Fortran only) against it, with CMake and
# with pkg-config. Run by ctest (see tests/CMakeLists.txt); any failing step fails the test.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run_step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "install_consumer: step failed (${result}): ${ARGV}")
  endif()
endfunction()

run_step(${CMAKE_COMMAND} --install ${MPIGRAD_BUILD_DIR} --prefix ${prefix})
# Only the public headers are installed: internal ones stay behind.
foreach(internal core/ops/op_support.h kernels/cpu/parallel.h launch/comm/collective_watchdog.h)
  if(EXISTS ${prefix}/include/mpigrad/${internal})
    message(FATAL_ERROR "install_consumer: internal header ${internal} was installed")
  endif()
endforeach()
foreach(public mpigrad.h mpigrad_c.h version.h core/tensor.h launch/mpi_interop.h
       launch/train/training_strategy.h launch/insitu/embedded_model.h)
  if(NOT EXISTS ${prefix}/include/mpigrad/${public})
    message(FATAL_ERROR "install_consumer: public header ${public} was not installed")
  endif()
endforeach()
run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step(${WORK_DIR}/build/consumer)

# Outside C and Fortran host programs against the same installed package: a pure C project
# and a pure Fortran project (no CXX enabled), each run under mpiexec on 2 and 4 ranks, as the
# host programs they stand for are.
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
set(ENV{MPIGRAD_NUM_THREADS} 1)
function(run_ranks program)
  foreach(ranks 2 4)
    run_step(${MPIEXEC} -n ${ranks} --oversubscribe ${program})
  endforeach()
endfunction()

run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR}/../consumer_c -B ${WORK_DIR}/build_c
         -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
         -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build_c)
# Nothing of C++ reached the C compile lines.
file(READ ${WORK_DIR}/build_c/compile_commands.json compile_commands)
foreach(flag -fopenmp "std=c++" "std=gnu++")
  string(FIND "${compile_commands}" "${flag}" found)
  if(NOT found EQUAL -1)
    message(FATAL_ERROR "install_consumer: the C consumer is compiled with ${flag}")
  endif()
endforeach()
run_ranks(${WORK_DIR}/build_c/consumer_c)

# A Makefile code's way: a plain compiler command line with pkg-config's flags.
set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
set(ENV{LD_LIBRARY_PATH} ${prefix}/${LIBDIR}:$ENV{LD_LIBRARY_PATH})
function(pkg_config_flags package variable)
  execute_process(COMMAND pkg-config --cflags --libs ${package} OUTPUT_VARIABLE flags
                  RESULT_VARIABLE result OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "install_consumer: pkg-config --cflags --libs ${package} failed")
  endif()
  message(STATUS "pkg-config --cflags --libs ${package}: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(${variable} ${flags} PARENT_SCOPE)
endfunction()
pkg_config_flags(mpigrad c_flags)
run_step(${MPI_C_COMPILER} -std=c99 -Wall -Wextra -Wpedantic -Werror
         ${CONSUMER_SOURCE_DIR}/../consumer_c/main.c ${c_flags} -lm
         -o ${WORK_DIR}/consumer_c_pkg_config)
run_step(${MPIEXEC} -n 2 --oversubscribe ${WORK_DIR}/consumer_c_pkg_config)

if(WITH_FORTRAN)
  # A Fortran C project finds both targets, and still no C++.
  file(WRITE ${WORK_DIR}/fortran_c/CMakeLists.txt [=[
cmake_minimum_required(VERSION 3.24)
project(mpigrad_consumer_fortran_c LANGUAGES Fortran C)
find_package(mpigrad REQUIRED)
if(NOT TARGET mpigrad::c OR NOT TARGET mpigrad::fortran OR CMAKE_CXX_COMPILER_LOADED)
  message(FATAL_ERROR "a Fortran C project: mpigrad::c and mpigrad::fortran, and no C++")
endif()
]=])
  run_step(${CMAKE_COMMAND} -S ${WORK_DIR}/fortran_c -B ${WORK_DIR}/build_fortran_c
           -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix})
  run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR}/../consumer_fortran
           -B ${WORK_DIR}/build_fortran -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
           -DCMAKE_BUILD_TYPE=Release)
  run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build_fortran)
  run_ranks(${WORK_DIR}/build_fortran/consumer_fortran)
  run_ranks(${WORK_DIR}/build_fortran/consumer_fortran_mpi)
  pkg_config_flags(mpigrad-fortran fortran_flags)
  run_step(${MPI_Fortran_COMPILER} -Wall -Werror
           ${CONSUMER_SOURCE_DIR}/../consumer_fortran/consumer_fortran_mpi.f90 ${fortran_flags}
           -o ${WORK_DIR}/consumer_fortran_pkg_config)
  run_step(${MPIEXEC} -n 2 --oversubscribe ${WORK_DIR}/consumer_fortran_pkg_config)
endif()
