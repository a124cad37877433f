#!/usr/bin/env bash
# Threads a rank from its CPU affinity mask, shared among the node's ranks (core/threads.h):
#   check_threads.sh CHECK MPIRUN REPORT
# REPORT is mpigrad-thread-report, which prints each rank's count, its source and num_threads().
set -uo pipefail
check=$1 mpirun=$2 report=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() { cat "$log"; echo "FAIL ($check): $*"; exit 1; }
cores=$(nproc)  # this process's own mask, which the ranks inherit
# expect COUNT PATTERN: COUNT lines of the report say PATTERN, and every rank's num_threads()
# agrees with the count it reports.
expect() {
  local count=$1 pattern=$2 found
  found=$(grep -cE "$pattern" "$log")
  [[ $found -eq $count ]] || fail "expected $count line(s) matching /$pattern/, found $found"
  grep -E '^rank [0-9]+/[0-9]+: [0-9]+ thread' "$log" | while read -r line; do
    threads=$(sed -E 's/^rank [0-9]+\/[0-9]+: ([0-9]+) thread.*/\1/' <<<"$line")
    grep -q "; num_threads $threads;" <<<"$line" || fail "num_threads differs from the count: $line"
  done || exit 1
}
case $check in
  taskset)  # one process on one core of a larger machine: one thread, not one per machine core
    taskset -c 0 "$report" >"$log" 2>&1 || fail "exit status $?"
    expect 1 '^rank 0/1: 1 thread\(s\) \(1 core in the affinity mask\)'
    # And two ranks under mpirun, all of it pinned to that one core: one thread each.
    taskset -c 0 "$mpirun" -np 2 --oversubscribe --bind-to none "$report" >"$log" 2>&1 ||
      fail "exit status $?"
    expect 2 '^rank [01]/2: 1 thread\(s\) \(1 core in the affinity mask, shared by 2 ranks of the node\)'
    ;;
  bind_to_core)  # mpirun --bind-to core: each rank has one core of its own, and one thread
    ((cores >= 2)) || { echo "check_threads.sh: skipped: --bind-to core needs 2 cores, this has $cores"; exit 77; }
    "$mpirun" -np 2 --bind-to core "$report" >"$log" 2>&1 || fail "exit status $?"
    expect 2 '^rank [01]/2: 1 thread\(s\) \(1 core in the affinity mask, used by no other rank of the node\)'
    # One rank bound to one core of several: one thread, not one per core of the machine.
    "$mpirun" -np 1 --bind-to core "$report" >"$log" 2>&1 || fail "exit status $?"
    expect 1 '^rank 0/1: 1 thread\(s\) \(1 core in the affinity mask\)'
    ;;
  mpi_ranks)  # no rank count from the launcher (srun -n N): the node's ranks come from MPI
    "$mpirun" -np 2 --oversubscribe --bind-to none "$report" --unset-launcher-env >"$log" 2>&1 ||
      fail "exit status $?"
    share=$((cores / 2 > 0 ? cores / 2 : 1))
    expect 2 "^rank [01]/2: $share thread\\(s\\) \\($cores cores? in the affinity mask, shared by 2 ranks of the node\\)"
    grep -qE "^rank 0/2: rank 0/2 .*device cpu, $share threads? \\($cores cores? in the affinity mask" "$log" ||
      fail "the manager's log line does not give the count and its source"
    ;;
  explicit)  # core::set_num_threads before the CPU backend's first use wins over every default
    "$report" --set 3 >"$log" 2>&1 || fail "exit status $?"
    expect 1 '^rank 0/1: 3 thread\(s\) \(set_num_threads\)'
    "$mpirun" -np 2 --oversubscribe --bind-to none "$report" --set 3 >"$log" 2>&1 || fail "exit status $?"
    expect 2 '^rank [01]/2: 3 thread\(s\) \(set_num_threads\)'
    ;;
  *) echo "unknown check $check"; exit 2 ;;
esac
cat "$log"
echo "PASS ($check)"
