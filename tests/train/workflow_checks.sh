#!/usr/bin/env bash
# End-to-end checks of the ResNet model, `mpigrad lr-find` and `mpigrad swa` (and in-training
# SWA), each a ctest test (see CMakeLists.txt):
#   workflow_checks.sh CHECK MPIGRAD COMPARE MPIEXEC WORKDIR
# They run the real program under mpirun on small synthetic data written by `mpigrad data synth`.
set -euo pipefail
check=$1 mpigrad=$2 compare=$3 mpiexec=$4 work=$5
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

# A subcommand run that must fail before any work: non-zero exit, the pattern, the rank.
expect_command_error() {
  local pattern=$1; shift
  if run 2 "$mpigrad" "$@" > out.txt 2>&1; then cat out.txt; fail "expected failure: $*"; fi
  grep -q -- "$pattern" out.txt || { cat out.txt; fail "missing '$pattern' for: $*"; }
  grep -q "^\[rank [0-9]/2\]" out.txt || { cat out.txt; fail "error does not name the rank: $*"; }
  return 0
}
# The test accuracy `mpigrad swa` printed.
swa_accuracy() { sed -nE 's/.*mpigrad swa: .*test accuracy ([0-9.]+).*/\1/p' "$1"; }
# Column N of a CSV without its header.
column() { tail -n +2 "$1" | cut -d, -f"$2"; }

cat > cnn.ini <<EOF
[data]
train = train.h5
test = test.h5
num_classes = 10
[model]
name = cnn
channels = 16
hidden = 32
[optim]
lr = 0.05
momentum = 0.9
[train]
epochs = 5
batch_size = 32
seed = 3
log_every = 10
EOF

case "$check" in
  resnet)  # ResNet-18 trains under DDP with SyncBatchNorm inside its blocks; a bad depth is an error
    "$mpigrad" data synth -o train.h5 --samples 400 --shape 3,8,8 --seed 1 > /dev/null
    "$mpigrad" data synth -o test.h5 --samples 101 --shape 3,8,8 --seed 1 > /dev/null
    resnet=(--config cnn.ini --model.name=resnet --model.width=4 --train.epochs=2
            --train.batch_size=16 --train.log_every=5)
    run 2 "$mpigrad" train "${resnet[@]}" --distributed.sync_bn=true --train.out_dir=out > log.txt 2>&1 \
      || { cat log.txt; fail "resnet training failed"; }
    # bn1, two per block (8 blocks) and the 3 downsample BatchNorms: all found inside the blocks.
    grep -q "20 BatchNorm layer(s) synchronized" log.txt || { cat log.txt; fail "SyncBatchNorm did not reach the blocks"; }
    first=$(losses out/metrics.jsonl | sed -n 1p) last=$(losses out/metrics.jsonl | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.7 * a) }' || { cat log.txt; fail "resnet loss did not fall: $first -> $last"; }
    # Two short epochs leave BatchNorm's running statistics young: well above chance (0.1) is
    # what is asked here, the loss's fall is the real check.
    accuracy=$(final_accuracy log.txt)
    at_least "$accuracy" 0.3 || { cat log.txt; fail "resnet test accuracy $accuracy < 0.3"; }
    # ResNet-34 builds and steps.
    run 2 "$mpigrad" train "${resnet[@]}" --model.depth=34 --train.max_steps=2 --train.out_dir=deep > deep.txt 2>&1 \
      || { cat deep.txt; fail "resnet-34 failed"; }
    expect_error "\[model\] depth: resnet has depth 18 or 34" "${resnet[@]}" --model.depth=50
    ;;
  lr_find)  # the sweep's CSV, early stop, the same curve on 1 x 2B and 2 x B, nothing else written
    "$mpigrad" data synth -o train.h5 --samples 1200 --shape 1,8,8 --seed 1 > /dev/null
    "$mpigrad" data synth -o test.h5 --samples 101 --shape 1,8,8 --seed 1 > /dev/null
    mkdir out && cp test.h5 out/existing.h5 && before=$(md5sum out/existing.h5)
    # An MLP: without BatchNorm, 1 x 2B and 2 x B compute the same losses.
    sweep=(--config cnn.ini --model.name=mlp --train.out_dir=out --train.shuffle=false
           --start 1e-5 --end 1e4 --steps 60)
    run 2 "$mpigrad" lr-find "${sweep[@]}" --train.batch_size=16 --output two.csv > two.txt 2>&1 \
      || { cat two.txt; fail "lr-find on 2 ranks failed"; }
    head -1 two.csv | grep -qx "step,lr,loss,smoothed_loss" || fail "bad CSV header: $(head -1 two.csv)"
    rows=$(($(wc -l < two.csv) - 1))
    [ "$rows" -ge 20 ] && [ "$rows" -lt 60 ] || { cat two.txt; fail "expected an early stop before 60 steps, got $rows rows"; }
    grep -q "stopped early: the smoothed loss exceeded 4x its minimum" two.txt || { cat two.txt; fail "early stop not reported"; }
    [ "$(column two.csv 2 | sed -n 1p)" = "1e-05" ] || fail "the first lr is not --start"
    # lr_i = start * (end/start)^(i/59): every ratio is (1e9)^(1/59)
    column two.csv 2 | awk 'BEGIN { q = exp(log(1e9) / 59) }
      NR > 1 { r = $1 / p / q; if (r < 0.99999 || r > 1.00001) { print "ratio " r * q; exit 1 } } { p = $1 }' \
      || fail "the lrs are not geometric"
    # The smoothed loss: the bias-corrected EMA (beta 0.98) of the loss column.
    tail -n +2 two.csv | awk -F, '{ a = 0.98 * a + 0.02 * $3; s = a / (1 - 0.98 ^ NR); d = s - $4; if (d < 0) d = -d;
      if (d > 1e-6 * (1 + $4)) { print "row " NR ": " s " vs " $4; exit 1 } }' || fail "smoothed_loss is not the bias-corrected EMA"
    grep -qE "suggested lr [0-9.e+-]+ \(steepest descent of the smoothed loss" two.txt || { cat two.txt; fail "no suggestion with its rule"; }
    # One rank with batch 2B sees what two ranks with batch B see: the loss is averaged over ranks.
    run 1 "$mpigrad" lr-find "${sweep[@]}" --train.batch_size=32 --output one.csv > one.txt 2>&1 \
      || { cat one.txt; fail "lr-find on 1 rank failed"; }
    paste -d, <(column one.csv 3 | head -15) <(column two.csv 3 | head -15) | awk -F, '{ d = $1 - $2; if (d < 0) d = -d;
      if (d > 1e-4 * (1 + $1)) { print NR ": " $1 " vs " $2; exit 1 } }' || fail "1 x 2B and 2 x B curves differ"
    [ "$(md5sum out/existing.h5)" = "$before" ] || fail "lr-find changed a file in out_dir"
    [ "$(ls out)" = "existing.h5" ] || fail "lr-find wrote into out_dir: $(ls out)"
    ls | grep -q '\.tmp' && fail "temporary file left behind"
    expect_command_error "\-\-start must be a positive number" lr-find --config cnn.ini --start 0
    expect_command_error "\-\-end (0.001) must be above \-\-start (0.01)" lr-find --config cnn.ini --start 0.01 --end 0.001
    expect_command_error "\-\-steps: expected an integer >= 2" lr-find --config cnn.ini --steps 1
    ;;
  lr_find_range)  # item 9: with the CNN example's model and optimizer the suggestion is in [3e-3, 0.3]
    "$mpigrad" data synth -o train.h5 --samples 2000 --shape 1,28,28 --seed 1 > /dev/null
    "$mpigrad" data synth -o test.h5 --samples 100 --shape 1,28,28 --seed 1 > /dev/null
    example=$(dirname "$0")/../../examples/fashion_mnist_cnn.ini
    run 2 "$mpigrad" lr-find --config "$example" --data.train=train.h5 --data.test=test.h5 \
      --output lr.csv > log.txt 2>&1 || { cat log.txt; fail "lr-find failed"; }
    suggested=$(sed -nE 's/.*suggested lr ([0-9.e+-]+) .*/\1/p' log.txt)
    echo "suggested lr $suggested"
    at_least "$suggested" 0.003 && at_least 0.3 "$suggested" || { cat log.txt; fail "suggested lr $suggested outside [3e-3, 0.3]"; }
    ;;
  swa_checkpoints)  # item 9: SWA of the last 3 epoch checkpoints >= the last checkpoint - 0.005
    # 4-pixel images: the classes overlap, so the accuracy is not saturated and can drop.
    "$mpigrad" data synth -o train.h5 --samples 2000 --shape 1,2,2 --seed 1 > /dev/null
    "$mpigrad" data synth -o test.h5 --samples 501 --shape 1,2,2 --seed 1 > /dev/null
    run 2 "$mpigrad" train --config cnn.ini --train.out_dir=out > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    last=$(final_accuracy log.txt)
    run 2 "$mpigrad" swa --config cnn.ini --checkpoints out/ckpt-epoch3.h5,out/ckpt-epoch4.h5,out/ckpt-epoch5.h5 \
      --train.out_dir=out > swa.txt 2>&1 || { cat swa.txt; fail "mpigrad swa failed"; }
    swa=$(swa_accuracy swa.txt)
    echo "last checkpoint $last, SWA of epochs 3-5 $swa"
    at_least "$swa" "$(awk -v a="$last" 'BEGIN { print a - 0.005 }')" || { cat log.txt swa.txt; fail "SWA $swa < last $last - 0.005"; }
    [ -s out/swa.h5 ] || fail "no out/swa.h5"
    ls out | grep -q '\.tmp' && fail "temporary file left in out/"
    # The comparison can fail: the average of two unrelated models (another seed) scores far lower.
    run 2 "$mpigrad" train --config cnn.ini --train.seed=11 --train.epochs=1 --train.out_dir=other > /dev/null 2>&1 || fail "other-seed run failed"
    run 2 "$mpigrad" swa --config cnn.ini --checkpoints out/ckpt-epoch5.h5,other/ckpt-epoch1.h5 -o mixed.h5 \
      > mixed.txt 2>&1 || { cat mixed.txt; fail "mpigrad swa of two seeds failed"; }
    mixed=$(swa_accuracy mixed.txt)
    echo "average of two unrelated models $mixed"
    at_least "$mixed" "$(awk -v a="$last" 'BEGIN { print a - 0.05 }')" && fail "averaging unrelated models scored $mixed (last $last): the check cannot tell"
    # The same on 1 rank with the batch of both: the ranks' BatchNorm statistics average to the
    # pass's (up to the batches' composition: a variance over 2 x 32 samples is not quite the mean
    # of two over 32, hence 1e-3).
    run 1 "$mpigrad" swa --config cnn.ini --checkpoints out/ckpt-epoch3.h5,out/ckpt-epoch4.h5,out/ckpt-epoch5.h5 \
      --train.batch_size=64 -o one.h5 > one.txt 2>&1 || { cat one.txt; fail "1-rank swa failed"; }
    "$compare" out/swa.h5 one.h5 1e-3 || fail "SWA on 1 and 2 ranks disagree"
    # A checkpoint of another model: the error names the file and the tensor.
    run 2 "$mpigrad" train --config cnn.ini --model.hidden=16 --train.epochs=1 --train.out_dir=small > /dev/null 2>&1 || fail "small run failed"
    expect_command_error "small/ckpt-epoch1.h5: tensor '5.weight' has shape \[16, 16\] but the configured \[model\] has \[32, 16\]" \
      swa --config cnn.ini --checkpoints out/ckpt-epoch5.h5,small/ckpt-epoch1.h5 -o bad.h5
    [ ! -e bad.h5 ] || fail "a failed swa wrote its output"
    expect_command_error "\-\-checkpoints: file 'nothere.h5' does not exist" swa --config cnn.ini --checkpoints nothere.h5
    expect_command_error "\-\-checkpoints: required" swa --config cnn.ini
    ;;
  swa_in_training)  # [train] swa_start/swa_lr: constant lr, swa.h5 at the end, kept across a resume
    "$mpigrad" data synth -o train.h5 --samples 2000 --shape 1,2,2 --seed 1 > /dev/null
    "$mpigrad" data synth -o test.h5 --samples 501 --shape 1,2,2 --seed 1 > /dev/null
    swa=(--config cnn.ini --train.swa_start=3 --train.swa_lr=0.02 --train.log_every=1)
    run 2 "$mpigrad" train "${swa[@]}" --train.out_dir=full > full.txt 2>&1 || { cat full.txt; fail "SWA run failed"; }
    grep -q "SWA of 3 epoch(s) from epoch 3; SWA test accuracy [0-9.]*; wrote full/swa.h5" full.txt \
      || { cat full.txt; fail "the SWA result was not reported"; }
    # Epochs 1-2 (0-based 0 and 1) at the optimizer's lr, epochs 3-5 at swa_lr.
    grep '"step"' full/metrics.jsonl | grep '"epoch": 1,' | grep '"lr": 0.05' >/dev/null || fail "epoch 2 did not keep the optimizer's lr"
    grep '"step"' full/metrics.jsonl | grep -E '"epoch": [234],' | grep -v '"lr": 0.02' >/dev/null && fail "an SWA epoch ran at another lr"
    run 2 "$mpigrad" train "${swa[@]}" --train.out_dir=part --train.epochs=4 > /dev/null 2>&1 || fail "first part failed"
    run 2 "$mpigrad" train "${swa[@]}" --train.out_dir=part --train.resume=part/ckpt-epoch4.h5 > part.txt 2>&1 \
      || { cat part.txt; fail "resumed run failed"; }
    grep -q "holds no state for hook" part.txt && fail "the resumed run lost the SWA state"
    "$compare" full/last.h5 part/last.h5 0 hooks/swa || fail "resumed SWA average differs"
    "$compare" full/swa.h5 part/swa.h5 0 || fail "resumed swa.h5 differs"
    expect_error "\[train\] swa_start: epoch 9 is after the last of \[train\] epochs = 5" --config cnn.ini --train.swa_start=9
    ;;
  *)
    fail "unknown check '$check'"
    ;;
esac
echo "PASS ($check)"
