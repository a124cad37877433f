# cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -DGENERATOR=<gen> -DCUDA_COMPILER=<nvcc>
#       -P tests/cmake/check_build_without_cudnn.cmake
# A CUDA build with cuDNN turned off (as on a machine without it) configures, leaves out every
# cuDNN source of core/cuda (the CudnnBackend), and compiles the CUDA backend that remains and
# the nn layers with -Werror. The cuDNN header guard (MPIGRAD_WITHOUT_CUDNN in
# core/cuda/cudnn_backend.cuh) makes any leftover include of cuDNN fail here even though this
# toolkit ships cudnn.h. Only those objects are compiled: the kernels are the same as in the main
# build, and a full second CUDA build would cost CI minutes.
foreach(variable SOURCE_DIR WORK_DIR GENERATOR CUDA_COMPILER)
  if(NOT ${variable})
    message(FATAL_ERROR "pass -D${variable}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR}
          -DCMAKE_BUILD_TYPE=Release -DMPIGRAD_WERROR=ON -DMPIGRAD_WITH_CUDA=ON
          -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER} -DMPIGRAD_WITH_CUDNN=OFF -DMPIGRAD_LAYERS=nn
          -DMPIGRAD_BUILD_TESTS=OFF -DMPIGRAD_BUILD_BENCHMARKS=OFF -DMPIGRAD_BUILD_EXAMPLES=OFF
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure without cuDNN failed:\n${out}")
endif()
if(NOT out MATCHES "cuDNN off")
  message(FATAL_ERROR "the configure did not report cuDNN as off:\n${out}")
endif()
file(READ ${WORK_DIR}/build.ninja rules)
foreach(object cuda_backend runtime)
  if(NOT rules MATCHES "core/cuda/${object}\\.cpp\\.o")
    message(FATAL_ERROR "core/cuda/${object}.cpp is not part of the build without cuDNN")
  endif()
endforeach()
foreach(object cudnn_backend cudnn_conv cudnn_batch_norm cudnn_pooling)
  if(rules MATCHES "core/cuda/${object}\\.cpp\\.o")
    message(FATAL_ERROR "core/cuda/${object}.cpp is built although cuDNN is off")
  endif()
endforeach()
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR} --target
          CMakeFiles/mpigrad.dir/core/cuda/cuda_backend.cpp.o
          CMakeFiles/mpigrad.dir/core/cuda/runtime.cpp.o
          CMakeFiles/mpigrad.dir/nn/functional/conv.cpp.o
          CMakeFiles/mpigrad.dir/nn/functional/normalization.cpp.o
          CMakeFiles/mpigrad.dir/nn/functional/pooling.cpp.o
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the CUDA backend and nn do not compile without cuDNN:\n${out}")
endif()
message(STATUS "the CUDA backend and nn compile without cuDNN")
