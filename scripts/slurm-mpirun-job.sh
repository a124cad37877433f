#!/bin/bash
# A Slurm batch script for sites that start MPI jobs with Open MPI's mpirun inside the allocation
# (docs/preemption.md, "Under mpirun"): it stops the run with a checkpoint before the time limit,
# requeues itself, and the next start resumes where it stopped ([train] resume = auto).
#
#   sbatch scripts/slurm-mpirun-job.sh run.ini    # run.ini: [train] out_dir = ..., resume = auto
#
# MPIGRAD (default: mpigrad) names the program and MPIRUN_ARGS adds to mpirun's arguments. Tested
# by tests/train/preempt_slurm.sh on a single-node Slurm.
#SBATCH --nodes=2 --ntasks-per-node=4 --time=04:00:00
#SBATCH --signal=B:USR1@180   # USR1 to this script (B:) 180 s before the time limit
#SBATCH --requeue --open-mode=append
set -u
config=${1:?usage: sbatch slurm-mpirun-job.sh CONFIG}
read -ra extra <<<"${MPIRUN_ARGS:-}"
# In the background and waited for: bash runs a trap only between commands, and mpirun may run
# for hours.
mpirun "${extra[@]}" "${MPIGRAD:-mpigrad}" train --config "$config" &
launcher=$!
requeue=1
# --signal=B: reaches this script alone (without B:, only srun's steps, and mpirun is none); Open
# MPI's mpirun passes USR1 on to every rank, which stop at a step's end, save and exit 75.
trap 'kill -USR1 "$launcher"' USR1
# scancel --batch --signal=TERM: the same stop, without coming back. A plain scancel signals every
# process of the job at once, mpirun too, which ends the ranks about 2 s later: they save if they
# can (the write is atomic), the job is CANCELLED, and a later sbatch resumes from the newest file.
trap 'requeue=0; kill -USR1 "$launcher"' TERM
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; done
wait "$launcher"
status=$?
if [ "$status" -eq 75 ] && [ "$requeue" -eq 1 ]; then
  echo "slurm-mpirun-job.sh: stopped with a checkpoint; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
