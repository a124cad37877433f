#!/usr/bin/env bash
# A network partition on scripts/cluster-sim.sh's cluster: 2 nodes x RANKS_PER_NODE ranks
# all-reduce every 10 ms (mpigrad-launch-scenario loop) and node1's link goes down 3 s in. Every
# rank must be gone within the collective timeout plus its report's grace (and 2 s of slack), and
# a rank of node0 must report the ranks of node1 as gone. mpirun itself cannot reach node1's
# orted any more and waits for it forever (docs/failures.md: what a batch script should do), so this
# script ends the cluster itself afterwards; cluster-sim.sh removes every process it started.
#   check_partition.sh SCENARIO_PROGRAM RANKS_PER_NODE
set -u
program=$1 ranks_per_node=$2
here=$(dirname "$0")
timeout=${MPIGRAD_COLLECTIVE_TIMEOUT:-3}
log=$(mktemp)
# A run-unique duration, so that the ranks of this run (and only they) can be found by name.
tag="60.$$"
"$here/../../scripts/cluster-sim.sh" --nodes 2 --ranks-per-node "$ranks_per_node" --yield on \
  --partition-after 3 -- -x MPIGRAD_COLLECTIVE_TIMEOUT="$timeout" "$program" loop "$tag" >"$log" 2>&1 &
cluster=$!
start=$(date +%s%N)
# The ranks themselves, not mpirun or cluster-sim.sh, whose command lines hold the same words.
ranks_running() { pgrep -f -- "^[^ ]*mpigrad-launch-scenario loop $tag" >/dev/null; }
# Wait for the ranks to start, then for the partition, then for the last rank to end.
for ((i = 0; i < 100; i++)); do ranks_running && break; sleep 0.1; done
while ! grep -q "link is down" "$log" && kill -0 "$cluster" 2>/dev/null; do sleep 0.05; done
partition=$(date +%s%N)
limit_ms=$(awk -v t="$timeout" 'BEGIN { printf "%d", t * 1000 + 2000 + 2000 }')
while ranks_running && (($(date +%s%N) - partition < 60000000000)); do sleep 0.1; done
gone_ms=$((($(date +%s%N) - partition) / 1000000))
kill -TERM "$cluster" 2>/dev/null
wait "$cluster"
cat "$log"
failed=0
echo "---- check_partition.sh: the last rank ended ${gone_ms} ms after the partition (limit ${limit_ms} ms)"
((gone_ms <= limit_ms)) || { echo "FAIL: ranks outlived the partition by more than the timeout"; failed=1; }
grep -Eq "^\[rank [0-9]+/[0-9]+ on node0\] mpigrad: collective timeout" "$log" ||
  { echo "FAIL: no rank of node0 reported the timeout"; failed=1; }
grep -Eq "^  rank [0-9]+ on node1: gone \(no answer" "$log" ||
  { echo "FAIL: the report does not call node1's ranks gone"; failed=1; }
rm -f "$log"
exit $failed
