#!/usr/bin/env bash
# A rank of `mpigrad train` killed mid-training on scripts/cluster-sim.sh's nodes: mpirun ends the
# others with SIGTERM, which is also a stop signal of the run, and the survivor's first line must
# name the lost rank and its host (launch/comm/collective_watchdog.h, "A lost rank"), the job
# ending non-zero within a few seconds, with no stop checkpoint (none can be agreed on).
#   check_lost_rank.sh MPIGRAD RANKS_PER_NODE WORKDIR
set -uo pipefail
mpigrad=$1 ranks_per_node=$2 work=$3
here=$(realpath "$(dirname "$0")")
fail() { cat "$work/job.txt"; echo "FAIL (lost rank, 2 x $ranks_per_node): $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
"$mpigrad" data synth -o train.h5 --samples 1200 --shape 1,8,8 --seed 1 >/dev/null || exit 1
ranks=$((2 * ranks_per_node))
victim=$((ranks - 1))  # the last rank: on node1
out=$work/out
MPIGRAD_NUM_THREADS=1 "$here/../../scripts/cluster-sim.sh" --nodes 2 --ranks-per-node "$ranks_per_node" \
  --yield on -- -x MPIGRAD_NUM_THREADS "$mpigrad" train --data.train=train.h5 --data.num_classes=10 \
  --model.name=mlp --model.hidden=256 --train.epochs=300 --train.batch_size=16 --train.log_every=1 \
  --train.out_dir="$out" >job.txt 2>&1 &
cluster=$!
for _ in $(seq 600); do
  grep -q '"step": 20,' "$out/metrics.jsonl" 2>/dev/null && break
  sleep 0.05
done
pid=""
for p in $(pgrep -f -- "^$mpigrad train .*--train.out_dir=$out"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && pid=$p
done
[[ -n $pid ]] || { kill "$cluster"; fail "rank $victim never started training"; }
killed=$(date +%s%N)
kill -KILL "$pid"
status=0
wait "$cluster" || status=$?
took_ms=$((($(date +%s%N) - killed) / 1000000))
cat job.txt | grep -v '^epoch\|^\[rank'"'"' [0-9]/[0-9]\] epoch'
echo "---- check_lost_rank.sh: the job ended $took_ms ms after rank $victim was killed, exit status $status"
[[ $status -ne 0 ]] || fail "the job exited 0"
((took_ms < 15000)) || fail "the job took $took_ms ms to end"
for ((r = 0; r < victim; r++)); do
  node=$((r / ranks_per_node))
  grep -qE "^\[rank $r/$ranks on node$node\] mpigrad: rank $victim on node1 is gone \(" job.txt ||
    fail "rank $r does not name rank $victim on node1 as gone"
done
grep -q "collective timeout" job.txt && fail "the watchdog's timeout ended it, not the lost rank's report"
grep -q "preempted" job.txt && fail "the launcher's TERM was taken for a stop"
echo "PASS (lost rank, 2 x $ranks_per_node)"
