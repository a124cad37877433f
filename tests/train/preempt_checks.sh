#!/usr/bin/env bash
# End-to-end checks of stopping on a signal or [train] time_limit and of resuming mid-epoch
# (launch/train/preemption.h), each a ctest test (see CMakeLists.txt):
#   preempt_checks.sh CHECK MPIGRAD COMPARE MPIEXEC WORKDIR
# A stopped run must exit with 75 after rank 0 wrote out_dir/ckpt-epochN-stepS.h5, and the run
# resumed from it must end with the weights of an uninterrupted run, bit for bit.
# MPIGRAD_TEST_RAISE_SIGNAL=RANK:STEP:SIGNAL makes rank RANK raise SIGNAL at the end of optimizer
# step STEP (or, for STEP "stop", once the stop is decided, before the checkpoint is written), so
# the signal lands at a known step; preempt_external sends a real one with kill.
set -euo pipefail
check=$1 mpigrad=$2 compare=$3 mpiexec=$4 work=$5
source "$(dirname "$0")/check_lib.sh"
start_check "$work"

# 1200 samples of 10 classes: 38 batches of 16 per epoch on 2 ranks. Dropout and augmentations,
# so that the generators' states and the epoch's draws must come back too.
"$mpigrad" data synth -o train.h5 --samples 1200 --shape 1,8,8 --seed 1 > /dev/null
"$mpigrad" data synth -o test.h5 --samples 301 --shape 1,8,8 --seed 1 > /dev/null
cat > base.ini <<EOF
[data]
train = train.h5
test = test.h5
num_classes = 10
augment = crop:1,flip
[model]
name = mlp
hidden = 32
dropout = 0.2
[optim]
lr = 0.05
momentum = 0.9
[sched]
name = cosine
warmup_steps = 10
[train]
epochs = 2
batch_size = 16
seed = 3
log_every = 1
EOF

# stop_and_resume RANKS DIR RAISE [FLAGS...]: a run stopped by MPIGRAD_TEST_RAISE_SIGNAL=RAISE
# must exit 75; then resume = auto must finish it. The logs are DIR.stop.txt and DIR.resume.txt.
stop_and_resume() {
  local ranks=$1 dir=$2 raise=$3; shift 3
  local status=0
  MPIGRAD_TEST_RAISE_SIGNAL=$raise run "$ranks" -x MPIGRAD_TEST_RAISE_SIGNAL "$mpigrad" train \
    --config base.ini --train.out_dir="$dir" --train.resume=auto "$@" > "$dir.stop.txt" 2>&1 || status=$?
  [ "$status" -eq 75 ] || { cat "$dir.stop.txt"; fail "the stopped run exited with $status, not 75"; }
  ls "$dir" | grep -q '\.tmp' && fail "temporary file left in $dir/"
  run "$ranks" "$mpigrad" train --config base.ini --train.out_dir="$dir" --train.resume=auto "$@" \
    > "$dir.resume.txt" 2>&1 || { cat "$dir.resume.txt"; fail "the resumed run failed"; }
}

# same_as FULL PART: final weights bitwise equal, and the same loss at every step.
same_as() {
  "$compare" "$1/last.h5" "$2/last.h5" 0 > /dev/null || fail "$2's final weights differ from $1's"
  diff <(losses "$1/metrics.jsonl") <(losses "$2/metrics.jsonl") > /dev/null \
    || fail "$2's losses differ from $1's"
}

case "$check" in
  preempt_signal)  # a signal to ONE of 2 ranks stops both after the next step; resumed = uninterrupted
    run 2 "$mpigrad" train --config base.ini --train.out_dir=full > full.txt 2>&1 || { cat full.txt; fail "full run failed"; }
    stop_and_resume 2 part 1:7:USR1
    # Raised during step 7 on rank 1, agreed at step 8's end: every rank stops after step 8.
    grep -q "preempted (signal USR1 on rank 1) in epoch 1 after step 8; saved part/ckpt-epoch0-step8.h5; exit status 75" part.stop.txt \
      || { cat part.stop.txt; fail "the stop was not reported as expected"; }
    grep -q "resume = auto: resuming from part/ckpt-epoch0-step8.h5" part.resume.txt || { cat part.resume.txt; fail "did not resume from the mid-epoch checkpoint"; }
    grep -q "resume: epoch 1 continues at batch 9 of 38 (after step 8)" part.resume.txt || { cat part.resume.txt; fail "position not logged"; }
    [ "$(grep -c '"step": 8,' part/metrics.jsonl)" -eq 1 ] || fail "a step was logged twice or not at all"
    same_as full part
    # With gradient accumulation (2 micro-batches a step) and in the second epoch, SIGTERM.
    run 2 "$mpigrad" train --config base.ini --train.out_dir=full_accum --train.grad_accum_steps=2 > /dev/null 2>&1 || fail "full accumulation run failed"
    stop_and_resume 2 accum 0:24:TERM --train.grad_accum_steps=2
    grep -q "after step 25; saved accum/ckpt-epoch1-step25.h5" accum.stop.txt || { cat accum.stop.txt; fail "accumulation: wrong stop"; }
    same_as full_accum accum
    ;;
  preempt_all_ranks)  # a scheduler signals every rank: the stop line says so, not one of them
    stop_and_resume 2 all 0:7:USR1,1:7:USR1
    grep -q "preempted (signal USR1 on all 2 ranks) in epoch 1 after step 8; saved all/ckpt-epoch0-step8.h5; exit status 75" all.stop.txt \
      || { cat all.stop.txt; fail "the stop was not put down to every rank"; }
    # Two of four ranks, with two signals; and a signal that lands on rank 2 a step after rank 0's
    # (after the agreement was started, before the stop) counts too.
    stop_and_resume 4 some 1:5:TERM,3:5:USR1
    grep -q "preempted (signal USR1 on 1 of 4 ranks and TERM on 1 of 4 ranks) in epoch 1 after step 6" some.stop.txt \
      || { cat some.stop.txt; fail "two signals on two ranks were not both named"; }
    stop_and_resume 2 late 0:5:USR1,1:6:USR1
    grep -q "preempted (signal USR1 on all 2 ranks) in epoch 1 after step 6" late.stop.txt \
      || { cat late.stop.txt; fail "a signal a step later was not counted"; }
    ;;
  preempt_ranks)  # the same on 1 rank (the flag is read at once) and on 4, with keep_checkpoints
    run 1 "$mpigrad" train --config base.ini --train.out_dir=full1 > /dev/null 2>&1 || fail "1-rank full run failed"
    # 75 batches per epoch on 1 rank: step 80 is in the second epoch.
    stop_and_resume 1 part1 0:80:INT
    grep -q "preempted (signal INT on rank 0) in epoch 2 after step 80; saved part1/ckpt-epoch1-step80.h5" part1.stop.txt \
      || { cat part1.stop.txt; fail "1 rank: wrong stop"; }
    same_as full1 part1
    run 4 "$mpigrad" train --config base.ini --train.out_dir=full4 > /dev/null 2>&1 || fail "4-rank full run failed"
    stop_and_resume 4 part4 2:22:USR1 --train.keep_checkpoints=2
    # 19 batches per epoch on 4 ranks: step 23 is in the second epoch.
    grep -q "preempted (signal USR1 on rank 2) in epoch 2 after step 23; saved part4/ckpt-epoch1-step23.h5" part4.stop.txt \
      || { cat part4.stop.txt; fail "4 ranks: wrong stop"; }
    same_as full4 part4
    # keep_checkpoints counts mid-epoch checkpoints too, each newer than its epoch's start.
    [ "$(cd part4 && ls ckpt-*.h5 | tr '\n' ' ')" = "ckpt-epoch1-step23.h5 ckpt-epoch2.h5 " ] \
      || fail "kept: $(cd part4 && ls ckpt-*.h5 | tr '\n' ' ')"
    ;;
  preempt_time_limit)  # time_limit stops the run by itself, whatever the step; resumed = uninterrupted
    # Long enough that a 1 s limit stops it well before its end on a fast machine too: 60 epochs
    # took 3.5 s on one 2-core VM and 0.7 s of training on another, where the limit never came;
    # 300 take 3.5-17 s.
    long=(--train.epochs=300 --model.hidden=256)
    run 2 "$mpigrad" train --config base.ini "${long[@]}" --train.out_dir=full > /dev/null 2>&1 || fail "full run failed"
    status=0
    run 2 "$mpigrad" train --config base.ini "${long[@]}" --train.out_dir=part --train.time_limit=1s > stop.txt 2>&1 || status=$?
    [ "$status" -eq 75 ] || { cat stop.txt; fail "the timed-out run exited with $status, not 75"; }
    grep -q "preempted (time_limit 1s on rank 0's clock)" stop.txt || { cat stop.txt; fail "the stop was not put down to the time limit"; }
    ls part/ckpt-epoch*-step*.h5 > /dev/null || fail "no mid-epoch checkpoint"
    run 2 "$mpigrad" train --config base.ini "${long[@]}" --train.out_dir=part --train.resume=auto > resume.txt 2>&1 \
      || { cat resume.txt; fail "resumed run failed"; }
    same_as full part
    # A limit far beyond any job (over int64 nanoseconds) never stops it.
    run 2 "$mpigrad" train --config base.ini --train.out_dir=far --train.time_limit=200000d > far.txt 2>&1 \
      || { cat far.txt; fail "a 200000d time_limit stopped the run"; }
    ;;
  preempt_second_signal)  # more signals while the stop is being saved change nothing
    run 2 "$mpigrad" train --config base.ini --train.out_dir=full > /dev/null 2>&1 || fail "full run failed"
    stop_and_resume 2 part 1:7:TERM,0:stop:TERM,1:stop:INT,0:stop:USR1
    grep -q "after step 8; saved part/ckpt-epoch0-step8.h5" part.stop.txt || { cat part.stop.txt; fail "wrong stop"; }
    "$compare" part/ckpt-epoch0-step8.h5 part/ckpt-epoch0-step8.h5 0 > /dev/null || fail "the checkpoint does not load"
    same_as full part
    ;;
  preempt_ema_swa)  # the EMA and SWA states come back too: the resumed run's averages are bitwise equal
    averages=(--train.ema_decay=0.9 --train.swa_start=1 --train.swa_lr=0.02)
    run 2 "$mpigrad" train --config base.ini "${averages[@]}" --train.out_dir=full > full.txt 2>&1 || { cat full.txt; fail "full run failed"; }
    stop_and_resume 2 part 0:44:USR1 "${averages[@]}"
    grep -q "after step 45; saved part/ckpt-epoch1-step45.h5" part.stop.txt || { cat part.stop.txt; fail "wrong stop"; }
    grep -q "holds no state for hook" part.resume.txt && fail "the resumed run lost a hook's state"
    same_as full part
    "$compare" full/last.h5 part/last.h5 0 hooks/ema > /dev/null || fail "resumed EMA weights differ"
    "$compare" full/swa.h5 part/swa.h5 0 > /dev/null || fail "resumed SWA weights differ"
    ;;
  preempt_external)  # a real SIGTERM from outside, to one rank only, at whatever step it lands
    # 11400 steps, 3.5-17 s on 2-core VMs: the kill after step 20 lands long before the end.
    long=(--train.epochs=300 --model.hidden=256)
    run 2 "$mpigrad" train --config base.ini "${long[@]}" --train.out_dir=full > /dev/null 2>&1 || fail "full run failed"
    run 2 "$mpigrad" train --config base.ini "${long[@]}" --train.out_dir=part > stop.txt 2>&1 &
    launcher=$!
    for _ in $(seq 600); do
      grep -q '"step": 20,' part/metrics.jsonl 2> /dev/null && break
      sleep 0.05
    done
    ranks=($(pgrep -f -- "^$mpigrad train .*--train.out_dir=part" || true))
    [ "${#ranks[@]}" -ge 1 ] || fail "no rank process found"
    kill -TERM "${ranks[-1]}"
    status=0
    wait "$launcher" || status=$?
    [ "$status" -eq 75 ] || { cat stop.txt; fail "the signalled run exited with $status, not 75"; }
    grep -q "preempted (signal TERM on rank" stop.txt || { cat stop.txt; fail "the stop was not put down to TERM"; }
    run 2 "$mpigrad" train --config base.ini "${long[@]}" --train.out_dir=part --train.resume=auto > resume.txt 2>&1 \
      || { cat resume.txt; fail "resumed run failed"; }
    same_as full part
    ;;
  preempt_bad_values)  # bad stop_signals, time_limit and test variable: one clear error each
    expect_error "stop_signals: 'KILL' is not a stop signal; expected a comma-separated list of TERM" \
      --config base.ini --train.stop_signals=TERM,KILL
    expect_error "stop_signals: TERM is listed twice" --config base.ini --train.stop_signals=TERM,SIGTERM
    expect_error "time_limit: '90' is not a duration (the last number has no unit" \
      --config base.ini --train.time_limit=90
    expect_error "time_limit: '30m2h' is not a duration (units must come in the order d, h, m, s" \
      --config base.ini --train.time_limit=30m2h
    expect_error "time_limit: '3x' is not a duration (unknown unit 'x')" --config base.ini --train.time_limit=3x
    expect_error "time_limit: '-1h' is not a duration" --config base.ini --train.time_limit=-1h
    # Accepted forms, as the resolved config.ini prints them back.
    run 1 "$mpigrad" train --config base.ini --train.out_dir=ok --train.epochs=1 --train.stop_signals=sigusr2,hup \
      --train.time_limit=3h50m > ok.txt 2>&1 || { cat ok.txt; fail "accepted values refused"; }
    grep -q "^stop_signals = USR2,HUP$" ok/config.ini && grep -q "^time_limit = 3h50m$" ok/config.ini \
      || fail "config.ini: $(grep -E 'stop_signals|time_limit' ok/config.ini | tr '\n' ' ')"
    status=0
    MPIGRAD_TEST_RAISE_SIGNAL=0:x:TERM run 1 -x MPIGRAD_TEST_RAISE_SIGNAL "$mpigrad" train --config base.ini \
      --train.out_dir=bad > bad.txt 2>&1 || status=$?
    [ "$status" -ne 0 ] && grep -q "MPIGRAD_TEST_RAISE_SIGNAL: '0:x:TERM'" bad.txt || { cat bad.txt; fail "bad test variable accepted"; }
    ;;
  preempt_resume_mismatch)  # a mid-epoch position resumed by another run: an error naming the file
    status=0
    MPIGRAD_TEST_RAISE_SIGNAL=1:7:USR1 run 2 -x MPIGRAD_TEST_RAISE_SIGNAL "$mpigrad" train --config base.ini \
      --train.out_dir=part > stop.txt 2>&1 || status=$?
    [ "$status" -eq 75 ] || { cat stop.txt; fail "the stopped run exited with $status, not 75"; }
    ckpt=part/ckpt-epoch0-step8.h5
    mismatch() {  # mismatch PATTERN RANKS FLAGS...
      local pattern=$1 ranks=$2; shift 2
      if run "$ranks" "$mpigrad" train --config base.ini --train.out_dir=other --train.resume=$ckpt "$@" > m.txt 2>&1; then
        cat m.txt; fail "resumed despite: $*"
      fi
      grep -q -- "$pattern" m.txt || { cat m.txt; fail "missing '$pattern' for: $*"; }
      grep -q "^\[rank [0-9]/$ranks\]" m.txt || { cat m.txt; fail "error does not name the rank: $*"; }
      [ ! -e other/ckpt-epoch1.h5 ] || fail "trained despite: $*"
    }
    mismatch "$ckpt was taken mid-epoch by 2 rank(s); its data position holds only on as many, and this run has 1" 1
    mismatch "$ckpt was taken mid-epoch with 38 batches per epoch per rank; this run has 19" 2 --train.batch_size=32
    mismatch "$ckpt was taken mid-epoch, but this run's order of batches for epoch 1 differs" 2 --train.seed=4
    mismatch "$ckpt was taken mid-epoch, but this run's order of batches for epoch 1 differs" 2 --train.shuffle=false
    ;;
  resume_all_unreadable)  # resume = auto with checkpoints of which none loads: an error naming them
    run 2 "$mpigrad" train --config base.ini --train.out_dir=out > /dev/null 2>&1 || fail "first run failed"
    for f in out/ckpt-epoch1.h5 out/ckpt-epoch2.h5; do truncate -s 1000 "$f"; done
    if run 2 "$mpigrad" train --config base.ini --train.out_dir=out --train.resume=auto > again.txt 2>&1; then
      cat again.txt; fail "resume = auto started although no checkpoint loads"
    fi
    grep -q "^\[rank [01]/2\].*resume = auto: none of the 2 checkpoint(s) in 'out' can be loaded (out/ckpt-epoch2.h5, out/ckpt-epoch1.h5)" again.txt \
      || { cat again.txt; fail "the error does not name the files"; }
    [ "$(stat -c %s out/ckpt-epoch1.h5)" -eq 1000 ] || fail "the unreadable checkpoints were touched"
    ;;
  *)
    fail "unknown check"
    ;;
esac
echo "PASS ($check)"
