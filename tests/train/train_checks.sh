#!/usr/bin/env bash
# End-to-end checks of `mpigrad train`, each a ctest test (see CMakeLists.txt):
#   train_checks.sh CHECK MPIGRAD COMPARE MPIEXEC WORKDIR MAKE_SPARSE_FILE
# They run the real program under mpirun on small synthetic data written by `mpigrad data synth`.
set -euo pipefail
check=$1 mpigrad=$2 compare=$3 mpiexec=$4 work=$5 make_sparse_file=$6
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

# 1200 training and 301 test samples of 10 learnable classes (301: odd, so 2 ranks pad).
"$mpigrad" data synth -o train.h5 --samples 1200 --shape 1,8,8 --shards 2 --seed 1 > /dev/null
"$mpigrad" data synth -o test.h5 --samples 301 --shape 1,8,8 --seed 1 > /dev/null
cat > base.ini <<EOF
[data]
train = train-00000-of-00002.h5, train-00001-of-00002.h5
test = test.h5
num_classes = 10
[model]
name = mlp
hidden = 32
[optim]
lr = 0.05
momentum = 0.9
[train]
epochs = 2
batch_size = 16
seed = 3
log_every = 5
shuffle = true
EOF

case "$check" in
  short_run)  # loss falls, metrics.jsonl is well-formed, outputs exist, padding counted once
    run 2 "$mpigrad" train --config base.ini --train.out_dir=out > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    [ -s out/metrics.jsonl ] || fail "no metrics.jsonl"
    number='-?[0-9.]+(e[-+]?[0-9]+)?'
    step_line="^\{\"step\": [0-9]+, \"epoch\": [0-9]+, \"loss\": $number, \"lr\": $number, \"samples_per_s\": $number\}$"
    eval_line="^\{\"epoch\": [0-9]+, \"test_loss\": $number, \"test_accuracy\": $number\}$"
    while IFS= read -r line; do
      [[ $line =~ $step_line || $line =~ $eval_line ]] || fail "malformed metrics line: $line"
    done < out/metrics.jsonl
    [ "$(grep -c '"test_accuracy"' out/metrics.jsonl)" -eq 2 ] || fail "expected 2 evaluations"
    first=$(losses out/metrics.jsonl | sed -n 1p) last=$(losses out/metrics.jsonl | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.5 * a) }' || fail "loss did not fall: $first -> $last"
    for f in config.ini ckpt-epoch1.h5 ckpt-epoch2.h5 last.h5; do [ -s "out/$f" ] || fail "missing out/$f"; done
    ls out | grep -q '\.tmp' && fail "temporary file left in out/"
    grep -q "(301 samples)" log.txt || fail "the padded test set was not counted exactly once"
    ;;
  resume)  # a run resumed from epoch 1's checkpoint logs the same losses as an uninterrupted one
    run 2 "$mpigrad" train --config base.ini --train.out_dir=full --train.log_every=1 > /dev/null 2>&1 || fail "full run failed"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=part --train.log_every=1 --train.epochs=1 > /dev/null 2>&1 || fail "first half failed"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=part --train.log_every=1 \
        --train.resume=part/ckpt-epoch1.h5 > /dev/null 2>&1 || fail "resumed run failed"
    diff <(losses full/metrics.jsonl) <(losses part/metrics.jsonl) || fail "resumed losses differ"
    "$compare" full/last.h5 part/last.h5 0 || fail "resumed final weights differ"
    ;;
  resume_auto)  # resume = auto starts fresh, then continues from the newest checkpoint, bit for bit
    run 2 "$mpigrad" train --config base.ini --train.out_dir=full --train.log_every=1 > /dev/null 2>&1 || fail "full run failed"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=part --train.log_every=1 --train.epochs=1 \
        --train.resume=auto > first.txt 2>&1 || { cat first.txt; fail "first half failed"; }
    grep -q "resume = auto: no checkpoint in 'part'; starting fresh" first.txt || { cat first.txt; fail "no fresh start logged"; }
    # Names CheckpointHook does not write are not checkpoints: loading this one would fail.
    echo "not a checkpoint" > part/ckpt-epoch7-best.h5
    run 2 "$mpigrad" train --config base.ini --train.out_dir=part --train.log_every=1 \
        --train.resume=auto > second.txt 2>&1 || { cat second.txt; fail "resumed run failed"; }
    grep -q "resume = auto: resuming from part/ckpt-epoch1.h5" second.txt || { cat second.txt; fail "wrong checkpoint chosen"; }
    diff <(losses full/metrics.jsonl) <(losses part/metrics.jsonl) || fail "resumed losses differ"
    "$compare" full/last.h5 part/last.h5 0 || fail "resumed final weights differ"
    ;;
  resume_skips_corrupt)  # resume = auto skips a truncated newest checkpoint, naming it, for the one before
    run 2 "$mpigrad" train --config base.ini --train.out_dir=full > /dev/null 2>&1 || fail "full run failed"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=part > /dev/null 2>&1 || fail "first run failed"
    truncate -s $(( $(stat -c %s part/ckpt-epoch2.h5) / 2 )) part/ckpt-epoch2.h5
    run 2 "$mpigrad" train --config base.ini --train.out_dir=part --train.resume=auto > again.txt 2>&1 \
      || { cat again.txt; fail "resumed run failed"; }
    grep -q "warning: resume = auto: skipping part/ckpt-epoch2.h5" again.txt || { cat again.txt; fail "no warning naming the truncated file"; }
    grep -q "resume = auto: resuming from part/ckpt-epoch1.h5" again.txt || { cat again.txt; fail "did not fall back to epoch 1"; }
    "$compare" full/last.h5 part/last.h5 0 || fail "resumed final weights differ"
    ;;
  keep_checkpoints)  # keep_checkpoints = 2 keeps the newest two epoch checkpoints, and others' files
    mkdir out && echo "mine" > out/ckpt-epoch1-best.h5
    run 2 "$mpigrad" train --config base.ini --train.out_dir=out --train.epochs=3 \
        --train.keep_checkpoints=2 > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    [ "$(cd out && ls ckpt-*.h5 | tr '\n' ' ')" = "ckpt-epoch1-best.h5 ckpt-epoch2.h5 ckpt-epoch3.h5 " ] \
      || fail "kept: $(cd out && ls ckpt-*.h5 | tr '\n' ' ')"
    [ -s out/last.h5 ] || fail "missing out/last.h5"
    ;;
  same_seed)  # the same seed gives bitwise-identical final weights
    run 2 "$mpigrad" train --config base.ini --train.out_dir=a > /dev/null 2>&1 || fail "run a failed"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=b > /dev/null 2>&1 || fail "run b failed"
    "$compare" a/last.h5 b/last.h5 0 || fail "same seed, different weights"
    ;;
  ranks_vs_batch)  # 1 rank with batch 2B equals 2 ranks with batch B (no shuffle, no dropout)
    run 1 "$mpigrad" train --config base.ini --train.out_dir=one --train.shuffle=false --train.batch_size=32 > /dev/null 2>&1 || fail "1-rank run failed"
    run 2 "$mpigrad" train --config base.ini --train.out_dir=two --train.shuffle=false --train.batch_size=16 > /dev/null 2>&1 || fail "2-rank run failed"
    "$compare" one/last.h5 two/last.h5 1e-5 || fail "1 x 2B and 2 x B disagree"
    ;;
  bad_input)  # each bad config or data file: non-zero exit and its error, no training
    sed 's/^epochs/epochz/' base.ini > typo.ini
    expect_error "unrecognised option 'train.epochz'" --config typo.ini
    expect_error "train.epochs: expected an integer" --config base.ini --train.epochs=three
    expect_error "cannot open config file 'missing.ini'" --config missing.ini
    expect_error "file 'nothere.h5' does not exist" --config base.ini --data.train=nothere.h5
    expect_error "expected one of mlp | cnn" --config base.ini --model.name=transformer
    head -c 5000 test.h5 > truncated.h5
    expect_error "truncated.h5" --config base.ini --data.test=truncated.h5
    "$mpigrad" data synth -o labels.h5 --samples 50 --shape 1,8,8 --classes 12 > /dev/null
    expect_error "outside \[0, 10)" --config base.ini --data.train=labels.h5
    expect_error "no dataset /image" --config base.ini --data.x=image
    "$mpigrad" data synth -o one.h5 --samples 1 --shape 1,8,8 > /dev/null
    expect_error "one.h5 has 1 sample(s), fewer than the 2 ranks" --config base.ini --data.test=one.h5
    expect_error "expected one of sgd | adam | adamw, got 'rmsprop'" --config base.ini --optim.name=rmsprop
    expect_error "\[train\] cuda_graphs: only embedded models" --config base.ini --train.cuda_graphs=true
    expect_error "\[data\] mean and std: give both or neither" --config base.ini --data.mean=0.5
    expect_error "\[data\] std: 3 values, but field 'x' has per-sample shape \[1, 8, 8\], so 1 channel" \
      --config base.ini --data.mean=0.5 --data.std=0.2,0.2,0.2
    run 2 "$mpigrad" train --config base.ini --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "dry run passed" dry.txt || fail "dry run did not report"
    [ ! -e runs ] || fail "dry run wrote outputs"
    # A dry run checks the run's schedule, not a one-step one (warmup below the run's steps).
    run 2 "$mpigrad" train --config base.ini --sched.name=cosine --sched.warmup_steps=20 --dry-run \
      > dry_warmup.txt 2>&1 || { cat dry_warmup.txt; fail "dry run with warmup failed"; }
    ;;
  float_features)  # float32 inputs in their natural range (0..16), other field names, h5py's layout
    # Contiguous datasets, float32 features [N, 20] and int64 labels: what h5py writes from NumPy.
    for split in train:1200 test:301; do
      "$mpigrad" data synth -o "feat_${split%:*}.h5" --samples "${split#*:}" --shape 20 --dtype float32 \
        --range 0,16 --x-name features --y-name label --seed 2 > /dev/null
    done
    features=(--config base.ini --data.train=feat_train.h5 --data.test=feat_test.h5
              --data.x=features --data.y=label --optim.lr=0.01)
    run 2 "$mpigrad" train "${features[@]}" --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "inputs: field 'features' float32 \[20\], used as it is" dry.txt || { cat dry.txt; fail "inputs not used as they are"; }
    # The model sees the file's values: a mean near 8, not 8 / 255.
    mean=$(sed -nE "s/.*first batch: field 'features' .* mean ([0-9.e+-]+),.*/\1/p" dry.txt)
    awk -v m="$mean" 'BEGIN { exit !(m > 6 && m < 10) }' || { cat dry.txt; fail "first-batch mean $mean is not in the file's range"; }
    run 2 "$mpigrad" train "${features[@]}" --train.out_dir=out > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    accuracy=$(final_accuracy log.txt)
    at_least "$accuracy" 0.9 || { cat log.txt; fail "test accuracy $accuracy < 0.9 on features in their natural range"; }
    # Per-channel normalization: one value per feature.
    mean20=$(printf '8,%.0s' {1..19})8 std20=$(printf '4.6,%.0s' {1..19})4.6
    run 2 "$mpigrad" train "${features[@]}" --data.mean="$mean20" --data.std="$std20" --dry-run > norm.txt 2>&1 \
      || { cat norm.txt; fail "normalized dry run failed"; }
    mean=$(sed -nE "s/.*first batch: field 'features' .* mean ([0-9.e+-]+),.*/\1/p" norm.txt)
    awk -v m="$mean" 'BEGIN { exit !(m > -0.5 && m < 0.5) }' || { cat norm.txt; fail "normalized mean $mean is not near 0"; }
    ;;
  field_names)  # [data] x and y name the fields in training, evaluation, the dry run and checkpoints
    for split in train:1200 test:301; do
      "$mpigrad" data synth -o "named_${split%:*}.h5" --samples "${split#*:}" --shape 1,8,8 \
        --x-name image --y-name class --seed 1 > /dev/null
    done
    named=(--config base.ini --data.train=named_train.h5 --data.test=named_test.h5 --data.x=image --data.y=class)
    run 2 "$mpigrad" train "${named[@]}" --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "inputs: field 'image' uint8 \[1, 8, 8\], scaled to \[0, 1\]" dry.txt || { cat dry.txt; fail "dry run: inputs"; }
    run 2 "$mpigrad" train "${named[@]}" --train.out_dir=out > log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    [ "$(grep -c '"test_accuracy"' out/metrics.jsonl)" -eq 2 ] || fail "expected 2 evaluations"
    grep -q "^x = image$" out/config.ini && grep -q "^y = class$" out/config.ini || fail "config.ini lost the field names"
    "$compare" out/last.h5 out/last.h5 0 > /dev/null || fail "unreadable checkpoint"
    expect_error "field 'class' holds label" "${named[@]}" --data.num_classes=5
    expect_error "no dataset /x (present: class, image)" --config base.ini --data.train=named_train.h5
    ;;
  label_dtypes)  # labels of any integer dtype train; float labels are refused naming the field
    for dtype in int32 uint8; do
      "$mpigrad" data synth -o "labels_$dtype.h5" --samples 1200 --shape 1,8,8 --label-dtype "$dtype" --seed 1 > /dev/null
      run 2 "$mpigrad" train --config base.ini --data.train="labels_$dtype.h5" --train.out_dir="out_$dtype" > "log_$dtype.txt" 2>&1 \
        || { cat "log_$dtype.txt"; fail "training on $dtype labels failed"; }
      accuracy=$(final_accuracy "log_$dtype.txt")
      at_least "$accuracy" 0.9 || { cat "log_$dtype.txt"; fail "$dtype labels: test accuracy $accuracy"; }
    done
    # The same labels in int64, int32 and uint8 give the same run, bit for bit.
    "$mpigrad" data synth -o labels_int64.h5 --samples 1200 --shape 1,8,8 --seed 1 > /dev/null
    run 2 "$mpigrad" train --config base.ini --data.train=labels_int64.h5 --train.out_dir=out_int64 > /dev/null 2>&1 || fail "int64 run failed"
    "$compare" out_int64/last.h5 out_int32/last.h5 0 > /dev/null || fail "int32 labels train differently"
    "$compare" out_int64/last.h5 out_uint8/last.h5 0 > /dev/null || fail "uint8 labels train differently"
    "$mpigrad" data synth -o scores.h5 --samples 100 --shape 1 --dtype float32 --x-name score --y-name x --seed 1 > /dev/null
    expect_error "label field 'score' of .*scores.h5 is float32; class labels must be integers" \
      --config base.ini --data.train=scores.h5 --data.test=scores.h5 --data.y=score
    ;;
  sparse_file)  # a file declaring 2^40 samples with one chunk written is refused at once
    "$make_sparse_file" sparse.h5 x y
    [ "$(stat -c %s sparse.h5)" -lt 1000000 ] || fail "the sparse file is not small"
    start=$(date +%s)
    expect_error "sparse.h5 field 'x' declares 1099511627776 samples (32.0 TiB) in 1073741824 chunks, but only 1 chunk(s) were ever written (32.0 KiB stored)" \
      --config base.ini --data.train=sparse.h5
    [ $(( $(date +%s) - start )) -lt 30 ] || fail "refusing the sparse file took more than 30 s"
    ;;
  ema_resume)  # with [train] ema_decay a resumed run ends with the same EMA weights, bit for bit
    ema=(--config base.ini --train.ema_decay=0.9 --train.log_every=1)
    run 2 "$mpigrad" train "${ema[@]}" --train.out_dir=full > full.txt 2>&1 || { cat full.txt; fail "full run failed"; }
    grep -q "evaluation uses the EMA of the weights (decay 0.9)" full.txt || { cat full.txt; fail "the log does not say EMA is evaluated"; }
    run 2 "$mpigrad" train "${ema[@]}" --train.out_dir=part --train.epochs=1 > /dev/null 2>&1 || fail "first half failed"
    run 2 "$mpigrad" train "${ema[@]}" --train.out_dir=part --train.resume=part/ckpt-epoch1.h5 > part.txt 2>&1 \
      || { cat part.txt; fail "resumed run failed"; }
    grep -q "holds no state for hook" part.txt && fail "the resumed run lost the EMA state"
    "$compare" full/last.h5 part/last.h5 0 hooks/ema || fail "resumed EMA weights differ"
    "$compare" full/last.h5 part/last.h5 0 || fail "resumed model weights differ"
    diff <(grep test_accuracy full/metrics.jsonl) <(grep test_accuracy part/metrics.jsonl) || fail "resumed evaluations differ"
    # Evaluating the EMA is not evaluating the model: a run without it scores differently.
    run 2 "$mpigrad" train --config base.ini --train.out_dir=plain > /dev/null 2>&1 || fail "plain run failed"
    cmp -s <(grep test_loss full/metrics.jsonl) <(grep test_loss plain/metrics.jsonl) && fail "EMA evaluation equals plain evaluation"
    ;;
  transport)  # [distributed] transport: hierarchical across 2 simulated nodes trains like one node
    MPIGRAD_SIMULATE_NODES=2 run 2 -x MPIGRAD_SIMULATE_NODES "$mpigrad" train --config base.ini \
      --distributed.transport=hierarchical --train.out_dir=hier > hier.txt 2>&1 || { cat hier.txt; fail "hierarchical run failed"; }
    grep -q "averaged hierarchically over 2 simulated nodes x 1 rank" hier.txt || { cat hier.txt; fail "the log does not say hierarchical"; }
    run 2 "$mpigrad" train --config base.ini --train.out_dir=shm > shm.txt 2>&1 || fail "shared-memory run failed"
    grep -q "averaged in shared memory" shm.txt || { cat shm.txt; fail "the log does not say shared memory"; }
    "$compare" hier/last.h5 shm/last.h5 1e-5 || fail "hierarchical and shared-memory runs disagree"
    expect_error "expected one of auto | communicator | shared_memory | hierarchical" \
      --config base.ini --distributed.transport=ring
    ;;
  zero)  # [distributed] zero = 1 checkpoints load without ZeRO at another world size, and back
    # 4 ranks x 16 and 2 ranks x 32 see the same global batches (no shuffle): with AdamW, clipping,
    # accumulation and EMA, a run switched between them after epoch 1 ends as an unswitched one.
    z=(--config base.ini --train.shuffle=false --optim.name=adamw --optim.lr=0.003
       --train.clip_grad_norm=0.5 --train.grad_accum_steps=2 --train.ema_decay=0.9)
    run 2 "$mpigrad" train "${z[@]}" --train.batch_size=32 --train.out_dir=full > full.txt 2>&1 \
      || { cat full.txt; fail "plain 2-rank run failed"; }
    run 4 "$mpigrad" train "${z[@]}" --train.batch_size=16 --distributed.zero=1 --train.epochs=1 \
      --train.out_dir=z4 > z4.txt 2>&1 || { cat z4.txt; fail "ZeRO-1 4-rank run failed"; }
    grep -q "ZeRO-1: reduce-scattered, optimizer state sharded" z4.txt || { cat z4.txt; fail "the log does not say ZeRO-1"; }
    grep -q "optimizer state: .* MiB on rank 0 (its ZeRO-1 shard)" z4.txt || { cat z4.txt; fail "no optimizer state size"; }
    [[ z4/last.h5 -ef z4/ckpt-epoch1.h5 ]] || fail "under ZeRO-1 last.h5 is not the epoch's checkpoint under a second name"
    run 2 "$mpigrad" train "${z[@]}" --train.batch_size=32 --train.out_dir=z4 \
      --train.resume=z4/ckpt-epoch1.h5 > z4b.txt 2>&1 || { cat z4b.txt; fail "plain resume of a ZeRO-1 checkpoint failed"; }
    "$compare" full/last.h5 z4/last.h5 1e-5 || fail "ZeRO-1 on 4 ranks, then plain on 2: weights differ"
    "$compare" full/last.h5 z4/last.h5 1e-5 hooks/ema || fail "ZeRO-1 on 4 ranks, then plain on 2: EMA differs"
    run 2 "$mpigrad" train "${z[@]}" --train.batch_size=32 --train.epochs=1 --train.out_dir=p2 > /dev/null 2>&1 \
      || fail "plain first half failed"
    run 4 "$mpigrad" train "${z[@]}" --train.batch_size=16 --distributed.zero=1 --train.out_dir=p2 \
      --train.resume=p2/ckpt-epoch1.h5 > p2b.txt 2>&1 || { cat p2b.txt; fail "ZeRO-1 resume of a plain checkpoint failed"; }
    "$compare" full/last.h5 p2/last.h5 1e-5 || fail "plain on 2 ranks, then ZeRO-1 on 4: weights differ"
    # The hierarchical transport (2 simulated nodes x 2 ranks), the whole run under ZeRO-1.
    MPIGRAD_SIMULATE_NODES=2 run 4 -x MPIGRAD_SIMULATE_NODES "$mpigrad" train "${z[@]}" --train.batch_size=16 \
      --distributed.zero=1 --train.out_dir=hier > hier.txt 2>&1 || { cat hier.txt; fail "hierarchical ZeRO-1 run failed"; }
    grep -q "averaged hierarchically over 2 simulated nodes x 2 ranks.*ZeRO-1" hier.txt || { cat hier.txt; fail "not hierarchical"; }
    "$compare" full/last.h5 hier/last.h5 1e-5 || fail "hierarchical ZeRO-1 on 4 ranks and plain on 2 disagree"
    # One rank has nothing to shard: zero = 1 trains as without it.
    run 1 "$mpigrad" train "${z[@]}" --train.batch_size=64 --distributed.zero=1 --train.out_dir=one > one.txt 2>&1 \
      || { cat one.txt; fail "1-rank run with zero = 1 failed"; }
    # SWA from epoch 2 (SGD, momentum): the averaged weights are those of a run without ZeRO-1.
    s=(--config base.ini --train.shuffle=false --train.epochs=3 --train.swa_start=2 --train.swa_lr=0.01)
    run 2 "$mpigrad" train "${s[@]}" --train.out_dir=swa_plain > /dev/null 2>&1 || fail "plain SWA run failed"
    run 2 "$mpigrad" train "${s[@]}" --distributed.zero=1 --train.out_dir=swa_zero > swa.txt 2>&1 \
      || { cat swa.txt; fail "SWA run with ZeRO-1 failed"; }
    "$compare" swa_plain/swa.h5 swa_zero/swa.h5 1e-6 || fail "SWA weights differ under ZeRO-1"
    expect_error "distributed.zero: must be at most 1, got 2" --config base.ini --distributed.zero=2
    ;;
  partial_files)  # a write that fails leaves no temporary file behind (train and lr-find)
    # out/config.ini is a non-empty folder, so renaming the written config.ini over it fails.
    mkdir -p out/config.ini/inside
    if run 1 "$mpigrad" train --config base.ini --train.out_dir=out > log.txt 2>&1; then
      cat log.txt; fail "training wrote config.ini over a folder"
    fi
    grep -q "out/config.ini" log.txt || { cat log.txt; fail "the error does not name out/config.ini"; }
    [ "$(ls out)" = "config.ini" ] || fail "temporary file left in out/: $(ls out | tr '\n' ' ')"
    # The same for lr-find's curve, with --output a non-empty folder.
    mkdir -p curve.csv/inside
    if run 1 "$mpigrad" lr-find --config base.ini --steps 2 --output curve.csv > lr.txt 2>&1; then
      cat lr.txt; fail "lr-find wrote its curve over a folder"
    fi
    grep -q "curve.csv" lr.txt || { cat lr.txt; fail "the error does not name curve.csv"; }
    ls | grep -q '^curve\.csv\.tmp' && fail "temporary file left behind: $(ls | tr '\n' ' ')"
    ;;
  *)
    fail "unknown check"
    ;;
esac
echo "PASS ($check)"
