#!/usr/bin/env bash
# End-to-end checks of `mpigrad train` and `mpigrad data inspect` on hostile inputs (issue 17),
# each a ctest test (see CMakeLists.txt):
#   hostile_checks.sh CHECK MPIGRAD MPIEXEC WORKDIR MAKE_HOSTILE_FILE
# Each bad input must end in one error naming the file, field or key and the rank, a non-zero
# exit before training, and nothing written to out_dir; inspect must list what it cannot read.
set -euo pipefail
check=$1 mpigrad=$2 mpiexec=$3 work=$4 make_hostile_file=$5
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

"$mpigrad" data synth -o train.h5 --samples 200 --shape 1,8,8 --seed 1 > /dev/null
"$mpigrad" data synth -o test.h5 --samples 64 --shape 1,8,8 --seed 2 > /dev/null
cat > base.ini <<INI
[data]
train = train.h5
test = test.h5
num_classes = 10
[model]
name = mlp
hidden = 16
[train]
epochs = 1
batch_size = 16
out_dir = out
INI
max=9223372036854775807

# expect_error, and then: nothing was written to out_dir.
refused_run() {
  expect_error "$@"
  [ ! -e out ] || fail "out/ written despite: ${*:2}"
}
# The same, and the dry run fails alike.
refused() {
  refused_run "$@"
  expect_error "$@" --dry-run
}

case "$check" in
  empty_data)  # N = 0 and fewer samples than ranks, for train and test: errors before training
    "$make_hostile_file" empty empty.h5
    refused "\[data\] train: Hdf5Dataset empty.h5 has no samples (N = 0" --config base.ini --data.train=empty.h5
    refused "\[data\] test: Hdf5Dataset empty.h5 has no samples (N = 0" --config base.ini --data.test=empty.h5
    "$mpigrad" data synth -o one.h5 --samples 1 --shape 1,8,8 > /dev/null
    refused "\[data\] train: Hdf5Dataset one.h5 has 1 sample(s), fewer than the 2 ranks" \
      --config base.ini --data.train=one.h5
    refused "\[data\] test: Hdf5Dataset one.h5 has 1 sample(s), fewer than the 2 ranks" \
      --config base.ini --data.test=one.h5
    ;;
  config_sizes)  # sizes near int64's limits: an error naming the key, or a run that stays exact
    refused_run "\[model\] hidden: a layer of 64 inputs and 4611686018427387904 outputs" \
      --config base.ini --model.hidden=4611686018427387904
    refused_run "\[model\] hidden: the model's .* float32 parameters: needs .* bytes" \
      --config base.ini --model.hidden=1099511627776
    refused_run "\[model\] outputs (\[data\] num_classes): a layer of 16 inputs and 4611686018427387904" \
      --config base.ini --data.num_classes=4611686018427387904
    refused_run "\[model\] channels: a layer of 1 inputs and 4611686018427387904 outputs with 3x3 kernels" \
      --config base.ini --model.name=cnn --model.channels=4611686018427387904
    refused_run "\[train\] epochs: the run's length in optimizer updates" --config base.ini --train.epochs=$max
    # batch_size and grad_accum_steps at the maximum: one step per epoch, exactly.
    for key in batch_size grad_accum_steps; do
      run 2 "$mpigrad" train --config base.ini --train.$key=$max --train.epochs=$max --dry-run \
        > dry.txt 2>&1 || { cat dry.txt; fail "dry run with $key = int64 max failed"; }
      grep -q "1 steps per epoch" dry.txt || { cat dry.txt; fail "$key = int64 max: not 1 step per epoch"; }
    done
    ;;
  huge_shapes)  # per-sample shapes that overflow, or that no memory holds: errors naming the file
    "$make_hostile_file" huge-sample huge_sample.h5
    refused_run "huge_sample.h5:/x: its extents \[2, 1, 2147483648, 2147483648\] hold more elements than int64" \
      --config base.ini --data.train=huge_sample.h5
    "$make_hostile_file" huge-dim huge_dim.h5
    refused_run "huge_dim.h5 field 'x' declares 64 samples (33.7 TiB) but stores only" \
      --config base.ini --data.train=huge_dim.h5
    for file in huge_sample huge_dim; do
      if "$mpigrad" data inspect $file.h5 > inspect.txt 2>&1; then cat inspect.txt; fail "inspect accepted $file.h5"; fi
      grep -q "error: .*$file.h5" inspect.txt || { cat inspect.txt; fail "inspect: no error naming $file.h5"; }
    done
    ;;
  dry_run_test_loader)  # a test file whose data cannot be read fails the dry run, not only the run
    "$make_hostile_file" bad-chunks bad_chunks.h5
    if run 2 "$mpigrad" train --config base.ini --data.test=bad_chunks.h5 --dry-run > dry.txt 2>&1; then
      cat dry.txt; fail "the dry run passed a test file whose data cannot be read"
    fi
    grep -q "^\[rank [0-9]/2\] mpigrad train: error: .*bad_chunks.h5:/x" dry.txt || { cat dry.txt; fail "dry run: no error naming bad_chunks.h5:/x"; }
    grep -q "dry run passed" dry.txt && fail "dry run reported success"
    [ ! -e out ] || fail "dry run wrote out/"
    ;;
  inspect_files)  # inspect lists cyclic links and awkward attributes, and ends
    "$make_hostile_file" cycles cycles.h5
    timeout 20 "$mpigrad" data inspect cycles.h5 > cycles.txt 2>&1 || { cat cycles.txt; fail "inspect failed on cycles.h5"; }
    grep -q "^  /g/loop  (link to an ancestor group, not followed)$" cycles.txt || { cat cycles.txt; fail "no /g/loop line"; }
    grep -q "^  /self  (link to an ancestor group, not followed)$" cycles.txt || { cat cycles.txt; fail "no /self line"; }
    grep -q "^dataset: N = 64 samples" cycles.txt || { cat cycles.txt; fail "no dataset summary"; }
    "$make_hostile_file" attributes attributes.h5
    timeout 20 "$mpigrad" data inspect attributes.h5 > attributes.txt 2>&1 || { cat attributes.txt; fail "inspect failed on attributes.h5"; }
    grep -qF '@names = ["a", "bb", "ccc"]' attributes.txt || { cat attributes.txt; fail "vlen string array"; }
    grep -qF '@grid = [2, 3]: ["ab", "cd", "ef", "gh", "ij", "kl"]' attributes.txt || { cat attributes.txt; fail "2-D fixed strings"; }
    grep -qF '@pair = unsupported (compound, shape [1])' attributes.txt || { cat attributes.txt; fail "compound"; }
    ;;
  inspect_library_crashes)  # files that crash or hang HDF5 1.10.8 itself: one error, exit 1
    # fuzz_hdf5 found them (fuzz/crashes/fuzz_hdf5/hdf5_*); inspect reads files in a child process.
    for input in "$(dirname "$0")"/../../fuzz/crashes/fuzz_hdf5/hdf5_*; do
      name=$(basename "$input")
      status=0
      timeout 60 "$mpigrad" data inspect "$input" --timeout 3 > "$name.out" 2> "$name.err" || status=$?
      [ "$status" -le 1 ] || { cat "$name.err"; fail "inspect $name: exit status $status (a crash or a hang)"; }
      if [ "$status" = 1 ]; then
        # One error, the last line. (Under scripts/sanitize.sh the child's ASan report of the
        # fault inside HDF5 comes before it; a release build prints nothing else.)
        [ "$(grep -c "^mpigrad-data inspect: error: " "$name.err")" = 1 ] \
          || { cat "$name.err"; fail "inspect $name: not one error line"; }
        tail -1 "$name.err" | grep -q "^mpigrad-data inspect: error: .*$name" \
          || { cat "$name.err"; fail "inspect $name: the last line is not the error naming the file"; }
        [ ! -s "$name.out" ] || { cat "$name.out"; fail "inspect $name: a partial listing before the error"; }
      fi
    done
    # The hang: HDF5 decodes a corrupt global heap forever; the child is killed at --timeout.
    grep -q "inspect: HDF5 did not finish within 3 s (killed), while reading attribute @classes of .*hdf5_vlen_attribute_hang" \
      hdf5_vlen_attribute_hang_in_H5HG_read.err || { cat hdf5_vlen_attribute_hang_in_H5HG_read.err; fail "the hang"; }
    if "$mpigrad" data inspect train.h5 --timeout 0 > timeout.txt 2>&1; then fail "--timeout 0 accepted"; fi
    grep -qF "inspect: --timeout must be a number of seconds in (0, 1e6], got 0" timeout.txt || { cat timeout.txt; fail "--timeout 0"; }
    ;;
  *) fail "unknown check" ;;
esac
echo "ok ($check)"
