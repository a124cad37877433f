#!/usr/bin/env bash
# End-to-end checks of `mpigrad train`, each a ctest test (see CMakeLists.txt):
#   train_checks.sh CHECK MPIGRAD COMPARE MPIEXEC WORKDIR
# They run the real program under mpirun on small synthetic data written by `mpigrad data synth`.
set -euo pipefail
check=$1 mpigrad=$2 compare=$3 mpiexec=$4 work=$5
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIGRAD_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() { echo "FAIL ($check): $*" >&2; exit 1; }
run() { "$mpiexec" -np "$1" --oversubscribe "${@:2}"; }

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

# Prints the "loss" values of metrics.jsonl's step lines, one per line.
losses() { grep '"step"' "$1" | sed -E 's/.*"loss": ([^,]+),.*/\1/'; }

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
    first=$(losses out/metrics.jsonl | head -1) last=$(losses out/metrics.jsonl | tail -1)
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
    expect_error() {
      local pattern=$1; shift
      if run 2 "$mpigrad" train "$@" > out.txt 2>&1; then cat out.txt; fail "expected failure: $*"; fi
      grep -q -- "$pattern" out.txt || { cat out.txt; fail "missing '$pattern' for: $*"; }
      grep -q "^\[rank [0-9]/2\]" out.txt || { cat out.txt; fail "error does not name the rank: $*"; }
      grep -q "step" out.txt && fail "training started despite: $*"
      return 0
    }
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
    run 2 "$mpigrad" train --config base.ini --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "dry run passed" dry.txt || fail "dry run did not report"
    [ ! -e runs ] || fail "dry run wrote outputs"
    ;;
  *)
    fail "unknown check"
    ;;
esac
echo "PASS ($check)"
