# CUDA detection: MPIGRAD_WITH_CUDA=AUTO builds the CUDA backend when a toolkit is found, ON
# requires one, OFF never looks. Finding a toolkit needs no GPU: CI compiles all CUDA code on
# machines without one.
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
if(MPIGRAD_CUDA_TOOLKIT_FOUND AND NOT MPIGRAD_CUDA_SOURCES)
  message(STATUS "mpigrad: CUDA toolkit found, but this version has no CUDA backend sources yet")
elseif(MPIGRAD_CUDA_TOOLKIT_FOUND)
  set(MPIGRAD_CUDA_ENABLED ON)
endif()

# Adds the CUDA backend to `target` when it is enabled.
function(mpigrad_add_cuda_sources target)
  if(NOT MPIGRAD_CUDA_ENABLED)
    return()
  endif()
  message(FATAL_ERROR "mpigrad: CUDA sources present but the CUDA build is not wired up yet")
endfunction()
