#!/usr/bin/env bash
# The C API and `mpigrad train` take the same step: on 2 ranks, with gradient accumulation,
# clipping, fp16 loss scaling, ZeRO-1 and a cosine schedule, both train one epoch on the same
# batches (the host program feeds each rank what mpigrad train's sampler gives it), and the
# weights and the loss scaler's state they end with must be bitwise equal.
# Arguments: mpigrad, the host program, mpigrad-compare-checkpoints, mpiexec, a scratch folder.
set -euo pipefail
mpigrad=$1 host=$2 compare=$3 mpiexec=$4 work=$5
rm -rf "$work"
mkdir -p "$work"
cd "$work"
run() { "$mpiexec" -n 2 --oversubscribe "$@"; }

cat > common.ini <<'INI'
[model]
name = mlp
hidden = 16,16
input_shape = 8
outputs = 4
[loss]
name = cross_entropy
[optim]
name = sgd
lr = 0.2
momentum = 0.9
weight_decay = 0.01
[sched]
name = cosine
warmup_steps = 1
total_steps = 8
[train]
seed = 3
grad_accum_steps = 2
clip_grad_norm = 0.5
precision = fp16
loss_scale_growth_interval = 2
[distributed]
zero = 1
INI

run "$host" write data.h5
run "$mpigrad" train --config common.ini --data.train=data.h5 --data.num_classes=4 \
  --train.epochs=1 --train.batch_size=4 --train.shuffle=false --train.out_dir=run \
  --train.log_every=1 --train.tensorboard=false > train.log
grep -q "ZeRO-1" train.log || { echo "mpigrad train did not run ZeRO-1:"; cat train.log; exit 1; }
run "$host" train common.ini data.h5 host.h5 4

"$compare" run/ckpt-epoch1.h5 host.h5 0 model
"$compare" run/ckpt-epoch1.h5 host.h5 0 hooks/loss_scaler | tee scaler.txt
# The run must have met an overflow, so both skipped the same step(s) and lowered the scale.
grep -Eq "scalar skipped_steps = [1-9]" scaler.txt || { echo "no step was skipped"; exit 1; }
echo "same step: the C API's weights and loss scale equal mpigrad train's, bit for bit"
