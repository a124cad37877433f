#!/usr/bin/env bash
# What scripts/cluster-sim.sh promises its users, checked on a 2-node cluster:
#   check_cluster_sim.sh CHECK
# shaper:      each node's tbf bucket holds at most 2 ms of the rate (or one 64 KiB segment and its
#              headers, whichever is more), as the start line states it;
# environment: as root it runs without OMPI_ALLOW_RUN_AS_ROOT in the caller's environment; the
#              other nodes' ranks see a login environment, not the caller's, unless mpirun passes
#              a variable with -x; mpi_yield_when_idle is off unless --yield on asks for it;
# leftovers:   a process a job leaves running on a node is named before it is killed.
set -uo pipefail
check=$1
here=$(dirname "$0")
sim=$here/../../scripts/cluster-sim.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() { cat "$log"; echo "FAIL ($check): $*"; exit 1; }
# The caller's environment must not carry what the script should set itself.
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_mpi_yield_when_idle
case $check in
  shaper)
    for rate in 1gbit 200mbit 10gbit; do
      "$sim" --nodes 2 --ranks-per-node 1 --rate "$rate" -- tc qdisc show dev eth0 >"$log" 2>&1 ||
        fail "cluster-sim.sh exited with $?"
      bytes_per_ms=$(awk -v r="$rate" 'BEGIN { n = r + 0; printf "%d", n * (r ~ /gbit/ ? 1e9 : 1e6) / 8 / 1000 }')
      limit=$((2 * bytes_per_ms > 70000 ? 2 * bytes_per_ms : 70000))
      # "qdisc tbf 8001: root refcnt 2 rate 1Gbit burst 250000b lat 100ms" on each node.
      bursts=$(sed -nE 's/^qdisc tbf .* burst ([0-9]+)([kKmM]?)b.*/\1 \2/p' "$log" |
        awk '{ print $1 * ($2 == "K" || $2 == "k" ? 1024 : $2 == "M" || $2 == "m" ? 1048576 : 1) }')
      [[ $(wc -w <<<"$bursts") -eq 2 ]] || fail "no tbf on the 2 nodes at $rate"
      for burst in $bursts; do
        ((burst <= limit + limit / 20)) || fail "$rate: a burst of $burst B, above 2 ms of the rate ($limit B)"
      done
      grep -qE "links at $rate \\(tbf burst $limit B = [0-9.]+ ms at $rate" "$log" ||
        fail "the start line does not state the burst ($limit B)"
    done
    ;;
  environment)
    export CLUSTER_SIM_PROBE=caller
    "$sim" --nodes 2 --ranks-per-node 1 -- -x MPIGRAD_PASSED=passed sh -c \
      'echo "$(hostname): probe=${CLUSTER_SIM_PROBE:-unset} passed=${MPIGRAD_PASSED:-unset} yield=${OMPI_MCA_mpi_yield_when_idle:-unset}"' \
      >"$log" 2>&1 || fail "as root without OMPI_ALLOW_RUN_AS_ROOT: exit status $?"
    grep -q "^node0: probe=caller passed=passed yield=0$" "$log" || fail "node0's rank"
    grep -q "^node1: probe=unset passed=passed yield=0$" "$log" ||
      fail "node1's rank must see only what -x passed, and no yield"
    grep -q "mpi_yield_when_idle=0$" "$log" || fail "the start line does not say yield is off"
    "$sim" --nodes 2 --ranks-per-node 1 --yield on -- sh -c 'echo "yield=$OMPI_MCA_mpi_yield_when_idle"' \
      >"$log" 2>&1 || fail "--yield on: exit status $?"
    [[ $(grep -c '^yield=1$' "$log") -eq 2 ]] || fail "--yield on did not reach both nodes"
    ;;
  leftovers)
    "$sim" --nodes 2 --ranks-per-node 1 -- sh -c \
      '[ "$(hostname)" = node1 ] && setsid sleep 86 </dev/null >/dev/null 2>&1 & echo started' \
      >"$log" 2>&1 || fail "exit status $?"
    grep -qE "^cluster-sim: left over on node1, killed now: [0-9]+ \(sleep 86\)$" "$log" ||
      fail "the process left on node1 was not named"
    grep -q "left over on node0" "$log" && fail "node0 had nothing left over"
    pgrep -f "^sleep 86$" >/dev/null && fail "the leftover was not killed"
    ;;
  *) echo "unknown check $check"; exit 2 ;;
esac
cat "$log"
echo "PASS ($check)"
