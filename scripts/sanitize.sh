#!/usr/bin/env bash
# The whole ctest suite under AddressSanitizer (with leak checking) and UBSan, CPU only:
#     scripts/sanitize.sh [ctest arguments, e.g. -R data]
# Configures build-sanitize (or $MPIGRAD_SANITIZE_BUILD_DIR) with -DMPIGRAD_SANITIZE=
# address,undefined (cmake/mpigrad_sanitize.cmake: -fsanitize=address,undefined
# -fno-sanitize-recover=undefined -fno-omit-frame-pointer on everything, and on the installed
# target's link interface, so install_consumer's outside programs link the runtimes too), builds
# it under nice and runs ctest. Any ASan or UBSan report, or a leak, fails the test it happens
# in. Leaks inside Open MPI, hwloc, libevent, PMIx and HDF5 are suppressed by library in
# scripts/sanitize/lsan.supp; none in mpigrad's own code is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${MPIGRAD_SANITIZE_BUILD_DIR:-build-sanitize}
jobs=${MPIGRAD_SANITIZE_JOBS:-2}
start=$(date +%s)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPIGRAD_WERROR=ON \
  -DMPIGRAD_WITH_CUDA=OFF -DMPIGRAD_SANITIZE=address,undefined
nice cmake --build "$build" --parallel "$jobs"
built=$(date +%s)

# fast_unwind_on_malloc=0: full stacks for every allocation, so a leak's stack reaches the
# library that made it (the suppressions match on those frames). detect_odr_violation=0: Open
# MPI's components (mca_*.so) define the same globals as libopen-pal, a known false alarm.
# allocator_may_return_null=1: tests ask for 2^48-byte tensors on purpose and expect the
# AllocationError that a failed allocation becomes, not an ASan abort.
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:detect_odr_violation=0:abort_on_error=0:allocator_may_return_null=1
export LSAN_OPTIONS=suppressions=$root/scripts/sanitize/lsan.supp:fast_unwind_on_malloc=0:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
nice ctest --test-dir "$build" --output-on-failure --timeout 900 -j "$jobs" "$@" || status=$?
end=$(date +%s)
echo "sanitize.sh: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
exit $status
