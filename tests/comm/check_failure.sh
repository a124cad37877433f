#!/usr/bin/env bash
# Runs a launch scenario under mpirun and checks how the job ended.
#   check_failure.sh MPIRUN NPROCS PROGRAM MODE ok|fail [PATTERN...]
# fail: the exit status must be non-zero and the job must end within 2 x MPIGRAD_COLLECTIVE_TIMEOUT
#       of the moment the program says its collective started ("collective starts at <ns>").
#       CHECK_TEARDOWN_MS adds that much for the launcher's own teardown (Open MPI takes 3-4 s to
#       end a job across the nodes of scripts/cluster-sim.sh, against ~1 s on one node).
# ok:   the exit status must be zero.
# skip: a program that exits 77 on every rank (a GPU job without its GPUs) is passed through as
#       a skip: its one line is printed and this script exits 77.
# Each PATTERN (an extended regex, matched per line) must appear in the combined output.
set -u
mpirun=$1 nprocs=$2 program=$3 mode=$4 expect=$5
shift 5
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$mpirun" -np "$nprocs" --oversubscribe "$program" "$mode" >"$log" 2>&1
status=$?
end=$(date +%s%N)
if [[ $status -eq 77 ]]; then
  grep -m1 'skipped' "$log" || true
  exit 77
fi
cat "$log"
echo "---- check_failure.sh: exit status $status"
failed=0
# mpirun's own crash (its signal handler's backtrace names mpirun): Open MPI 4.1's mpirun can
# die in its PMIx server after an MPI_Abort (launch/comm/mpi_runtime.cpp), and its exit status
# is then non-zero like the failure these jobs expect.
if grep -Eq -- '^\[[^]]+\] \[ *[0-9]+\] mpirun\(' "$log"; then
  echo "FAIL: mpirun itself crashed"; failed=1
fi
if [[ $expect == fail ]]; then
  if [[ $status -eq 0 ]]; then echo "FAIL: expected a non-zero exit"; failed=1; fi
  start=$(grep -o 'collective starts at [0-9]*' "$log" | head -1 | awk '{print $4}')
  timeout=${MPIGRAD_COLLECTIVE_TIMEOUT:-2}
  if [[ -z $start ]]; then
    echo "FAIL: the program never reported the start of its collective"; failed=1
  else
    elapsed_ms=$(( (end - start) / 1000000 ))
    limit_ms=$(awk -v t="$timeout" -v extra="${CHECK_TEARDOWN_MS:-0}" 'BEGIN { printf "%d", t * 2000 + extra }')
    echo "---- check_failure.sh: job ended ${elapsed_ms} ms after the collective started (limit ${limit_ms} ms)"
    if (( elapsed_ms > limit_ms )); then echo "FAIL: the job took longer than 2 x the timeout"; failed=1; fi
  fi
elif [[ $status -ne 0 ]]; then
  echo "FAIL: expected exit status 0"; failed=1
fi
for pattern in "$@"; do
  if ! grep -Eq -- "$pattern" "$log"; then echo "FAIL: output lacks /$pattern/"; failed=1; fi
done
exit $failed
