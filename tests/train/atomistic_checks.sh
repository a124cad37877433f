#!/usr/bin/env bash
# End-to-end checks of `mpigrad train` on interatomic potentials ([loss] name = energy_force),
# each a ctest test:
#   atomistic_checks.sh CHECK MPIGRAD COMPARE MPIEXEC WORKDIR MAKE_ATOMIC_STORE
# The stores are small HDF5 files in ALCHEMI's layout (meta/atoms_ptr, core/<field>) written by
# make-atomic-store: structures of 2 to 6 atoms labelled by a Morse potential, half of them
# periodic in a triclinic cell.
set -euo pipefail
check=$1 mpigrad=$2 compare=$3 mpiexec=$4 work=$5 make_store=$6
data="$(cd "$(dirname "$0")/../data/atomistic" && pwd)"
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

"$make_store" train.h5 48 1 > /dev/null
"$make_store" test.h5 13 2 > /dev/null  # odd: two ranks pad one repeat
cat > base.ini <<INI
[data]
train = train.h5
test = test.h5
[model]
name = schnet
hidden = 16
n_rbf = 8
interactions = 2
[graph]
cutoff = 2.4
[loss]
name = energy_force
energy_weight = 1
force_weight = 10
stress_weight = 1
[optim]
name = adamw
lr = 0.005
[train]
epochs = 2
batch_size = 4
seed = 3
log_every = 2
tensorboard = false
INI

# The test_loss of every evaluation, one per line.
test_losses() { grep '"test_loss"' "$1" | sed -E 's/.*"test_loss": ([^,]+),.*/\1/'; }

# Every loss logged is a finite number, and the run printed its test figures.
finite_run() {
  local out=$1 log=$2
  [ -s "$out/metrics.jsonl" ] || { cat "$log"; fail "no $out/metrics.jsonl"; }
  if grep -Eiq 'nan|inf' "$out/metrics.jsonl"; then cat "$out/metrics.jsonl"; fail "non-finite metrics in $out"; fi
  grep -q "test energy MAE .* per atom, force MAE .*, RMSE" "$log" || { cat "$log"; fail "no test figures in $log"; }
}

case "$check" in
  train)  # 1 and 2 ranks: the loss falls, test metrics over all atoms are logged
    for ranks in 1 2; do
      run $ranks "$mpigrad" train --config base.ini --train.out_dir=out$ranks --train.epochs=4 \
        > log$ranks.txt 2>&1 || { cat log$ranks.txt; fail "training on $ranks rank(s) failed"; }
      finite_run out$ranks log$ranks.txt
      grep -q "interatomic potential SchNet(hidden=16, n_rbf=8, interactions=2, cutoff=2.4)" log$ranks.txt \
        || { cat log$ranks.txt; fail "no model line"; }
      for metric in test_loss test_energy_mae_per_atom test_energy_rmse_per_atom test_force_mae \
                    test_force_rmse test_stress_mae; do
        grep -q "\"$metric\"" out$ranks/metrics.jsonl || fail "no $metric in metrics.jsonl"
      done
      grep -q "force_abs_error_sum" out$ranks/metrics.jsonl && fail "intermediate sums were logged"
      first=$(test_losses out$ranks/metrics.jsonl | sed -n 1p) last=$(test_losses out$ranks/metrics.jsonl | tail -1)
      awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.7 * a) }' || fail "test loss did not fall on $ranks rank(s): $first -> $last"
    done
    grep -q "(13 samples)" log2.txt || { cat log2.txt; fail "the padded test set was not counted once"; }
    ;;
  ranks)  # 1 rank with batch 2B takes the same steps as 2 ranks with batch B
    run 1 "$mpigrad" train --config base.ini --train.out_dir=one --train.shuffle=false \
      --optim.name=sgd --optim.lr=0.01 --train.batch_size=8 > one.txt 2>&1 || { cat one.txt; fail "1-rank run failed"; }
    run 2 "$mpigrad" train --config base.ini --train.out_dir=two --train.shuffle=false \
      --optim.name=sgd --optim.lr=0.01 --train.batch_size=4 > two.txt 2>&1 || { cat two.txt; fail "2-rank run failed"; }
    "$compare" one/last.h5 two/last.h5 2e-5 || fail "1 x 2B and 2 x B disagree"
    ;;
  features)  # EMA, clipping, bf16, ZeRO-1, a weight switch and Huber each train to finite numbers
    run 2 "$mpigrad" train --config base.ini --train.out_dir=ema --train.ema_decay=0.9 \
      --train.clip_grad_norm=1.0 > ema.txt 2>&1 || { cat ema.txt; fail "EMA and clipping failed"; }
    finite_run ema ema.txt
    grep -q "evaluation uses the EMA" ema.txt || fail "EMA not reported"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=bf16 --train.precision=bf16 \
      > bf16.txt 2>&1 || { cat bf16.txt; fail "bf16 failed"; }
    finite_run bf16 bf16.txt
    run 2 "$mpigrad" train --config base.ini --train.out_dir=zero --distributed.zero=1 \
      > zero.txt 2>&1 || { cat zero.txt; fail "ZeRO-1 failed"; }
    finite_run zero zero.txt
    run 2 "$mpigrad" train --config base.ini --train.out_dir=switch --loss.kind=huber \
      --loss.huber_delta=0.1 --loss.switch_step=6 --loss.force_weight_after=1 \
      --loss.energy_weight_after=20 > switch.txt 2>&1 || { cat switch.txt; fail "weight switch failed"; }
    finite_run switch switch.txt
    grep -q "loss huber (delta 0.1) of energy per atom x 1, forces x 10, stress x 1; from step 6: 20, 1, 1" switch.txt \
      || { cat switch.txt; fail "weight switch not reported"; }
    ;;
  onnx_store_lists)  # an ONNX potential on the store's own neighbor lists ([graph] cutoff = 0)
    "$make_store" clusters.h5 24 4 --neighbor-list 2.4 > /dev/null
    run 2 "$mpigrad" train --config base.ini --data.train=clusters.h5 --data.test=clusters.h5 \
      --model.name=onnx --model.file="$data/potential.scatter_add.onnx" --graph.cutoff=0 \
      --loss.stress_weight=0 --train.out_dir=onnx > onnx.txt 2>&1 || { cat onnx.txt; fail "ONNX potential failed"; }
    finite_run onnx onnx.txt
    grep -q "interatomic potential OnnxEnergyModel" onnx.txt || { cat onnx.txt; fail "no model line"; }
    grep -q "the store's neighbor lists" onnx.txt || { cat onnx.txt; fail "graph source not reported"; }
    run 1 "$mpigrad" train --config base.ini --data.train=clusters.h5 --data.test=clusters.h5 \
      --model.name=onnx --model.file="$data/potential.scatter_add.onnx" --graph.cutoff=0 \
      --loss.stress_weight=0 --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "first batch: 4 structures, .* atoms, .* edges; energy per atom" dry.txt || { cat dry.txt; fail "no first-batch line"; }
    ;;
  errors)  # each bad config: one error naming what to do, before any step
    expect_error "\[data\] train: store 'nothere.zarr' does not exist" --config base.ini --data.train=nothere.zarr
    expect_error "\[graph\] cutoff: schnet takes its cutoff from \[graph\] cutoff" --config base.ini --graph.cutoff=0
    expect_error "\[model\] hidden: schnet takes one width" --config base.ini --model.hidden=16,8
    expect_error "all 0; energy_force needs at least one term" --config base.ini \
      --loss.energy_weight=0 --loss.force_weight=0 --loss.stress_weight=0
    expect_error "reduction 'none' with a repeated index" --config base.ini --model.name=onnx \
      --model.file="$data/potential.index_add.onnx" --loss.stress_weight=0
    expect_error "is not an interatomic potential for \[loss\] name = energy_force" --config base.ini \
      --model.name=onnx --model.file="$data/../onnx/mlp.legacy.onnx"
    expect_error "\[model\] name = schnet is an interatomic potential; train it with \[loss\] name = energy_force" \
      --config base.ini --loss.name=cross_entropy
    "$make_store" clusters.h5 8 4 --neighbor-list 2.4 > /dev/null
    expect_error "has no field 'edge_index' (\[graph\] cutoff = 0 takes the store's neighbor_list" --config base.ini \
      --model.name=onnx --model.file="$data/potential.scatter_add.onnx" --graph.cutoff=0
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
