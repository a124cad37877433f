# Installs the mpigrad build tree into a scratch prefix, then builds and runs tests/consumer
# against it. Run by ctest (see tests/CMakeLists.txt); any failing step fails the test.
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

# Outside C and Fortran programs against the same installed package.
run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR}/../consumer_c -B ${WORK_DIR}/build_c
         -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build_c)
run_step(${WORK_DIR}/build_c/consumer_c)
if(WITH_FORTRAN)
  run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR}/../consumer_fortran
           -B ${WORK_DIR}/build_fortran -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
           -DCMAKE_BUILD_TYPE=Release)
  run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build_fortran)
  run_step(${WORK_DIR}/build_fortran/consumer_fortran)
endif()
