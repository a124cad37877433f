#!/usr/bin/env bash
# Runs a program under mpirun and checks how the job ended.
#   check_exit.sh MPIRUN NPROCS ok|fail PER_RANK_PATTERN [--also PATTERN]... [--within SECONDS]
#                 -- PROGRAM [ARGS...]
# fail: the exit status must be non-zero; ok: it must be zero.
# PER_RANK_PATTERN (an extended regex, "" for none) must appear on a line prefixed
# "[rank r/NPROCS]" for every rank r, so an error that only some ranks report is caught.
# Each --also PATTERN must appear somewhere in the output (a message only one rank prints).
# --within: the whole job must end within SECONDS (a failure must not wait out anything long).
set -u
mpirun=$1 nprocs=$2 expect=$3 pattern=$4
shift 4
also=()
within=0
while [[ ${1:-} == --also || ${1:-} == --within ]]; do
  if [[ $1 == --also ]]; then also+=("$2"); else within=$2; fi
  shift 2
done
[[ ${1:-} == -- ]] && shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s%N)
timeout 120 "$mpirun" -np "$nprocs" --oversubscribe "$@" >"$log" 2>&1
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$log"
echo "---- check_exit.sh: exit status $status after ${elapsed_ms} ms"
failed=0
if (( within > 0 && elapsed_ms > within * 1000 )); then
  echo "FAIL: the job took longer than ${within} s"; failed=1
fi
if [[ $expect == fail && $status -eq 0 ]]; then echo "FAIL: expected a non-zero exit"; failed=1; fi
if [[ $expect == ok && $status -ne 0 ]]; then echo "FAIL: expected exit status 0"; failed=1; fi
if [[ $status -eq 124 ]]; then echo "FAIL: the job hung (killed after 120 s)"; failed=1; fi
# mpirun's own crash (its signal handler's backtrace names mpirun): Open MPI 4.1's mpirun can
# die in its PMIx server after an MPI_Abort (launch/comm/mpi_runtime.cpp), and its exit status
# is then non-zero like the failure these jobs expect.
if grep -Eq -- '^\[[^]]+\] \[ *[0-9]+\] mpirun\(' "$log"; then
  echo "FAIL: mpirun itself crashed"; failed=1
fi
if [[ -n $pattern ]]; then
  for (( r = 0; r < nprocs; r++ )); do
    if ! grep -E -- "^\[rank $r/$nprocs\] .*$pattern" "$log" >/dev/null; then
      echo "FAIL: rank $r did not report /$pattern/"; failed=1
    fi
  done
fi
for extra in "${also[@]}"; do
  if ! grep -E -- "$extra" "$log" >/dev/null; then echo "FAIL: no line matches /$extra/"; failed=1; fi
done
exit $failed
