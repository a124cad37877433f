# CUDA detection and wiring. MPIGRAD_WITH_CUDA=AUTO builds the CUDA backend when a toolkit is
# found, ON requires one, OFF never looks. Finding a toolkit needs no GPU: CI compiles all CUDA
# code on machines without one, and the GPU tests then skip.
#
# Architectures: CMAKE_CUDA_ARCHITECTURES defaults to "90" (H100/H200), which CMake expands to
# SASS for sm_90 plus compute_90 PTX embedded in the binary, so newer GPUs can JIT it.
option(MPIGRAD_CUDA_DEBUG_SYNC
  "Synchronize the stream and check for errors after every CUDA kernel launch (slow; for debugging)"
  OFF)

set(MPIGRAD_WITH_CUDNN AUTO CACHE STRING
  "With the CUDA backend, use cuDNN for Conv2d, BatchNorm and pooling: AUTO (if found), ON or OFF")
set_property(CACHE MPIGRAD_WITH_CUDNN PROPERTY STRINGS AUTO ON OFF)
include(${CMAKE_CURRENT_LIST_DIR}/mpigrad_find_cuda_libraries.cmake)

set(MPIGRAD_CUDA_ENABLED OFF)
if(NOT MPIGRAD_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MPIGRAD_CUDA_TOOLKIT_FOUND ON)
  elseif(MPIGRAD_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MPIGRAD_WITH_CUDA=ON but no CUDA compiler was found; set CMAKE_CUDA_COMPILER or CUDAToolkit_ROOT")
  else()
    message(STATUS "mpigrad: no CUDA toolkit found, building the CPU framework only")
  endif()
endif()

file(GLOB MPIGRAD_CUDA_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu ${CMAKE_SOURCE_DIR}/core/cuda/*.cpp)
# Compiled only in CPU builds: the same public API, answering "no CUDA" everywhere.
set(MPIGRAD_CUDA_FALLBACK_SOURCE ${CMAKE_SOURCE_DIR}/core/cuda/without_cuda.cpp)
list(REMOVE_ITEM MPIGRAD_CUDA_SOURCES ${MPIGRAD_CUDA_FALLBACK_SOURCE})

if(MPIGRAD_CUDA_TOOLKIT_FOUND)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures (90 = sm_90 SASS + compute_90 PTX)" FORCE)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(MPIGRAD_CUDA_ENABLED ON)
endif()

# cuDNN: the CUDA backend's convolution, batch norm and pooling (core/cuda/cudnn_*.cpp, the
# CudnnBackend). Without it the CUDA backend is the plain CudaBackend, on which those throw.
set(MPIGRAD_CUDNN_FOUND OFF)
if(MPIGRAD_CUDA_ENABLED AND NOT MPIGRAD_WITH_CUDNN STREQUAL "OFF")
  mpigrad_pip_nvidia_dirs(pip_cudnn cudnn)
  mpigrad_find_cuda_library(MPIGRAD_CUDNN HEADER cudnn.h NAMES cudnn libcudnn.so.9
    ROOTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR}
        ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} ${pip_cudnn})
  if(MPIGRAD_CUDNN_INCLUDE_DIR AND MPIGRAD_CUDNN_LIBRARY)
    set(MPIGRAD_CUDNN_FOUND ON)
  elseif(MPIGRAD_WITH_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "MPIGRAD_WITH_CUDNN=ON but cuDNN was not found (cudnn.h: "
      "${MPIGRAD_CUDNN_INCLUDE_DIR}, libcudnn: ${MPIGRAD_CUDNN_LIBRARY}); set CUDNN_ROOT")
  endif()
endif()
if(MPIGRAD_CUDA_ENABLED AND MPIGRAD_CUDNN_FOUND)
  message(STATUS "mpigrad: the CUDA backend uses cuDNN ${MPIGRAD_CUDNN_LIBRARY}")
elseif(MPIGRAD_CUDA_ENABLED AND MPIGRAD_WITH_CUDNN STREQUAL "OFF")
  message(STATUS "mpigrad: cuDNN off (MPIGRAD_WITH_CUDNN=OFF): Conv2d, BatchNorm and pooling "
                 "will not run on CUDA")
elseif(MPIGRAD_CUDA_ENABLED)
  message(WARNING "mpigrad: cuDNN (cudnn.h, libcudnn.so[.9]) not found beside the CUDA "
                  "toolkit, under CUDNN_ROOT or in pip's nvidia/cudnn: Conv2d, BatchNorm and "
                  "pooling will not run on CUDA")
endif()

# Adds the CUDA backend to `target` when it is enabled, and the no-CUDA fallback otherwise.
function(mpigrad_add_cuda_sources target)
  if(NOT MPIGRAD_CUDA_ENABLED)
    target_sources(${target} PRIVATE ${MPIGRAD_CUDA_FALLBACK_SOURCE})
    return()
  endif()
  set(sources ${MPIGRAD_CUDA_SOURCES})
  if(NOT MPIGRAD_CUDNN_FOUND)
    list(FILTER sources EXCLUDE REGEX "/core/cuda/cudnn_[a-z_]+\\.cpp$")
  endif()
  target_sources(${target} PRIVATE ${sources})
  target_compile_definitions(${target} PRIVATE MPIGRAD_WITH_CUDA=1
    $<$<BOOL:${MPIGRAD_CUDA_DEBUG_SYNC}>:MPIGRAD_CUDA_DEBUG_SYNC=1>)
  # cudart is linked as a shared library, the same one the host .cpp files of core/cuda call.
  set_target_properties(${target} PROPERTIES
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Shared)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>
    $<$<AND:$<BOOL:${MPIGRAD_WERROR}>,$<COMPILE_LANGUAGE:CUDA>>:-Werror=all-warnings -Xcompiler=-Werror>)
  target_link_libraries(${target} PRIVATE CUDA::cudart CUDA::cublas)
  if(MPIGRAD_CUDNN_FOUND)
    target_include_directories(${target} PRIVATE ${MPIGRAD_CUDNN_INCLUDE_DIR})
    target_link_libraries(${target} PRIVATE ${MPIGRAD_CUDNN_LIBRARY})
  else()
    # The cuDNN headers must then stay out of every translation unit, even where the toolkit has
    # them: core/cuda/cudnn_backend.cuh refuses to compile under this definition.
    target_compile_definitions(${target} PRIVATE MPIGRAD_WITHOUT_CUDNN=1)
  endif()
endfunction()
