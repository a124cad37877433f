# cmake -P tests/cmake/test_find_cuda_libraries.cmake -DWORK_DIR=<scratch>
# cmake/mpigrad_find_cuda_libraries.cmake finds cuDNN and NCCL laid out as pip's wheels lay them
# out: only the versioned sonames (libcudnn.so.9, libnccl.so.2), with their headers beside them.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/mpigrad_find_cuda_libraries.cmake)
if(NOT WORK_DIR)
  message(FATAL_ERROR "pass -DWORK_DIR=<scratch folder>")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
foreach(package cudnn nccl)
  file(MAKE_DIRECTORY ${WORK_DIR}/nvidia/${package}/include ${WORK_DIR}/nvidia/${package}/lib)
endforeach()
file(TOUCH ${WORK_DIR}/nvidia/cudnn/include/cudnn.h ${WORK_DIR}/nvidia/cudnn/lib/libcudnn.so.9
           ${WORK_DIR}/nvidia/nccl/include/nccl.h ${WORK_DIR}/nvidia/nccl/lib/libnccl.so.2)

mpigrad_find_cuda_library(WHEEL_CUDNN HEADER cudnn.h NAMES cudnn libcudnn.so.9
                          ROOTS ${WORK_DIR}/nvidia/cudnn)
mpigrad_find_cuda_library(WHEEL_NCCL HEADER nccl.h NAMES nccl libnccl.so.2
                          ROOTS ${WORK_DIR}/nvidia/nccl)
foreach(check
    "WHEEL_CUDNN_LIBRARY;${WORK_DIR}/nvidia/cudnn/lib/libcudnn.so.9"
    "WHEEL_CUDNN_INCLUDE_DIR;${WORK_DIR}/nvidia/cudnn/include"
    "WHEEL_NCCL_LIBRARY;${WORK_DIR}/nvidia/nccl/lib/libnccl.so.2"
    "WHEEL_NCCL_INCLUDE_DIR;${WORK_DIR}/nvidia/nccl/include")
  list(GET check 0 variable)
  list(GET check 1 expected)
  if(NOT "${${variable}}" STREQUAL "${expected}")
    message(FATAL_ERROR "${variable} is '${${variable}}', expected '${expected}'")
  endif()
endforeach()
message(STATUS "versioned sonames found: ${WHEEL_CUDNN_LIBRARY}, ${WHEEL_NCCL_LIBRARY}")
