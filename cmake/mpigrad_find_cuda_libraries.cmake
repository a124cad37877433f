# Finding cuDNN and NCCL where they are installed: beside the CUDA toolkit, under CUDNN_ROOT /
# NCCL_ROOT (as CMake variables or in the environment), or in pip's NVIDIA wheels
# (site-packages/nvidia/cudnn, site-packages/nvidia/nccl of the python3 on PATH). The wheels ship
# only the versioned sonames, libcudnn.so.9 and libnccl.so.2, with no libcudnn.so for a plain
# `-lcudnn`, so those names are searched for too; linking the versioned file records the same
# soname. Usable from a project and from `cmake -P` (tests/cmake/test_find_cuda_libraries.cmake).

# mpigrad_pip_nvidia_dirs(<var> <package>): the folders site-packages/nvidia/<package> of the
# python3 on PATH that exist (none when there is no python3).
function(mpigrad_pip_nvidia_dirs var package)
  set(found "")
  find_program(MPIGRAD_PYTHON3 python3)
  if(MPIGRAD_PYTHON3)
    execute_process(
      COMMAND ${MPIGRAD_PYTHON3} -c
        "import site; print(';'.join(site.getsitepackages() + [site.getusersitepackages()]))"
      OUTPUT_VARIABLE site_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      foreach(dir ${site_dirs})
        if(IS_DIRECTORY "${dir}/nvidia/${package}")
          list(APPEND found "${dir}/nvidia/${package}")
        endif()
      endforeach()
    endif()
  endif()
  set(${var} "${found}" PARENT_SCOPE)
endfunction()

# mpigrad_find_cuda_library(<prefix> HEADER <file> NAMES <name>... ROOTS <dir>...): sets the cache
# variables <prefix>_INCLUDE_DIR and <prefix>_LIBRARY (NOTFOUND when absent). ROOTS are searched
# first, with include/ and lib/ (or lib64/) below them.
function(mpigrad_find_cuda_library prefix)
  cmake_parse_arguments(ARG "" "HEADER" "NAMES;ROOTS" ${ARGN})
  find_path(${prefix}_INCLUDE_DIR ${ARG_HEADER} HINTS ${ARG_ROOTS} PATH_SUFFIXES include)
  find_library(${prefix}_LIBRARY NAMES ${ARG_NAMES} HINTS ${ARG_ROOTS}
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
endfunction()
