#!/usr/bin/env bash
# The main job from a fresh machine: install dependencies, build, and run the core demo (a
# logistic regression trained with mpigrad's autograd). The training issue replaces the demo with
# Fashion-MNIST under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
"${MPIGRAD_BUILD_DIR:-build}"/examples/core_demo
