#!/usr/bin/env bash
# Stop and resume with out_dir on each node's own scratch (its private /dev/shm), on
# scripts/cluster-sim.sh's nodes: rank 0's checkpoint exists on node0 only.
#   check_resume.sh MPIGRAD COMPARE RANKS_PER_NODE WORKDIR
# - checkpoint_scope = shared (the default): the resume fails at once on every rank, naming the
#   rank of node1 that cannot read the file, its host and the path; it never hangs in a collective
#   (the watchdog's timeout is 60 s, far beyond the limit here);
# - checkpoint_scope = node_local: rank 0 sends the checkpoint to node1, and the resumed run ends
#   with the weights and losses of an uninterrupted run, bit for bit.
# The cluster's jobs run from one shell on node0 (cluster-sim.sh --shell), so node0's /dev/shm
# lives from the stop to the resume.
set -uo pipefail
if [[ ${1:-} != --on-node0 ]]; then
  mpigrad=$1 compare=$2 ranks_per_node=$3 work=$4
  self=$(realpath "$0")
  rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
  "$mpigrad" data synth -o train.h5 --samples 1200 --shape 1,8,8 --seed 1 >/dev/null || exit 1
  "$mpigrad" data synth -o test.h5 --samples 301 --shape 1,8,8 --seed 1 >/dev/null || exit 1
  exec "$(dirname "$self")/../../scripts/cluster-sim.sh" --nodes 2 --ranks-per-node "$ranks_per_node" \
    --yield on --shell -- bash "$self" --on-node0 "$mpigrad" "$compare" \
    $((2 * ranks_per_node))
fi
mpigrad=$2 compare=$3 ranks=$4
fail() { echo "FAIL (resume on node-local scratch): $*"; exit 1; }
scratch=/dev/shm/mpigrad-resume-$$  # node0's own; node1's /dev/shm is another tmpfs
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch"
cat >base.ini <<INI
[data]
train = train.h5
test = test.h5
num_classes = 10
augment = crop:1,flip
[model]
name = mlp
hidden = 32
dropout = 0.2
[optim]
lr = 0.05
momentum = 0.9
[train]
epochs = 2
batch_size = 16
seed = 3
log_every = 1
resume = auto
INI
export MPIGRAD_NUM_THREADS=1 MPIGRAD_COLLECTIVE_TIMEOUT=60
run() { "$CLUSTER_SIM_MPIRUN" -x MPIGRAD_NUM_THREADS -x MPIGRAD_COLLECTIVE_TIMEOUT "$@"; }
losses() { grep '"step"' "$1" | sed -E 's/.*"loss": ([^,]+),.*/\1/'; }

run "$mpigrad" train --config base.ini --train.out_dir="$scratch/full" >full.txt 2>&1 ||
  { cat full.txt; fail "the uninterrupted run failed"; }
status=0
MPIGRAD_TEST_RAISE_SIGNAL=1:7:USR1 run -x MPIGRAD_TEST_RAISE_SIGNAL "$mpigrad" train --config base.ini \
  --train.out_dir="$scratch/part" >stop.txt 2>&1 || status=$?
[[ $status -eq 75 ]] || { cat stop.txt; fail "the stopped run exited with $status, not 75"; }
ckpt=$scratch/part/ckpt-epoch0-step8.h5
[[ -f $ckpt ]] || { cat stop.txt; fail "no $ckpt on node0"; }

# shared: one error, at once, naming the rank of node1, its host and the path.
start=$(date +%s)
status=0
run "$mpigrad" train --config base.ini --train.out_dir="$scratch/part" >shared.txt 2>&1 || status=$?
took=$(($(date +%s) - start))
cat shared.txt
[[ $status -ne 0 ]] || fail "resumed although node1 cannot read the checkpoint"
((took < 30)) || fail "the failed resume took $took s: it waited for a collective"
grep -q "collective timeout" shared.txt && fail "the watchdog ended it, not the resume's own check"
grep -qE "^\[rank 0/$ranks\] mpigrad train: error: \[train\] resume: rank $((ranks / 2)) on node1 cannot read $ckpt, the checkpoint rank 0 chose: .*checkpoint_scope = node_local" shared.txt ||
  fail "rank 0's error does not name rank $((ranks / 2)), node1 and $ckpt"
grep -q '"step": 9,' "$scratch/part/metrics.jsonl" && fail "a step was trained despite the error"

# A file of the same name on node1 that holds other tensors (another run's) is not that checkpoint.
# One process per node touches node1's scratch: with 2 ranks on node1, two cp's racing to
# create the same file fail with "File exists".
on_node1_once() {
  "$CLUSTER_SIM_MPIRUN" sh -c "[ \$(hostname) = node0 ] || [ \${OMPI_COMM_WORLD_LOCAL_RANK:-0} != 0 ] || { $1; }"
}
cp "$scratch/full/ckpt-epoch1.h5" impostor.h5
on_node1_once "mkdir -p $scratch/part && cp impostor.h5 $ckpt" || fail "could not put the other file on node1"
status=0
run "$mpigrad" train --config base.ini --train.out_dir="$scratch/part" >impostor.txt 2>&1 || status=$?
[[ $status -ne 0 ]] || { cat impostor.txt; fail "resumed from another file of the same name"; }
grep -qE "^\[rank 0/$ranks\] .*rank $((ranks / 2)) on node1 cannot read $ckpt, the checkpoint rank 0 chose: it holds tensors with CRC-32C [0-9]+, and the file rank 0 chose has [0-9]+ \(another file of the same name\)" impostor.txt ||
  { cat impostor.txt; fail "the error does not say the file on node1 is another one"; }
on_node1_once "rm -rf $scratch" || fail "could not clean node1"

# node_local: rank 0 sends it; the result is the uninterrupted run's.
run "$mpigrad" train --config base.ini --train.out_dir="$scratch/part" \
  --train.checkpoint_scope=node_local >local.txt 2>&1 || { cat local.txt; fail "the node_local resume failed"; }
grep -E "resume|sent|done after" local.txt
grep -q "resume = auto: resuming from $ckpt" local.txt || fail "did not resume from $ckpt"
grep -q "resume: rank 0 sent $ckpt to the other 1 node(s)" local.txt || fail "no line saying it was sent"
"$compare" "$scratch/full/last.h5" "$scratch/part/last.h5" 0 >/dev/null ||
  fail "the resumed run's final weights differ from the uninterrupted run's"
diff <(losses "$scratch/full/metrics.jsonl") <(losses "$scratch/part/metrics.jsonl") >/dev/null ||
  fail "the resumed run's losses differ from the uninterrupted run's"
ls /tmp/mpigrad-resume-*.h5 2>/dev/null && fail "node1's temporary copy was left behind"
echo "PASS (resume on node-local scratch, 2 x $((ranks / 2)))"
