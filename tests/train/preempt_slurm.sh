#!/usr/bin/env bash
# The stop-and-requeue cycle under a real Slurm, on a private single-node slurmctld and slurmd
# (munge for authentication) that this script starts and stops:
#   preempt_slurm.sh MPIGRAD COMPARE THREAD_REPORT WORKDIR
# - scripts/slurm-mpirun-job.sh (mpirun inside the batch script): USR1 to the batch shell, which is
#   what #SBATCH --signal=B:USR1@N sends (scancel --batch --signal=USR1 sends it now rather than
#   near a time limit), stops both ranks with a checkpoint (exit 75), the script requeues the job,
#   and its second start resumes and ends bitwise equal to an uninterrupted run;
# - TERM to the batch shell (scancel --batch --signal=TERM) stops it the same way, without a
#   requeue;
# - srun --mpi=pmix -n 2, no --ntasks-per-node: each rank takes its share of the node's cores, the
#   node's ranks counted by MPI.
# Where Slurm or munge is not installed, or its daemons do not come up, it prints one line and
# exits 77 (a skip). Slurm delays a requeued job's start by two minutes; the script moves it to
# now (scontrol update StartTime=now) so that the check takes well under a minute.
set -uo pipefail
mpigrad=$1 compare=$2 report=$3 work=$4
here=$(realpath "$(dirname "$0")")
job_script=$here/../../scripts/slurm-mpirun-job.sh
skip() { echo "preempt_slurm.sh: skipped: $*"; exit 77; }
((EUID == 0)) || skip "needs root to run a private slurmctld and slurmd"
for tool in munged slurmctld slurmd sbatch scontrol scancel srun; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed (apt-get install slurm-wlm munge)"
done
[[ -r /etc/munge/munge.key ]] || skip "no munge key at /etc/munge/munge.key"
host=$(hostname -s)
getent hosts "$host" >/dev/null || skip "this host's name '$host' does not resolve"

rm -rf "$work" && mkdir -p "$work"/slurm/{etc,spool,state,log,run} && cd "$work" || exit 1
slurm=$work/slurm
export SLURM_CONF=$slurm/etc/slurm.conf
cleanup() {
  # Our jobs first, then our daemons, by the pids they wrote.
  scancel --quiet --full "--partition=mpigradtest" 2>/dev/null
  for _ in $(seq 50); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.2; done
  local pid
  for daemon in slurmd slurmctld munged; do
    [[ -s $slurm/run/$daemon.pid ]] || continue
    pid=$(cat "$slurm/run/$daemon.pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  done
}
trap cleanup EXIT
port=$((20000 + RANDOM % 9000))
cat >"$SLURM_CONF" <<CONF
ClusterName=mpigrad$$
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$slurm/run/munge.sock
CredType=cred/munge
StateSaveLocation=$slurm/state
SlurmdSpoolDir=$slurm/spool
SlurmctldPidFile=$slurm/run/slurmctld.pid
SlurmdPidFile=$slurm/run/slurmd.pid
SlurmctldLogFile=$slurm/log/slurmctld.log
SlurmdLogFile=$slurm/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobRequeue=1
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=mpigradtest Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
munged --force --socket="$slurm/run/munge.sock" --pid-file="$slurm/run/munged.pid" \
  --log-file="$slurm/log/munged.log" --seed-file="$slurm/run/munge.seed" ||
  skip "munged does not start"
slurmctld -f "$SLURM_CONF" || skip "slurmctld does not start"
slurmd -f "$SLURM_CONF" || skip "slurmd does not start"
for _ in $(seq 100); do
  [[ $(sinfo -h -o %t 2>/dev/null) == idle ]] && break
  sleep 0.2
done
[[ $(sinfo -h -o %t 2>/dev/null) == idle ]] ||
  skip "the single-node Slurm did not come up: $(tail -1 "$slurm/log/slurmctld.log" 2>/dev/null)"

fail() { echo "FAIL (Slurm): $*"; exit 1; }
state() { scontrol show job "$1" 2>/dev/null | sed -nE "s/.*\\b$2=([^ ]+).*/\\1/p" | head -1; }
wait_for_step() {  # wait_for_step OUT_DIR STEP
  for _ in $(seq 600); do
    grep -q "\"step\": $2," "$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
wait_until_done() {  # wait_until_done JOB
  for _ in $(seq 600); do
    case $(state "$1" JobState) in COMPLETED | FAILED | CANCELLED) return 0 ;; esac
    sleep 0.1
  done
  return 1
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MPIGRAD_NUM_THREADS=1
"$mpigrad" data synth -o train.h5 --samples 1200 --shape 1,8,8 --seed 1 >/dev/null || exit 1
cat >base.ini <<INI
[data]
train = train.h5
num_classes = 10
augment = crop:1,flip
[model]
name = mlp
hidden = 256
dropout = 0.2
[optim]
lr = 0.05
momentum = 0.9
[train]
epochs = 100
batch_size = 16
seed = 3
log_every = 10
resume = auto
INI
mpirun -np 2 --oversubscribe "$mpigrad" train --config base.ini --train.out_dir=full >full.txt 2>&1 ||
  { cat full.txt; fail "the uninterrupted run failed"; }
submit() {  # submit NAME: the job script on 2 ranks of this node, out_dir NAME
  sed "s|^resume = auto\$|resume = auto\nout_dir = $1|" base.ini >"$1.ini"
  MPIGRAD=$mpigrad MPIRUN_ARGS="--oversubscribe -x MPIGRAD_NUM_THREADS" \
    sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 --time=10 -o "$1.log" \
    "$job_script" "$1.ini"
}

# USR1 to the batch shell: stop, requeue, resume, bitwise the uninterrupted run.
job=$(submit requeue) || fail "sbatch refused the job script"
wait_for_step requeue 20 || { cat requeue.log; fail "the job never reached step 20"; }
scancel --batch --signal=USR1 "$job"
for _ in $(seq 300); do
  [[ $(state "$job" Restarts) == 1 ]] && break
  sleep 0.1
done
[[ $(state "$job" Restarts) == 1 ]] || { cat requeue.log; fail "the job was not requeued"; }
# Restarts may read 1 before the requeue has set the start two minutes ahead (an update then is
# undone), and slurmd refuses a start in the same seconds as the first run's end ("Job credential
# revoked", which is what Slurm's delay guards against): so once the job is pending again, wait
# 3 s, then move the start to now until it runs.
for _ in $(seq 300); do
  [[ $(state "$job" JobState) == PENDING ]] && break
  sleep 0.1
done
sleep 3
for _ in $(seq 300); do
  case $(state "$job" JobState) in
    PENDING) scontrol update JobId="$job" StartTime=now ;;
    *) break ;;
  esac
  sleep 0.2
done
wait_until_done "$job" || { cat requeue.log; fail "the requeued job did not finish"; }
cat requeue.log | grep -v '^epoch'
[[ $(state "$job" JobState) == COMPLETED ]] || fail "the requeued job ended $(state "$job" JobState)"
grep -q "preempted (signal USR1 on all 2 ranks) in epoch" requeue.log || fail "no stop on USR1"
grep -q "slurm-mpirun-job.sh: stopped with a checkpoint; requeueing job $job" requeue.log ||
  fail "the script did not requeue"
grep -qE "resume = auto: resuming from requeue/ckpt-epoch[0-9]+-step[0-9]+\.h5" requeue.log ||
  fail "the second start did not resume from the stop checkpoint"
"$compare" full/last.h5 requeue/last.h5 0 >/dev/null ||
  fail "the requeued run's final weights differ from the uninterrupted run's"

# TERM to the batch shell: the same stop, no requeue.
job=$(submit stop) || fail "sbatch refused the job script"
wait_for_step stop 20 || { cat stop.log; fail "the job never reached step 20"; }
scancel --batch --signal=TERM "$job"
wait_until_done "$job" || { cat stop.log; fail "the job did not end after TERM"; }
grep -q "preempted (signal USR1 on all 2 ranks) in epoch" stop.log || { cat stop.log; fail "no stop on TERM"; }
grep -q "requeueing" stop.log && fail "requeued after TERM"
[[ $(state "$job" Restarts) == 0 && $(state "$job" ExitCode) == 75:0 ]] ||
  fail "after TERM: restarts $(state "$job" Restarts), exit code $(state "$job" ExitCode)"
ls stop/ckpt-epoch*-step*.h5 >/dev/null 2>&1 || fail "no stop checkpoint after TERM"

# srun --mpi=pmix -n 2: the ranks on the node come from MPI, not from Slurm's variables.
cores=$(nproc)
share=$((cores / 2 > 0 ? cores / 2 : 1))
env -u MPIGRAD_NUM_THREADS srun --mpi=pmix -n 2 "$report" >srun.txt 2>&1 || { cat srun.txt; fail "srun --mpi=pmix -n 2 failed"; }
cat srun.txt
[[ $(grep -c "^rank [01]/2: $share thread(s) ($cores cores in the affinity mask, shared by 2 ranks of the node)" srun.txt) -eq 2 ]] ||
  fail "srun -n 2: each rank should take $share thread(s)"
echo "PASS (Slurm: requeue on USR1, stop on TERM, srun --mpi=pmix threads)"
