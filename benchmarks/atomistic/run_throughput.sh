#!/usr/bin/env bash
# Throughput of interatomic-potential training in graphs/s, at 1 and 2 ranks: `mpigrad train`
# against a plain PyTorch loop and ALCHEMI's own training stack, on the same store and model.
# Optional (needs the venv of throughput.py); CI never runs it. From the repository root:
#
#   benchmarks/atomistic/run_throughput.sh BUILD_DIR WORK_DIR [ROUNDS] [PYTHON]
#
# WORK_DIR gets the store and the exported model (throughput.py store) unless it has them.
# Each round runs every arm once, in turn (A B C D A B C D ...), so a change in the machine's load
# falls on all arms alike; the table gives each arm's median over the rounds and the load average
# before and after. Arms, all with batches of 32 structures per rank, energy + 10 x force loss,
# AdamW (lr 1e-3), one thread per rank:
#   mpigrad-onnx     mpigrad train on schnet.onnx (the PyTorch model, exported), [graph] cutoff 3
#                    (the neighbor list rebuilt for every batch in C++)
#   mpigrad-schnet   mpigrad train, the built-in [model] name = schnet of the same shape (hidden
#                    64, n_rbf 20, 2 interactions; 101 embedding rows, so 44,417 parameters)
#   torch            the plain PyTorch loop on the store's precomputed neighbor lists, 64 steps
#   alchemi          ALCHEMI's TrainingStrategy, its loader and NeighborListHook, 24 steps
# Two figures per run. graphs/s: mpigrad's own end-of-run "throughput" of a 3-epoch run (every
# step, the first included); the Python arms' over their timed steps after 3 warm-up steps.
# Graphs per CPU-second, the figure per core that a loaded machine does not distort as much:
# mpigrad's from the CPU time (all ranks) of a 3-epoch run less that of a 1-epoch run, the Python
# arms' from rank 0's process CPU time over its timed steps (its structures only).
set -euo pipefail
build=$(cd "$1" && pwd) work=$2 rounds=${3:-3} python=${4:-/work/venv/bin/python}
here=$(cd "$(dirname "$0")" && pwd)
mpigrad=$build/bin/mpigrad
torchrun=$(dirname "$python")/torchrun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIGRAD_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$work"
[ -f "$work/schnet.onnx" ] || "$python" "$here/throughput.py" store "$work"
cd "$work"
cat > bench.ini <<INI
[data]
train = clusters.zarr
[model]
name = onnx
file = schnet.onnx
hidden = 64
n_rbf = 20
interactions = 2
[graph]
cutoff = 3.0
[loss]
name = energy_force
energy_weight = 1
force_weight = 10
stress_weight = 0
[optim]
name = adamw
lr = 0.001
[train]
epochs = 3
batch_size = 32
log_every = 16
tensorboard = false
out_dir = out
INI

# One arm at R ranks: prints "graphs/s graphs-per-CPU-second".
arm() {
  local name=$1 ranks=$2
  case "$name" in
    mpigrad-onnx|mpigrad-schnet)
      local model=onnx
      [ "$name" = mpigrad-schnet ] && model=schnet
      # CPU seconds of 1 and of 3 epochs, all ranks together: their difference is 2 epochs'
      # steps, without the start-up (reading the model, the first batch, MPI).
      local cpu=()
      for epochs in 1 3; do
        /usr/bin/time -f "cpu %U %S" -o time.txt mpirun -np "$ranks" "$mpigrad" train \
          --config bench.ini --model.name=$model --train.epochs=$epochs > $name.log 2>&1
        cpu+=("$(awk '{ print $2 + $3 }' time.txt)")
      done
      local rate
      rate=$(sed -nE 's/.*throughput ([0-9.]+) samples\/s.*/\1/p' $name.log)
      awk -v r="$rate" -v a="${cpu[0]}" -v b="${cpu[1]}" -v n="$structures" \
        'BEGIN { printf "%s %.1f\n", r, 2 * n / (b - a) }' ;;
    torch|alchemi)
      local launch=("$python")
      ((ranks > 1)) && launch=("$torchrun" --standalone --nproc_per_node "$ranks")
      local steps=64
      [ "$name" = alchemi ] && steps=24
      "${launch[@]}" "$here/throughput.py" "$name" . --steps $steps > $name.log 2>&1
      sed -nE 's/.*CPU-second of rank 0 ([0-9.]+); graphs\/s ([0-9.]+).*/\2 \1/p' $name.log | head -1 ;;
  esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

structures=2048
arms="mpigrad-onnx torch mpigrad-schnet alchemi"
for ranks in 1 2; do
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  declare -A wall=() cpu=()
  for ((round = 1; round <= rounds; ++round)); do
    for name in $arms; do
      read -r value per_cpu < <(arm "$name" "$ranks") || true
      [ -n "${per_cpu:-}" ] || { cat "$name.log"; echo "no figure from $name" >&2; exit 1; }
      wall[$name]+="$value " cpu[$name]+="$per_cpu "
      echo "ranks $ranks round $round $name: $value graphs/s, $per_cpu graphs per CPU-second" >&2
    done
  done
  echo "## $ranks rank(s), $rounds rounds; load average before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)"
  for name in $arms; do
    echo "$name: median $(echo ${wall[$name]} | tr ' ' '\n' | median) graphs/s (runs: ${wall[$name]}), "\
"$(echo ${cpu[$name]} | tr ' ' '\n' | median) graphs per CPU-second (runs: ${cpu[$name]})"
  done
  unset wall cpu
done
