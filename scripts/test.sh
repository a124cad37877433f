#!/usr/bin/env bash
# The whole test suite from a fresh machine: install dependencies, build (warnings are errors),
# and run every test through ctest. This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
# Open MPI refuses root unless told otherwise; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "${MPIGRAD_BUILD_DIR:-build}" --output-on-failure --timeout 600
