#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS on its committed corpus:
#     scripts/fuzz.sh fuzz_hdf5|fuzz_config|fuzz_idx SECONDS [extra libFuzzer flags]
# Builds build-fuzz first when needed (clang, CPU only, -fsanitize=fuzzer,address,undefined).
# New inputs go to build-fuzz/corpus/<target>/ (scratch, seeded from fuzz/corpus/<target>/), not
# to the committed corpus; a crash lands in fuzz/crashes/<target>/, to be committed with its fix
# so the replay ctest (fuzz_replay_<target>) runs it from then on. Runs under nice, one worker.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=${1:?usage: scripts/fuzz.sh fuzz_hdf5|fuzz_config|fuzz_idx SECONDS [libFuzzer flags]}
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS}
shift 2
case "$target" in
  fuzz_hdf5|fuzz_config|fuzz_idx) ;;
  *) echo "fuzz.sh: unknown target '$target' (fuzz_hdf5, fuzz_config, fuzz_idx)" >&2; exit 1 ;;
esac
build=${MPIGRAD_FUZZ_BUILD_DIR:-build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMPIGRAD_WERROR=ON -DMPIGRAD_WITH_CUDA=OFF -DMPIGRAD_WITH_FORTRAN=OFF -DBUILD_SHARED_LIBS=OFF \
    -DMPIGRAD_BUILD_TESTS=OFF -DMPIGRAD_BUILD_BENCHMARKS=OFF -DMPIGRAD_BUILD_EXAMPLES=OFF \
    -DMPIGRAD_BUILD_FUZZ=ON
fi
nice cmake --build "$build" --target "$target" --parallel "${MPIGRAD_FUZZ_JOBS:-2}"

scratch=$build/corpus/$target
crashes=fuzz/crashes/$target
mkdir -p "$scratch" "$crashes"
# Size limits: memory really used above -rss_limit_mb is a finding. One allocation over 2 GiB
# returns NULL (max_allocation_size_mb, allocator_may_return_null), as on a machine without that
# memory: HDF5 allocates the object-header size a corrupt file declares (8 GiB, untouched) and
# fails cleanly without it, and mpigrad turns a failed allocation into an AllocationError.
# fast_unwind_on_malloc=0: allocation stacks through HDF5 (built without frame pointers) are
# complete, so fuzz/lsan.supp can match HDF5's own leaks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:max_allocation_size_mb=2048:fast_unwind_on_malloc=0:malloc_context_size=16}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
exec nice "$build/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" "$@" \
  "$scratch" "fuzz/corpus/$target"
