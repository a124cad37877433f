# Shared helpers of the end-to-end check scripts (sourced, not run). The sourcing script sets
# $check (the check's name, for messages), $mpiexec and $mpigrad first.

fail() { echo "FAIL ($check): $*" >&2; exit 1; }

# Every check: mpirun may run as root and oversubscribe the cores, each rank uses one thread, and
# the check works in a fresh folder $1, which becomes the working directory.
start_check() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export MPIGRAD_NUM_THREADS=1
  rm -rf "$1" && mkdir -p "$1" && cd "$1"
}
run() { "$mpiexec" -np "$1" --oversubscribe "${@:2}"; }

# Prints the "loss" values of metrics.jsonl's step lines, one per line.
losses() { grep '"step"' "$1" | sed -E 's/.*"loss": ([^,]+),.*/\1/'; }

# A run that must fail: non-zero exit, the pattern in its output, the error names its rank, and
# no training step was taken.
expect_error() {
  local pattern=$1; shift
  if run 2 "$mpigrad" train "$@" > out.txt 2>&1; then cat out.txt; fail "expected failure: $*"; fi
  grep -q -- "$pattern" out.txt || { cat out.txt; fail "missing '$pattern' for: $*"; }
  grep -q "^\[rank [0-9]/2\]" out.txt || { cat out.txt; fail "error does not name the rank: $*"; }
  grep -q "step" out.txt && fail "training started despite: $*"
  return 0
}

# The final test accuracy a run printed ("...; test accuracy 0.9123").
final_accuracy() { sed -nE 's/.*test accuracy ([0-9.]+).*/\1/p' "$1" | tail -1; }
at_least() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
