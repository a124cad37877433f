#!/usr/bin/env bash
# Regenerates the committed seed corpus fuzz/corpus/<target>/ with the project's own tools:
# fuzz_make_seeds (HDF5's C API: fields, layouts, links, cycles, attributes; tiny IDX pairs),
# `mpigrad data synth`, and the example configs plus a few written here. Needs a build with the
# tests (fuzz_make_seeds and bin/mpigrad); the default is build-cpu.
#     fuzz/make_corpus.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build-cpu}" && pwd)
corpus=$root/fuzz/corpus
rm -rf "$corpus"
mkdir -p "$corpus/fuzz_hdf5" "$corpus/fuzz_config" "$corpus/fuzz_idx" "$corpus/fuzz_onnx"

"$build/fuzz/fuzz_make_seeds" "$corpus/fuzz_hdf5" "$corpus/fuzz_idx"
"$build/fuzz/fuzz_make_onnx_seeds" "$corpus/fuzz_onnx"
mpigrad=$build/bin/mpigrad
"$mpigrad" data synth -o "$corpus/fuzz_hdf5/synth_uint8.h5" -n 4 --shape 1,2,2 >/dev/null
"$mpigrad" data synth -o "$corpus/fuzz_hdf5/synth_float32_gzip.h5" -n 6 --shape 3 \
  --dtype float32 --chunk-rows 2 --gzip 1 --label-dtype int32 >/dev/null

cp "$root"/examples/*.ini "$root"/examples/insitu/*.ini "$corpus/fuzz_config/" 2>/dev/null || true
cat > "$corpus/fuzz_config/every_section.ini" <<'INI'
[data]
train = a.h5, b.h5
test = t.h5
x = images
y = labels
num_classes = 3
mean = 0.5, 0.25
std = 1, 2
[model]
name = conv
channels = 4, 8
input_shape = 2, 6, 6
kernel_size = 5
padding_mode = circular
[loss]
name = cross_entropy
[optim]
name = adamw
lr = 1e-3
weight_decay = 0.01
[sched]
name = multistep
milestones = 10, 20
gamma = 0.5
[train]
epochs = 2
max_steps = 30
batch_size = 8
seed = 42
shuffle = false
grad_accum_steps = 2
clip_grad_norm = 1.5
ema_decay = 0.999
save_initial = true
[distributed]
backend = mpi
bucket_cap_mb = 0.5
sync_bn = true
compression = fp16
shared_memory = false
timeout_s = 30
INI
cat > "$corpus/fuzz_config/step_schedule.ini" <<'INI'
[model]
name = mlp
hidden = 8
dropout = 0.25
[sched]
name = step
step_size = 5
warmup_steps = 2
total_steps = 40
[train]
max_steps = 40
INI
du -sh "$corpus"/*
