#!/usr/bin/env bash
# Runs its arguments when this machine can build scripts/cluster-sim.sh's namespaces; otherwise
# prints the one line saying why and exits 77, which ctest reports as a skip.
here=$(dirname "$0")
"$here/../../scripts/cluster-sim.sh" --probe || exit 77
exec "$@"
