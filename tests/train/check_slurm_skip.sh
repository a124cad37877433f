#!/usr/bin/env bash
# preempt_slurm.sh where slurm-wlm and munge are not installed: one line, and exit 77 (ctest's
# skip), whatever this machine has. It runs with a PATH that holds only the tools the script needs
# before its checks, so munged, slurmctld and the rest cannot be found.
#   check_slurm_skip.sh PREEMPT_SLURM_SH
set -uo pipefail
script=$1
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for tool in bash realpath dirname; do ln -s "$(command -v "$tool")" "$bin/$tool"; done
status=0
output=$(PATH=$bin bash "$script" mpigrad compare report "$bin/work" 2>&1) || status=$?
echo "$output"
[[ $status -eq 77 ]] || { echo "FAIL: exit status $status, not 77 (a skip)"; exit 1; }
[[ $(wc -l <<<"$output") -eq 1 ]] || { echo "FAIL: more than one line"; exit 1; }
grep -qE "^preempt_slurm.sh: skipped: ('munged' is not installed \(apt-get install slurm-wlm munge\)|needs root)" <<<"$output" ||
  { echo "FAIL: the line does not say what is missing"; exit 1; }
echo "PASS (skipped with one line)"
