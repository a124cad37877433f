#!/usr/bin/env bash
# Profiles one zoo model's steady-state training steps in `mpigrad train` with perf: starts the
# run, waits until it has logged WARMUP steps, attaches `perf record -g` for the next STEPS steps
# and detaches, so start-up (ONNX parsing, first-touch allocation) and the final checkpoint
# (its CRC-32C) stay out of the profile. Then prints the top symbols by self time.
#
#   benchmarks/zoo/profile_zoo.sh MODEL [THREADS=1] [STEPS=20] [WARMUP=3]
#
# Needs build/bin/mpigrad, export_models.py's files in build/zoo (ZOO= to change), and perf.
# FREQ=Hz (999) and CALL_GRAPH="--call-graph dwarf" (callers through libraries built without
# frame pointers; bigger files) go to perf record. The profile is left in
# build/zoo/profiles/MODEL.tTHREADS.perf.data for `perf report -i`. On the 2-core VM,
# `profile_zoo.sh resnet18 1 30 3`, `convnext_tiny 1 5 2` and `gpt2_124m 1 3 2` each record
# 3,000-14,000 samples in a few minutes.
set -euo pipefail
model=${1:?usage: profile_zoo.sh MODEL [THREADS] [STEPS] [WARMUP]}
threads=${2:-1}
steps=${3:-20}
warmup=${4:-3}
root=$(cd "$(dirname "$0")/../.." && pwd)
zoo=${ZOO:-$root/build/zoo}
mpigrad=${MPIGRAD:-$root/build/bin/mpigrad}
if [ ! -f "$zoo/$model.ini" ]; then
  echo "profile_zoo.sh: no $zoo/$model.ini; run export_models.py" >&2
  exit 2
fi
mkdir -p "$zoo/profiles"
out_dir=$(mktemp -d "$zoo/profile-$model-XXXXXX")
data="$zoo/profiles/$model.t$threads.perf.data"
trap 'rm -rf "$out_dir"' EXIT

logged() { [ -f "$out_dir/metrics.jsonl" ] && wc -l < "$out_dir/metrics.jsonl" || echo 0; }

cd "$zoo"
MPIGRAD_NUM_THREADS=$threads OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX} \
  "$mpigrad" train --config "$model.ini" --train.max_steps=$((warmup + steps + 1)) \
  --train.out_dir="$out_dir" > "$out_dir/stdout.txt" 2>&1 &
run=$!
while [ "$(logged)" -lt "$warmup" ]; do
  kill -0 $run 2>/dev/null || { cat "$out_dir/stdout.txt" >&2; exit 1; }
  sleep 0.05
done
perf record -F ${FREQ:-999} ${CALL_GRAPH:--g} -p $run -o "$data" 2> "$out_dir/perf.txt" &
perf_pid=$!
while [ "$(logged)" -lt $((warmup + steps)) ]; do
  kill -0 $run 2>/dev/null || break
  sleep 0.05
done
kill -INT $perf_pid
wait $perf_pid || true
wait $run
echo "$model, $threads thread(s), steps $((warmup + 1))-$((warmup + steps)): $data"
perf report -i "$data" --no-children --sort dso,symbol --stdio -g none --percent-limit 0.7 \
  2>/dev/null | grep '%' | sed -e 's/  */ /g' | cut -c1-150
