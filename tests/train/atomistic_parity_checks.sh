#!/usr/bin/env bash
# Training parity of `mpigrad train` with PyTorch on an interatomic potential, each a ctest test:
#   atomistic_parity_checks.sh CHECK MPIGRAD MPIEXEC WORKDIR
# tests/data/atomistic/parity.* were written by benchmarks/atomistic/make_parity.py: a store of 16
# small structures written by nvalchemi-toolkit's AtomicDataZarrWriter, a SchNet-like potential
# exported by PyTorch's legacy and dynamo exporters, and PyTorch's loss at each of 20 AdamW steps
# of energy + 10 x force training (forces by create_graph) on batches of 4 in store order.
# mpigrad trains the exported graph with its own neighbor lists ([graph] cutoff = 3); every
# step's loss must be within 1e-4 (relative) of PyTorch's.
set -euo pipefail
check=$1 mpigrad=$2 mpiexec=$3 work=$4
data="$(cd "$(dirname "$0")/../data/atomistic" && pwd)"
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

cat > parity.ini <<INI
[data]
train = $data/parity.zarr
[model]
name = onnx
[graph]
cutoff = 3.0
[loss]
name = energy_force
energy_weight = 1
force_weight = 10
stress_weight = 0
per_atom_energy = true
kind = mse
[optim]
name = adamw
lr = 0.002
weight_decay = 0.01
[train]
epochs = 5
batch_size = 4
shuffle = false
log_every = 1
tensorboard = false
INI

# Every logged step's loss against the reference's, in order; all 20 of them.
compare() {
  local metrics=$1
  losses "$metrics" > mpigrad.txt
  grep -v '^#' "$data/parity_reference.txt" | awk '{ print $2 }' > torch.txt
  [ "$(wc -l < mpigrad.txt)" -eq 20 ] || { cat "$metrics"; fail "expected 20 logged steps"; }
  paste mpigrad.txt torch.txt | awk '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r
      if (r > 1e-4) { printf "step %d: mpigrad %s, PyTorch %s (relative %.2g)\n", NR, $1, $2, r; bad = 1 } }
    END { printf "largest relative difference over 20 steps: %.2g\n", worst; exit bad }' \
    || fail "losses differ from PyTorch's by more than 1e-4"
}

case "$check" in
  legacy|dynamo)  # one rank, the graph of either exporter
    run 1 "$mpigrad" train --config parity.ini --model.file="$data/parity.$check.onnx" \
      --train.out_dir=out > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    grep -q "onnx, 2761 parameters" log.txt || { cat log.txt; fail "not the reference's 2761 parameters"; }
    compare out/metrics.jsonl
    ;;
  ranks)  # two ranks of 2 structures take PyTorch's steps on 4
    run 2 "$mpigrad" train --config parity.ini --model.file="$data/parity.legacy.onnx" \
      --train.batch_size=2 --train.out_dir=out > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    compare out/metrics.jsonl
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
