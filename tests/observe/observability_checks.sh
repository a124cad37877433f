#!/usr/bin/env bash
# End-to-end checks of `mpigrad train`'s TensorBoard files and timeline, each a ctest test:
#   observability_checks.sh CHECK MPIGRAD MPIEXEC WORKDIR CHECK_TRACE CHECK_TFEVENTS SOURCE_DIR
#   trace               -np 2 with --trace: the merged file has both ranks and every span
#   trace_bad_path      a trace path that cannot be written fails before training, naming the key
#   tensorboard         -np 2: out/tb's event files hold exactly metrics.jsonl's scalars
#   tensorboard_off     [train] tensorboard = false writes no out/tb
#   tensorboard_reader  the same files through the tensorboard package's own reader (skipped,
#                       exit 77, when python3 cannot import tensorboard)
#   profile             --profile on an ONNX CNN (tests/data/onnx): rank 0's table names the ONNX
#                       nodes with their op types, the backward nodes, the kernels with GFLOP/s,
#                       the loop's stages and the optimizer; --profile-json holds every row;
#                       without --profile nothing of it is printed
#   profile_trace       -np 2 with --profile and --trace: the op spans nest in the trace under
#                       the loop's stages on both ranks, and one table is printed (rank 0's)
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

# The profile's checks: an ONNX CNN (tests/data/onnx: two Conv-BatchNorm-ReLU-MaxPool blocks and
# a Gemm, its nodes named as PyTorch's exporter names them), 160 samples, no test set.
cat > onnx.ini <<INI
[data]
train = $source_dir/tests/data/onnx/cnn_bn.h5
num_classes = 3
[model]
name = onnx
file = $source_dir/tests/data/onnx/cnn_bn.legacy.onnx
[train]
epochs = 1
batch_size = 8
log_every = 5
out_dir = out
tensorboard = false
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
  profile)
    profile_ini=(--config onnx.ini)
    run 1 "$mpigrad" train "${profile_ini[@]}" --profile --profile-json prof/rows.json \
      --train.profile_rows=1000 > out.txt 2>&1 || { cat out.txt; fail "training with --profile failed"; }
    grep -q "^mpigrad profile (rank 0): [0-9.]* s profiled, 20 optimizer steps" out.txt \
      || { cat out.txt; fail "no profile heading (20 steps)"; }
    # NAME TYPE CALLS: a row of the table.
    row() {
      grep -E "^$1 +$2 +$3 " out.txt > /dev/null || { cat out.txt; fail "no row '$1' ($2, $3 calls)"; }
    }
    row /features/features.0/Conv onnx:Conv 20
    row /features/features.4/Conv onnx:Conv 20
    row /features/features.2/Relu onnx:Relu 20
    row /features/features.3/MaxPool onnx:MaxPool 20
    row /classifier/Gemm onnx:Gemm 20
    row Conv2dBackward backward 40
    row MatmulBackward backward 20
    row forward phase 20
    row backward phase 20
    row "optimizer step" phase 20
    row "data wait" phase 21  # the last asks for a batch the epoch does not have
    row SGD.step optimizer 20
    # The convolutions' kernels carry GFLOP/s: a number in the last column.
    for kernel in conv2d_forward conv2d_backward_data conv2d_backward_filter gemm; do
      grep -E "^$kernel +kernel +[0-9]+ .* [0-9]+\.[0-9]+$" out.txt > /dev/null \
        || { cat out.txt; fail "no GFLOP/s for $kernel"; }
    done
    grep -q "^self time total: " out.txt || fail "no total line"
    grep -q '"name":"/features/features.0/Conv","type":"onnx:Conv","kind":"onnx","op_type":"Conv","calls":20,' \
      prof/rows.json || { cat prof/rows.json; fail "prof/rows.json lacks the Conv node"; }
    [ "$(grep -c '"name":' prof/rows.json)" -eq "$(sed -nE 's/.*; ([0-9]+) of \1 rows.*/\1/p' out.txt)" ] \
      || fail "prof/rows.json does not hold every row"
    # The limit keeps the rows with the most self time.
    run 1 "$mpigrad" train "${profile_ini[@]}" --train.profile=true --train.profile_rows=5 \
      > five.txt 2>&1 || { cat five.txt; fail "training with [train] profile failed"; }
    grep -q "; 5 of [0-9]* rows, by self time" five.txt || { cat five.txt; fail "no 5-row limit"; }
    # Off: no table.
    run 1 "$mpigrad" train "${profile_ini[@]}" > off.txt 2>&1 || { cat off.txt; fail "training failed"; }
    grep -q "mpigrad profile" off.txt && fail "a table without --profile"
    ;;
  profile_trace)
    run 2 "$mpigrad" train --config onnx.ini --train.batch_size=4 --profile --trace trace.json \
      > out.txt 2>&1 || { cat out.txt; fail "training with --profile --trace failed"; }
    [ "$(grep -c '^mpigrad profile (rank' out.txt)" -eq 1 ] || { cat out.txt; fail "expected one table"; }
    "$check_trace" trace.json 2 forward backward "optimizer step" /features/features.0/Conv \
      Conv2dBackward conv2d_forward SGD.step || fail "the op spans are not in the trace"
    grep -q '"name":"/features/features.0/Conv","cat":"onnx",.*"args":{.*"op_type":"Conv"}' trace.json \
      || fail "the ONNX node's span lacks its category or op type"
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
