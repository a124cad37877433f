#!/usr/bin/env bash
# End-to-end checks of `mpigrad train` on ONNX models and of `mpigrad onnx`, each a ctest test:
#   onnx_checks.sh CHECK MPIGRAD COMPARE MPIEXEC WORKDIR
# The models and data are the parity test's (tests/data/onnx, written by
# benchmarks/onnx/make_parity_data.py): a transformer on int64 token ids with dense labels
# [N, T], a U-Net regression (mse) and a CNN with BatchNorm.
set -euo pipefail
check=$1 mpigrad=$2 compare=$3 mpiexec=$4 work=$5
data="$(cd "$(dirname "$0")/../data/onnx" && pwd)"
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

# The transformer: token ids in, logits [N, 11, 6] against next tokens [N, 6] out.
cat > transformer.ini <<EOF
[data]
train = $data/transformer.h5
num_classes = 11
[model]
name = onnx
file = $data/transformer.dynamo.onnx
[optim]
lr = 0.03
momentum = 0.9
[train]
epochs = 1
batch_size = 16
shuffle = false
log_every = 1
tensorboard = false
EOF
cat > unet.ini <<EOF
[data]
train = $data/unet.h5
[model]
name = onnx
file = $data/unet.legacy.onnx
[loss]
name = mse
[optim]
lr = 0.05
momentum = 0.9
[train]
epochs = 1
batch_size = 16
shuffle = false
log_every = 1
tensorboard = false
EOF

case "$check" in
  ranks)  # 1 rank with batch 4B equals 2 ranks with 2B and 4 with B: token ids, dense labels, mse
    for model in transformer unet; do
      run 1 "$mpigrad" train --config $model.ini --train.out_dir=$model-one > one.txt 2>&1 ||
        { cat one.txt; fail "$model: 1-rank run failed"; }
      run 2 "$mpigrad" train --config $model.ini --train.out_dir=$model-two --train.batch_size=8 \
        > two.txt 2>&1 || { cat two.txt; fail "$model: 2-rank run failed"; }
      "$compare" $model-one/last.h5 $model-two/last.h5 1e-5 || fail "$model: 1 x 2B and 2 x B disagree"
      run 4 "$mpigrad" train --config $model.ini --train.out_dir=$model-four --train.batch_size=4 \
        > four.txt 2>&1 || { cat four.txt; fail "$model: 4-rank run failed"; }
      "$compare" $model-one/last.h5 $model-four/last.h5 1e-5 || fail "$model: 1 x 4B and 4 x B disagree"
    done
    ;;
  sync_bn)  # with SyncBatchNorm, the CNN's BatchNorm layers see the global batch on 2 ranks too
    cnn=(--config unet.ini --data.train=$data/cnn_bn.h5 --model.file=$data/cnn_bn.dynamo.onnx
         --loss.name=cross_entropy --data.num_classes=3)
    run 1 "$mpigrad" train "${cnn[@]}" --train.out_dir=one > one.txt 2>&1 || { cat one.txt; fail "1-rank run failed"; }
    run 2 "$mpigrad" train "${cnn[@]}" --train.out_dir=two --train.batch_size=8 \
      --distributed.sync_bn=true > two.txt 2>&1 || { cat two.txt; fail "2-rank run failed"; }
    grep -q "2 BatchNorm layer(s) synchronized" two.txt || { cat two.txt; fail "no SyncBatchNorm"; }
    "$compare" one/last.h5 two/last.h5 1e-5 || fail "1 x 2B and 2 x B disagree with sync_bn"
    ;;
  resume)  # a CNN graph (BatchNorm buffers, momentum) resumed from epoch 1 ends bit for bit as
    # an uninterrupted run; with an EMA of the weights too
    cnn=(--config unet.ini --data.train=$data/cnn_bn.h5 --model.file=$data/cnn_bn.dynamo.onnx
         --loss.name=cross_entropy --data.num_classes=3 --train.ema_decay=0.9)
    run 1 "$mpigrad" train "${cnn[@]}" --train.epochs=2 --train.out_dir=full > full.txt 2>&1 ||
      { cat full.txt; fail "full run failed"; }
    run 1 "$mpigrad" train "${cnn[@]}" --train.epochs=1 --train.out_dir=part > part.txt 2>&1 ||
      { cat part.txt; fail "first half failed"; }
    run 1 "$mpigrad" train "${cnn[@]}" --train.epochs=2 --train.out_dir=part \
      --train.resume=auto > resumed.txt 2>&1 || { cat resumed.txt; fail "resumed run failed"; }
    "$compare" full/last.h5 part/last.h5 0 || fail "resumed final weights differ"
    "$compare" full/last.h5 part/last.h5 0 hooks/ema || fail "resumed EMA weights differ"
    ;;
  inputs)  # the log says what the model is fed: int64 token ids stay int64
    run 1 "$mpigrad" train --config transformer.ini --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "field 'x' int64 \[6\], used as int64 (the graph's input dtype)" dry.txt ||
      { cat dry.txt; fail "token ids not fed as int64"; }
    run 1 "$mpigrad" train --config unet.ini --dry-run > dry.txt 2>&1 || { cat dry.txt; fail "dry run failed"; }
    grep -q "targets: field 'y', mse loss" dry.txt || { cat dry.txt; fail "no regression target line"; }
    ;;
  export)  # trained weights written into a copy of the graph come back unchanged
    run 1 "$mpigrad" train --config transformer.ini --train.out_dir=trained > log.txt 2>&1 ||
      { cat log.txt; fail "training failed"; }
    "$mpigrad" onnx export --checkpoint trained/last.h5 --model "$data/transformer.dynamo.onnx" \
      -o trained.onnx > export.txt 2>&1 || { cat export.txt; fail "export failed"; }
    [ ! -e trained.onnx.tmp ] || fail "export left its temporary file"
    # Training the exported file from step 0 starts from the trained weights.
    run 1 "$mpigrad" train --config transformer.ini --model.file=trained.onnx --train.max_steps=1 \
      --train.save_initial=true --train.out_dir=again > again.txt 2>&1 || { cat again.txt; fail "exported model does not train"; }
    "$compare" trained/last.h5 again/ckpt-step0.h5 0 || fail "exported weights differ from the checkpoint"
    # A checkpoint of another model is refused, naming the tensor; nothing is written.
    if "$mpigrad" onnx export --checkpoint trained/last.h5 --model "$data/unet.legacy.onnx" \
      -o wrong.onnx > wrong.txt 2>&1; then fail "export of a mismatched checkpoint passed"; fi
    grep -q "has no tensor 'enc.0.weight'" wrong.txt || { cat wrong.txt; fail "unclear mismatch error"; }
    [ ! -e wrong.onnx ] && [ ! -e wrong.onnx.tmp ] || fail "a failed export left a file"
    # The legacy exporter's training-mode BatchNorm is written for inference (ONNX Runtime then
    # uses the trained running statistics: benchmarks/onnx/make_parity_data.py --exported).
    cnn=(--config unet.ini --data.train=$data/cnn_bn.h5 --model.file=$data/cnn_bn.legacy.onnx
         --loss.name=cross_entropy --data.num_classes=3 --train.out_dir=cnn)
    run 1 "$mpigrad" train "${cnn[@]}" > cnn.txt 2>&1 || { cat cnn.txt; fail "cnn training failed"; }
    "$mpigrad" onnx export --checkpoint cnn/last.h5 --model "$data/cnn_bn.legacy.onnx" -o cnn.onnx \
      > cnn_export.txt 2>&1 || { cat cnn_export.txt; fail "cnn export failed"; }
    grep -q "2 BatchNormalization/Dropout node(s) set to inference mode" cnn_export.txt ||
      { cat cnn_export.txt; fail "BatchNorm not set to inference mode"; }
    ;;
  inspect)  # inputs, outputs, parameters and ops of both exporters' files
    for exporter in legacy dynamo; do
      "$mpigrad" onnx inspect "$data/transformer.$exporter.onnx" > inspect.txt 2>&1 ||
        { cat inspect.txt; fail "inspect $exporter failed"; }
      grep -qE "INT64 +\[\?batch, 6\]|INT64 +\[\?, 6\]" inspect.txt || { cat inspect.txt; fail "no int64 input"; }
      grep -qE "blocks.0.attn.q.weight +parameter +FLOAT +\[16, 16\]" inspect.txt || { cat inspect.txt; fail "no parameter line"; }
      grep -qE "LayerNormalization +3 +supported" inspect.txt || { cat inspect.txt; fail "no op line"; }
      grep -q "every op is supported" inspect.txt || { cat inspect.txt; fail "not all supported"; }
    done
    grep -q "mpigrad onnx export --checkpoint" <<<"$("$mpigrad" onnx --help)" || fail "no --help"
    if "$mpigrad" onnx inspect missing.onnx > missing.txt 2>&1; then fail "missing file passed"; fi
    grep -q "file 'missing.onnx' does not exist" missing.txt || { cat missing.txt; fail "unclear missing-file error"; }
    ;;
  bad_input)  # each mistake: one error naming the key or file, no training
    grep -v '^file' unet.ini > nofile.ini
    expect_error "\[model\] file: name = onnx needs the .onnx file" --config nofile.ini
    expect_error "\[model\] file: 'nothere.onnx' does not exist" --config unet.ini --model.file=nothere.onnx
    head -c 3000 "$data/unet.legacy.onnx" > truncated.onnx
    expect_error "truncated.onnx" --config unet.ini --model.file=truncated.onnx
    # The transformer's token ids fed to the U-Net: the input shapes do not fit.
    expect_error "does not take samples of shape \[6\]" --config unet.ini --data.train=$data/transformer.h5
    # mse against the transformer's logits: the target [6] is not the output's [11, 6].
    expect_error "output '.*' has shape \[?.*, 11, 6\]" --config transformer.ini --loss.name=mse
    expect_error "\[data\] mean: the model's input is int64" --config transformer.ini --data.mean=0 --data.std=1
    expect_error "float32; class labels must be integers" --config unet.ini --loss.name=cross_entropy
    expect_error "mse and l1 are for \[model\] name = onnx" --config unet.ini --model.name=conv
    ;;
  *) fail "unknown check" ;;
esac
echo "PASS ($check)"
