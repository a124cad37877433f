#!/usr/bin/env bash
# Stands in for mpirun in the job checks (tests/comm/check_failure.sh, tests/ddp/check_exit.sh) so
# they run on scripts/cluster-sim.sh's nodes: "cluster_mpirun.sh -np N [--oversubscribe] ARGS..."
# runs ARGS on CLUSTER_SIM_NODES nodes (2 if unset) with N / nodes ranks each, at
# CLUSTER_SIM_RATE (10gbit if unset). The nodes share this machine's cores, more ranks than cores,
# so mpi_yield_when_idle is on; and as mpirun over ssh would need, every MPIGRAD_* variable the
# test set is passed to the ranks with -x.
set -u
nodes=${CLUSTER_SIM_NODES:-2}
ranks=0
args=()
for name in $(compgen -e | grep '^MPIGRAD_'); do args+=(-x "$name"); done
while (($#)); do
  case $1 in
    -np | -n) ranks=$2; shift 2 ;;
    --oversubscribe) shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if ((ranks < nodes || ranks % nodes != 0)); then
  echo "cluster_mpirun.sh: $ranks ranks do not fill $nodes nodes evenly" >&2
  exit 2
fi
exec "$(dirname "$0")/../../scripts/cluster-sim.sh" --nodes "$nodes" \
  --ranks-per-node $((ranks / nodes)) --rate "${CLUSTER_SIM_RATE:-10gbit}" --yield on -- \
  "${args[@]}"
