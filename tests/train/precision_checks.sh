#!/usr/bin/env bash
# End-to-end checks of [train] precision and [distributed] reduce_dtype, each a ctest test (see
# CMakeLists.txt):
#   precision_checks.sh CHECK MPIGRAD MPIEXEC WORKDIR
#   cnn_bf16     the Fashion-MNIST CNN for 3 epochs in bf16 and in fp32, on a subsample (the first
#                12,000 training images, all 10,000 test images): test accuracies within 0.5 points
#   supcon_bf16  SupCon stage 1 trains in bf16 (its loss falls, retrieval beats chance)
#   fp16_resume  fp16 with loss scaling and grad_accum_steps + clip_grad_norm trains; a resumed
#                run continues from the checkpoint's loss scale, not from 2^16
#   reduce_dtype reduce_dtype = bf16 trains on 2 ranks; with compression = fp16 it is an error
#   fp16_zero    fp16 under [distributed] zero = 1 on 2 ranks, with grad_accum_steps and
#                clip_grad_norm: steps overflow and are skipped, and
#                the losses are plain DDP + fp16's; a resumed run continues from the saved scale,
#                the one plain DDP reaches too
set -euo pipefail
check=$1 mpigrad=$2 mpiexec=$3 work=$4
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

# The fp16 checks' small synthetic set (640 training and 200 test images of 1x8x8) and the
# [data] and [model] sections of config $1 that train an MLP on it.
small_mlp_setup() {
  "$mpigrad" data synth -o train.h5 --samples 640 --shape 1,8,8 --seed 1 > /dev/null
  "$mpigrad" data synth -o test.h5 --samples 200 --shape 1,8,8 --seed 1 > /dev/null
  printf '[data]\ntrain = train.h5\ntest = test.h5\nnum_classes = 10\n[model]\nname = mlp\nhidden = 32\n' > "$1"
}

case "$check" in
  cnn_bf16)
    idx=/usr/share/datasets/fashion-mnist  # Debian's dataset-fashion-mnist (install-deps.sh)
    [ -f "$idx/train-images-idx3-ubyte.gz" ] || fail "no Fashion-MNIST in $idx (scripts/install-deps.sh)"
    "$mpigrad" data convert-idx --images "$idx/train-images-idx3-ubyte.gz" \
        --labels "$idx/train-labels-idx1-ubyte.gz" -o train.h5 --shards 5 > /dev/null
    "$mpigrad" data convert-idx --images "$idx/t10k-images-idx3-ubyte.gz" \
        --labels "$idx/t10k-labels-idx1-ubyte.gz" -o test.h5 > /dev/null
    cat > cnn.ini <<INI
[data]
train = train-00000-of-00005.h5
test = test.h5
num_classes = 10
mean = 0.2860
std = 0.3530
[model]
name = cnn
channels = 16, 32
hidden = 128
dropout = 0
[optim]
name = sgd
lr = 0.05
momentum = 0.9
weight_decay = 0.0001
[sched]
name = cosine
warmup_steps = 50
[train]
epochs = 3
batch_size = 64
seed = 1
log_every = 50
INI
    run 2 "$mpigrad" train --config cnn.ini --train.out_dir=fp32 > fp32.txt 2>&1 || { cat fp32.txt; fail "fp32 run failed"; }
    run 2 "$mpigrad" train --config cnn.ini --train.out_dir=bf16 --train.precision=bf16 > bf16.txt 2>&1 || { cat bf16.txt; fail "bf16 run failed"; }
    grep -q "precision bf16: matmul, linear and conv2d in bfloat16" bf16.txt || { cat bf16.txt; fail "no precision line"; }
    a32=$(final_accuracy fp32.txt) a16=$(final_accuracy bf16.txt)
    echo "test accuracy: fp32 $a32, bf16 $a16"
    at_least "$a32" 0.8 || fail "fp32 accuracy $a32 too low for the comparison to mean anything"
    awk -v a="$a32" -v b="$a16" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }' ||
      fail "bf16 accuracy $a16 is more than 0.5 points from fp32's $a32"
    ;;
  supcon_bf16)
    "$mpigrad" data synth -o train.h5 --samples 800 --shape 1,12,12 --seed 1 > /dev/null
    "$mpigrad" data synth -o test.h5 --samples 301 --shape 1,12,12 --seed 1 > /dev/null
    cat > supcon.ini <<INI
[data]
train = train.h5
test = test.h5
num_classes = 10
augment = crop:2,flip,noise:0.05
[model]
name = cnn
channels = 8,16
hidden =
projection = 16
[loss]
temperature = 0.1
[optim]
name = adam
lr = 0.003
[train]
stage = supcon
precision = bf16
epochs = 3
batch_size = 32
seed = 3
log_every = 5
out_dir = stage1
INI
    run 2 "$mpigrad" train --config supcon.ini > stage1.txt 2>&1 || { cat stage1.txt; fail "supcon in bf16 failed"; }
    grep -q "stage supcon" stage1.txt || fail "no stage line"
    grep -q "precision bf16" stage1.txt || fail "no precision line"
    first=$(losses stage1/metrics.jsonl | sed -n 1p) last=$(losses stage1/metrics.jsonl | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.9 * a) }' || fail "SupCon loss did not fall in bf16: $first -> $last"
    p1=$(grep '"test_precision_at_1"' stage1/metrics.jsonl | tail -1 | sed -E 's/.*"test_precision_at_1": ([-0-9.e]+).*/\1/')
    at_least "$p1" 0.8 || fail "precision@1 $p1 not above chance (0.1) by a margin"
    ;;
  fp16_resume)
    small_mlp_setup fp16.ini
    cat >> fp16.ini <<INI
[optim]
lr = 0.05
momentum = 0.9
[train]
precision = fp16
loss_scale_growth_interval = 3
grad_accum_steps = 2
clip_grad_norm = 5
epochs = 2
batch_size = 16
seed = 3
log_every = 1
INI
    run 2 "$mpigrad" train --config fp16.ini --train.out_dir=full > full.txt 2>&1 || { cat full.txt; fail "fp16 run failed"; }
    grep -q "fp16 loss scale 65536 (0 clean steps toward growth, 0 skipped)" full.txt || { cat full.txt; fail "no starting scale line"; }
    first=$(losses full/metrics.jsonl | sed -n 1p) last=$(losses full/metrics.jsonl | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.9 * a) }' || fail "fp16 loss did not fall: $first -> $last"
    accuracy=$(final_accuracy full.txt)
    at_least "$accuracy" 0.8 || fail "fp16 accuracy $accuracy not above chance (0.1) by a margin"
    # Epoch 1 is 10 optimizer steps (640 / 2 ranks / 16 / 2 micro-batches): with growth every 3
    # clean steps the scale has grown 3 times (2^19) and 1 step counts toward the next growth.
    run 2 "$mpigrad" train --config fp16.ini --train.out_dir=part --train.epochs=1 > part1.txt 2>&1 || fail "first half failed"
    run 2 "$mpigrad" train --config fp16.ini --train.out_dir=part --train.resume=part/ckpt-epoch1.h5 > part2.txt 2>&1 || { cat part2.txt; fail "resumed run failed"; }
    grep -q "fp16 loss scale 524288 (1 clean steps toward growth, 0 skipped)" part2.txt ||
      { grep "loss scale" part2.txt; fail "the resumed run did not continue from the saved scale"; }
    diff <(losses full/metrics.jsonl) <(losses part/metrics.jsonl) || fail "resumed fp16 losses differ"
    ;;
  reduce_dtype)
    "$mpigrad" data synth -o train.h5 --samples 400 --shape 1,8,8 --seed 1 > /dev/null
    printf '[data]\ntrain = train.h5\nnum_classes = 10\n[model]\nname = mlp\nhidden = 16\n[train]\nepochs = 1\nbatch_size = 16\nlog_every = 5\n' > base.ini
    run 2 "$mpigrad" train --config base.ini --train.out_dir=out --train.precision=bf16 \
        --distributed.reduce_dtype=bf16 > log.txt 2>&1 || { cat log.txt; fail "reduce_dtype = bf16 failed"; }
    expect_error "reduce_dtype = bf16 and compression = fp16" --config base.ini \
        --distributed.reduce_dtype=bf16 --distributed.compression=fp16
    expect_error "reduce_dtype" --config base.ini --distributed.reduce_dtype=fp16
    expect_error "precision" --config base.ini --train.precision=int8
    ;;
  fp16_zero)
    small_mlp_setup zero.ini
    # Growth after every clean step drives the scale into fp16's range limit within a few steps,
    # so some steps overflow (8 of epoch 1's 20 here) and must be skipped on both ranks alike.
    # Small buckets: the MLP's gradients span several, each reduce-scattered.
    cat >> zero.ini <<INI
[optim]
name = adamw
lr = 0.01
[train]
precision = fp16
loss_scale_growth_interval = 1
clip_grad_norm = 5
grad_accum_steps = 2
epochs = 2
batch_size = 8
shuffle = false
seed = 3
log_every = 1
[distributed]
bucket_cap_mb = 0.002
INI
    run 2 "$mpigrad" train --config zero.ini --train.out_dir=plain > plain.txt 2>&1 || { cat plain.txt; fail "plain fp16 run failed"; }
    run 2 "$mpigrad" train --config zero.ini --distributed.zero=1 --train.out_dir=zero > zero.txt 2>&1 || { cat zero.txt; fail "ZeRO-1 fp16 run failed"; }
    grep -q "ZeRO-1: reduce-scattered, optimizer state sharded" zero.txt || { cat zero.txt; fail "the log does not say ZeRO-1"; }
    paste <(losses plain/metrics.jsonl) <(losses zero/metrics.jsonl) > pairs.txt
    [ "$(grep -c . pairs.txt)" = 40 ] || fail "expected 40 steps, got $(grep -c . pairs.txt)"
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) exit 1 }' pairs.txt ||
      fail "ZeRO-1 + fp16 losses differ from plain DDP + fp16's: $(awk '$1 != $2' pairs.txt | sed -n 1p)"
    # Epoch 1, then a resumed epoch 2, under ZeRO-1; and epoch 1 without it, resumed likewise.
    run 2 "$mpigrad" train --config zero.ini --distributed.zero=1 --train.out_dir=part --train.epochs=1 > part1.txt 2>&1 || { cat part1.txt; fail "first half failed"; }
    run 2 "$mpigrad" train --config zero.ini --distributed.zero=1 --train.out_dir=part --train.resume=part/ckpt-epoch1.h5 > part2.txt 2>&1 || { cat part2.txt; fail "resumed ZeRO-1 run failed"; }
    run 2 "$mpigrad" train --config zero.ini --train.out_dir=ppart --train.epochs=1 > /dev/null 2>&1 || fail "plain first half failed"
    run 2 "$mpigrad" train --config zero.ini --train.out_dir=ppart --train.resume=ppart/ckpt-epoch1.h5 > ppart2.txt 2>&1 || { cat ppart2.txt; fail "resumed plain run failed"; }
    resumed=$(grep -m1 "fp16 loss scale" part2.txt) || { cat part2.txt; fail "no loss scale line"; }
    expected=$(grep -m1 "fp16 loss scale" ppart2.txt) || fail "no loss scale line in the plain run"
    echo "resumed under ZeRO-1: $resumed"
    [ "$resumed" = "$expected" ] || fail "ZeRO-1 resumed with '$resumed', plain DDP with '$expected'"
    grep -q "fp16 loss scale 65536 " part2.txt && fail "the resumed run started from 2^16, not the saved scale"
    grep -qE "[1-9][0-9]* skipped\)" <<< "$resumed" || fail "no step was skipped in epoch 1: $resumed"
    diff <(losses zero/metrics.jsonl) <(losses part/metrics.jsonl) || fail "resumed ZeRO-1 fp16 losses differ"
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
