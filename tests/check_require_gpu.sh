#!/usr/bin/env bash
# Runs a GPU test suite with MPIGRAD_REQUIRE_GPU=1 and checks that it can no longer skip: it
# either runs and passes (a GPU is there), or fails with the line that names the missing GPU and
# MPIGRAD_REQUIRE_GPU (no GPU). A skip (exit 77) or any other failure fails this test.
#   check_require_gpu.sh <suite program> [args...]
output=$(MPIGRAD_REQUIRE_GPU=1 "$@" 2>&1)
rc=$?
printf '%s\n' "$output"
if [ "$rc" -eq 0 ]; then exit 0; fi
if [ "$rc" -eq 77 ]; then
  echo "check_require_gpu: $1 skipped although MPIGRAD_REQUIRE_GPU=1" >&2
  exit 1
fi
if printf '%s\n' "$output" | grep -q "MPIGRAD_REQUIRE_GPU=1 makes that a failure"; then exit 0; fi
echo "check_require_gpu: $1 failed (exit $rc) without the MPIGRAD_REQUIRE_GPU line" >&2
exit 1
