#!/usr/bin/env bash
# End-to-end checks of two-stage training (BioEncoder's pipeline), each a ctest test (see
# CMakeLists.txt):
#   supcon_checks.sh CHECK MPIGRAD CHECK_EMBEDDINGS MPIEXEC WORKDIR
# On small synthetic images written by `mpigrad data synth`, under mpirun -np 2:
#   pipeline  supcon -> classifier (frozen encoder) -> embed -> metrics
#   errors    init_from missing or mismatched, a bad augment value, embed of a supervised run,
#             lr-find and SWA on a SupCon stage
#   resnet_encoder  both stages and embed with a ResNet-18 encoder (width 4)
set -euo pipefail
check=$1 mpigrad=$2 check_embeddings=$3 mpiexec=$4 work=$5
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

# 800 training and 301 test images of 10 classes (301: odd, so the 2 ranks' shards are padded).
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
epochs = 3
batch_size = 32
seed = 3
log_every = 5
out_dir = stage1
INI
# The encoder is the conv blocks (no hidden Linear): 16 channels x 3 x 3 = 144 features.
# Stage 2: the same [model], a linear head on the frozen encoder, no augmentation.
sed -e 's/^stage = supcon/stage = classifier\ninit_from = stage1\/last.h5/' \
    -e 's/^out_dir = stage1/out_dir = stage2/' -e '/^augment/d' supcon.ini > classifier.ini

# The value of a "test_..." metric in the last evaluation line of a metrics.jsonl.
last_metric() { grep "\"$2\"" "$1" | tail -1 | sed -E "s/.*\"$2\": ([-0-9.e]+).*/\1/"; }
in_unit() { awk -v a="$1" 'BEGIN { exit !(a >= 0 && a <= 1) }'; }

case "$check" in
  pipeline)
    run 2 "$mpigrad" train --config supcon.ini > stage1.txt 2>&1 || { cat stage1.txt; fail "supcon failed"; }
    grep -q "stage supcon" stage1.txt || fail "no stage line"
    grep -q "training augmentations: crop:2,flip,noise:0.05" stage1.txt || fail "augmentations not reported"
    first=$(losses stage1/metrics.jsonl | sed -n 1p) last=$(losses stage1/metrics.jsonl | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.9 * a) }' || fail "SupCon loss did not fall: $first -> $last"
    [ "$(grep -c '"test_precision_at_1"' stage1/metrics.jsonl)" -eq 3 ] || fail "expected 3 retrieval evaluations"
    p1=$(last_metric stage1/metrics.jsonl test_precision_at_1) map=$(last_metric stage1/metrics.jsonl test_map_at_r)
    in_unit "$p1" && in_unit "$map" || fail "retrieval metrics outside [0, 1]: $p1 $map"
    # Chance is 0.1 for both (10 balanced classes).
    at_least "$p1" 0.8 || fail "precision@1 $p1 not above chance"
    at_least "$map" 0.6 || fail "mAP@R $map not above chance"
    grep -q "(301 samples)" stage1.txt || fail "the padded test set was not counted exactly once"

    run 2 "$mpigrad" train --config classifier.ini > stage2.txt 2>&1 || { cat stage2.txt; fail "classifier failed"; }
    grep -q "encoder frozen (loaded from stage1/last.h5)" stage2.txt || fail "no frozen-encoder line"
    accuracy=$(final_accuracy stage2.txt)
    at_least "$accuracy" 0.8 || fail "classifier accuracy $accuracy not above chance (0.1) by a margin"

    run 2 "$mpigrad" embed --config supcon.ini --checkpoint stage1/last.h5 -o emb1.h5 --metrics > embed1.txt 2>&1 || { cat embed1.txt; fail "embed failed"; }
    "$check_embeddings" emb1.h5 test.h5 144 || fail "stage-1 embeddings"
    ls | grep -q '\.tmp' && fail "temporary file left behind"
    # embed --metrics gives what stage 1's last validation logged (same weights, same data).
    grep -q "precision@1 $(printf '%.4f' "$p1")  mAP@R $(printf '%.4f' "$map")" embed1.txt ||
      { cat embed1.txt; fail "embed metrics differ from training's $p1 $map"; }
    # The frozen encoder is untouched: stage 2's checkpoint embeds exactly as stage 1's.
    run 2 "$mpigrad" embed --config classifier.ini --checkpoint stage2/last.h5 -o emb2.h5 --metrics > embed2.txt 2>&1 || { cat embed2.txt; fail "embed of stage 2 failed"; }
    [ "$(grep precision embed1.txt)" = "$(grep precision embed2.txt)" ] || fail "the frozen encoder changed"
    # The training split, on 1 rank (no padding) and on 2: the same rows.
    run 2 "$mpigrad" embed --config supcon.ini --checkpoint stage1/last.h5 --split train -o train2.h5 > /dev/null 2>&1 || fail "embed --split train failed"
    "$check_embeddings" train2.h5 train.h5 144 || fail "training-split embeddings"
    ;;
  errors)
    run 1 "$mpigrad" train --config supcon.ini --train.epochs=1 --train.out_dir=ok > /dev/null 2>&1 || fail "stage 1 failed"
    expect_error "\[train\] init_from: checkpoint 'missing.h5' does not exist" --config classifier.ini --train.init_from=missing.h5
    sed '/^init_from/d' classifier.ini > no_init.ini
    expect_error "\[train\] init_from: stage = classifier needs" --config no_init.ini
    expect_error "tensor 'encoder.4.weight' has shape \[16, 8, 3, 3\] but this \[model\]'s encoder expects \[12, 8, 3, 3\]" \
      --config classifier.ini --train.init_from=ok/last.h5 --model.channels=8,12
    expect_error "init_from: only stage = classifier" --config supcon.ini --train.init_from=ok/last.h5
    expect_error "command line: --data.augment: unknown augmentation 'rotate'; accepted: crop:P" --config supcon.ini --data.augment=crop:2,rotate
    sed 's/^augment = .*/augment = flip,crop:0/' supcon.ini > bad_augment.ini
    expect_error "bad_augment.ini: \[data\] augment: crop needs a padding >= 1 (crop:4), got 'crop:0'" --config bad_augment.ini
    # A supervised run's checkpoint has no encoder.* tensors.
    sed -e 's/^stage = supcon/stage = supervised/' supcon.ini > supervised.ini
    run 1 "$mpigrad" train --config supervised.ini --train.epochs=1 --train.out_dir=sup > /dev/null 2>&1 || fail "supervised run failed"
    expect_error "holds no encoder.\* tensors" --config classifier.ini --train.init_from=sup/last.h5
    if run 2 "$mpigrad" embed --config supervised.ini --checkpoint sup/last.h5 -o e.h5 > out.txt 2>&1; then fail "embed of a supervised config"; fi
    grep -q "^\[rank 0/2\] mpigrad embed: error: .*stage = supervised has no encoder" out.txt || { cat out.txt; fail "embed error"; }
    [ -e e.h5 ] && fail "embed left an output behind"
    if run 2 "$mpigrad" embed --config supcon.ini --checkpoint nothere.h5 -o e.h5 > out.txt 2>&1; then fail "embed of a missing checkpoint"; fi
    grep -q "\-\-checkpoint: 'nothere.h5' does not exist" out.txt || { cat out.txt; fail "missing-checkpoint error"; }
    # A SupCon model has no classes: SWA (which evaluates a classifier) and lr-find refuse it.
    expect_error "\[train\] swa_start: SWA evaluates a classifier; stage = supcon" --config supcon.ini --train.swa_start=1
    if run 2 "$mpigrad" lr-find --config supcon.ini > out.txt 2>&1; then fail "lr-find of a supcon config"; fi
    grep -q "^\[rank 0/2\] mpigrad lr-find: error: \[train\] stage = supcon: lr-find sweeps stage = supervised only" out.txt || { cat out.txt; fail "lr-find stage error"; }
    ;;
  resnet_encoder)  # the ResNet trunk plugs into both stages: 8 * width features
    resnet=(--model.name=resnet --model.width=4 --train.epochs=1)
    run 2 "$mpigrad" train --config supcon.ini "${resnet[@]}" > stage1.txt 2>&1 || { cat stage1.txt; fail "resnet supcon failed"; }
    grep -q "test precision@1" stage1.txt || { cat stage1.txt; fail "no retrieval metrics"; }
    run 2 "$mpigrad" train --config classifier.ini "${resnet[@]}" > stage2.txt 2>&1 || { cat stage2.txt; fail "resnet classifier failed"; }
    grep -q "encoder frozen (loaded from stage1/last.h5)" stage2.txt || fail "no frozen-encoder line"
    run 2 "$mpigrad" embed --config supcon.ini "${resnet[@]}" --checkpoint stage1/last.h5 -o emb.h5 > embed.txt 2>&1 || { cat embed.txt; fail "resnet embed failed"; }
    "$check_embeddings" emb.h5 test.h5 32 || fail "resnet embeddings"
    # SWA over stage-2 checkpoints averages the encoder + head model.
    run 2 "$mpigrad" swa --config classifier.ini "${resnet[@]}" --checkpoints stage2/last.h5,stage2/last.h5 -o swa.h5 > swa.txt 2>&1 || { cat swa.txt; fail "swa of a classifier stage failed"; }
    [ -s swa.h5 ] || fail "no swa.h5"
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
