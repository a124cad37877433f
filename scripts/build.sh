#!/usr/bin/env bash
# Configures and builds mpigrad into ./build (or $MPIGRAD_BUILD_DIR). Incremental: a second run
# only rebuilds what changed. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MPIGRAD_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMPIGRAD_WERROR=ON "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
