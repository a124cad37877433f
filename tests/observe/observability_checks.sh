#!/usr/bin/env bash
# End-to-end checks of `mpigrad train`'s TensorBoard files and timeline, each a ctest test:
#   observability_checks.sh CHECK MPIGRAD MPIEXEC WORKDIR CHECK_TRACE CHECK_TFEVENTS SOURCE_DIR
#   trace               -np 2 with --trace: the merged file has both ranks and every span
#   trace_bad_path      a trace path that cannot be written fails before training, naming the key
#   tensorboard         -np 2: out/tb's event files hold exactly metrics.jsonl's scalars
#   tensorboard_off     [train] tensorboard = false writes no out/tb
#   tensorboard_reader  the same files through the tensorboard package's own reader (skipped,
#                       exit 77, when python3 cannot import tensorboard)
set -euo pipefail
check=$1 mpigrad=$2 mpiexec=$3 work=$4 check_trace=$5 check_tfevents=$6 source_dir=$7
source "$source_dir/tests/train/check_lib.sh"

if [ "$check" = tensorboard_reader ] && ! python3 -c 'import tensorboard' 2> /dev/null; then
  echo "SKIP ($check): python3 cannot import tensorboard (pip install tensorboard)"
  exit 77
fi
start_check "$work"

# 600 samples: 2 ranks x 19 batches of 16 per epoch; 101 test samples (odd: the ranks pad).
"$mpigrad" data synth -o train.h5 --samples 600 --shape 1,8,8 --seed 1 > /dev/null
"$mpigrad" data synth -o test.h5 --samples 101 --shape 1,8,8 --seed 1 > /dev/null
cat > base.ini <<INI
[data]
train = train.h5
test = test.h5
num_classes = 10
[model]
name = mlp
hidden = 32,16
[train]
epochs = 2
batch_size = 16
seed = 3
log_every = 1
out_dir = out
INI

case "$check" in
  trace)
    # A 1.2 MB model in small buckets, so there are several lanes of averaging (the first
    # bucket holds up to 1 MiB); grad_accum_steps 2, so some micro-batches end without an
    # optimizer step.
    run 2 "$mpigrad" train --config base.ini --trace traces/run.json \
      --model.hidden=512,512 --distributed.bucket_cap_mb=0.001 --train.grad_accum_steps=2 \
      > out.txt 2>&1 || { cat out.txt; fail "training with --trace failed"; }
    grep -q "timeline of 2 rank(s)" out.txt || { cat out.txt; fail "no timeline line"; }
    [ -s traces/run.json ] || fail "no traces/run.json"
    [ -e traces/run.json.tmp ] && fail "the temporary file was left behind"
    "$check_trace" traces/run.json 2 "data wait" forward backward "optimizer step" \
      "average bucket" validation "checkpoint write@0" || fail "the merged trace is wrong"
    # The key in the file does the same ([train] is base.ini's last section).
    { cat base.ini; echo "trace = key.json"; } > trace.ini
    run 2 "$mpigrad" train --config trace.ini --model.hidden=512,512 \
      --distributed.bucket_cap_mb=0.001 > key.txt 2>&1 \
      || { cat key.txt; fail "training with [train] trace failed"; }
    "$check_trace" key.json 2 forward "average bucket" > /dev/null || fail "key.json is wrong"
    lanes=$(grep -o '"name":"thread_name","ph":"M","pid":1,"tid":[0-9]*' key.json | wc -l)
    [ "$lanes" -ge 3 ] || fail "expected the training lane and several bucket lanes, got $lanes"
    ;;
  trace_bad_path)
    : > blocker
    expect_error "\[train\] trace" --config base.ini --trace blocker/trace.json
    mkdir a_folder
    expect_error "is a folder" --config base.ini --trace a_folder
    [ -e out/metrics.jsonl ] && fail "a failed run wrote metrics"
    ;;
  tensorboard)
    run 2 "$mpigrad" train --config base.ini > out.txt 2>&1 \
      || { cat out.txt; fail "training failed"; }
    [ "$(ls out/tb | grep -c '^events\.out\.tfevents\.[0-9]*\.')" -eq 1 ] \
      || fail "expected one event file"
    "$check_tfevents" out/tb out/metrics.jsonl || fail "the event files differ from metrics.jsonl"
    # A resumed run adds its own file, which holds the scalars it appended.
    run 2 "$mpigrad" train --config base.ini --train.epochs=3 --train.resume=out/last.h5 \
      > resume.txt 2>&1 || { cat resume.txt; fail "resume failed"; }
    [ "$(ls out/tb | wc -l)" -eq 2 ] || fail "expected a second event file after the resume"
    "$check_tfevents" out/tb out/metrics.jsonl || fail "after the resume the files differ"
    ;;
  tensorboard_off)
    run 2 "$mpigrad" train --config base.ini --train.tensorboard=false --train.epochs=1 \
      > out.txt 2>&1 || { cat out.txt; fail "training failed"; }
    [ -s out/metrics.jsonl ] || fail "no metrics.jsonl"
    [ -e out/tb ] && fail "tensorboard = false wrote out/tb"
    ;;
  tensorboard_reader)
    run 2 "$mpigrad" train --config base.ini --train.log_every=3 > out.txt 2>&1 \
      || { cat out.txt; fail "training failed"; }
    python3 "$source_dir/tests/observe/tensorboard_check.py" out \
      || fail "tensorboard's reader disagrees"
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
