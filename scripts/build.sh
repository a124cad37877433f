#!/usr/bin/env bash
# Configures and builds mpigrad into ./build (or $MPIGRAD_BUILD_DIR). Incremental: a second run
# only rebuilds what changed. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MPIGRAD_BUILD_DIR:-build}
# With ccache installed (not required), a rebuild of an unchanged file is a cache hit; the base
# directory makes its keys relative, so another checkout of the same tree hits the same entries.
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
         CMAKE_CUDA_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMPIGRAD_WERROR=ON "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
