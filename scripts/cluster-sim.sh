#!/usr/bin/env bash
# cluster-sim.sh: a small cluster on one machine, for testing and measuring mpigrad's multi-node
# paths over a real (rate-limited) network instead of MPIGRAD_SIMULATE_NODES's shared memory.
#
#   scripts/cluster-sim.sh [--nodes K] [--ranks-per-node R] [--rate 2gbit] [--burst-ms 2]
#                          [--cores-per-node C] [--yield on|off] [--partition-after SECONDS]
#                          [--shell] -- [mpirun args] PROGRAM...
#   scripts/cluster-sim.sh --probe    exit 0 if this machine can build the cluster, else 77
#
# Each node is a network namespace plus a UTS and mount namespace (held by one sleeping process)
# with its own host name (node0, node1, ...), its own /etc/hosts and a private tmpfs on /dev/shm.
# The nodes' veth links meet on a bridge inside a separate "switch" namespace, so nothing is added
# to the machine's own network namespace and the 10.77.0.0/24 addresses exist only in there.
# Each node's egress is limited by `tc qdisc ... tbf` to --rate (netem is not in every kernel), at
# line rate: the token bucket holds --burst-ms of the rate (2 ms by default, at least one 64 KiB
# segment), so a link moves no more than its rate over any few milliseconds. (A 10 ms burst let
# a "1 Gbit/s" link move 0.128 GB/s; the line that starts the cluster states the burst.)
# mpirun runs on node0 and starts orted on the other nodes through a plm_rsh_agent script that
# enters that node's namespaces (nsenter) where ssh would log in: TCP between nodes, vader (shared
# memory) inside each. As over ssh, the other nodes get a clean login environment (HOME, USER,
# PATH, LANG): a variable reaches their ranks only when mpirun passes it (-x NAME), while node0's
# ranks, beside mpirun, see the caller's. As root, OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) is set.
#
# --cores-per-node C pins each node's processes to C cores of its own (taskset), as on a real node
# with fewer cores than ranks. --yield on sets Open MPI's mpi_yield_when_idle, which a node with
# more ranks than cores needs (docs/clusters.md, "Busy-polling"); it is off by default, as on a
# cluster, so that busy-polling shows. --partition-after S takes the last node's link down S
# seconds after the start, to test what the job does when a node drops off the network. --shell
# runs the command on node0 itself instead of under mpirun, with CLUSTER_SIM_MPIRUN naming an
# mpirun for this cluster: several jobs in one cluster (a stop, then its resume, with each node's
# /dev/shm as its node-local scratch).
#
# Exit status: mpirun's (or the --shell command's); 77 (with one line) when this machine cannot
# build namespaces (not root, no ip/unshare/nsenter/tc, or namespaces not allowed), so ctest can
# skip. Everything it creates (namespaces, links, processes inside them, temporary files) is
# removed on exit, on error and on Ctrl-C; a process still running in a node then is named on
# stderr ("cluster-sim: left over on node1: ...") before it is killed, since after a clean job
# there is none.
set -uo pipefail

nodes=2 ranks_per_node=2 rate=10gbit burst_ms=2 cores_per_node=0 yield=off partition_after=0
probe=0 shell=0
usage() { sed -n '4,7p' "$0" >&2; exit 2; }
while (($#)); do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --ranks-per-node) ranks_per_node=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst-ms) burst_ms=$2; shift 2 ;;
    --cores-per-node) cores_per_node=$2; shift 2 ;;
    --yield) yield=$2; shift 2 ;;
    --partition-after) partition_after=$2; shift 2 ;;
    --probe) probe=1; shift ;;
    --shell) shell=1; shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "cluster-sim: unknown option '$1'" >&2; usage ;;
  esac
done
((probe || $#)) || usage
[[ $nodes =~ ^[1-9][0-9]?$ && $ranks_per_node =~ ^[1-9][0-9]*$ ]] ||
  { echo "cluster-sim: --nodes must be 1..99 and --ranks-per-node a positive number" >&2; exit 2; }
[[ $rate =~ ^[0-9]+(kbit|mbit|gbit)$ ]] ||
  { echo "cluster-sim: --rate '$rate' must look like 500mbit or 2gbit" >&2; exit 2; }
[[ $yield == on || $yield == off ]] || { echo "cluster-sim: --yield must be on or off" >&2; exit 2; }
[[ $burst_ms =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v b="$burst_ms" 'BEGIN { exit !(b > 0) }' ||
  { echo "cluster-sim: --burst-ms '$burst_ms' must be a positive number of milliseconds" >&2; exit 2; }
[[ $cores_per_node =~ ^[0-9]+$ && $partition_after =~ ^[0-9]+$ ]] ||
  { echo "cluster-sim: --cores-per-node and --partition-after take whole numbers" >&2; exit 2; }

skip() { echo "cluster-sim: skipped: $*"; exit 77; }
((EUID == 0)) || skip "needs root to create network namespaces"
for tool in ip unshare nsenter tc taskset mpirun; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed"
done

# Names unique to this run, so several runs (parallel ctest) never meet.
tag="mgc$$"
switch="${tag}sw"
work=$(mktemp -d "/tmp/cluster-sim.XXXXXX")
declare -a holders=()

node_ns() { echo "${tag}n$1"; }
cleanup() {
  trap - EXIT INT TERM
  local ns pids pid left
  for ((k = 0; k < nodes; k++)); do
    ns=$(node_ns "$k")
    # Whatever still runs in the node (orted or a rank left behind after a failure) is named,
    # then goes, with the holder: a namespace lives on, unnamed, while a process is inside it.
    pids=$(ip netns pids "$ns" 2>/dev/null)
    left=""
    for pid in $pids; do
      [[ " ${holders[*]} " == *" $pid "* ]] && continue
      left+="${left:+, }$pid ($(ps -o args= -p "$pid" 2>/dev/null | cut -c1-80))"
    done
    [[ -n $left ]] && echo "cluster-sim: left over on node$k, killed now: $left" >&2
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  ((${#holders[@]})) && kill -9 "${holders[@]}" 2>/dev/null
  ip netns del "$switch" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$switch" 2>/dev/null || skip "cannot create a network namespace here ('ip netns add' failed)"
((probe)) && exit 0
ip -n "$switch" link add br0 type bridge || exit 1
ip -n "$switch" link set br0 up || exit 1

# The token bucket holds --burst-ms of the rate: what a link may send above its rate in a moment.
# tbf drops a packet larger than the bucket, so it holds at least one 64 KiB GSO segment and its
# headers.
burst=$(awk -v r="$rate" -v ms="$burst_ms" 'BEGIN {
  n = r + 0; unit = substr(r, length(n "") + 1)
  bits = n * (unit == "gbit" ? 1e9 : unit == "mbit" ? 1e6 : 1e3)
  b = bits / 8 * ms / 1000; if (b < 70000) b = 70000; printf "%d", b }')
burst_text=$(awk -v b="$burst" -v r="$rate" 'BEGIN {
  n = r + 0; unit = substr(r, length(n "") + 1)
  bytes = n * (unit == "gbit" ? 1e9 : unit == "mbit" ? 1e6 : 1e3) / 8
  printf "tbf burst %d B = %.2g ms at %s", b, b / bytes * 1000, r }')

subnet=10.77.0
for ((k = 0; k < nodes; k++)); do
  echo "$subnet.$((k + 1)) node$k" >>"$work/hosts"
  echo "node$k slots=$ranks_per_node" >>"$work/hostfile"
done
printf '127.0.0.1 localhost\n' >>"$work/hosts"

for ((k = 0; k < nodes; k++)); do
  ns=$(node_ns "$k")
  ip netns add "$ns" || exit 1
  ip -n "$switch" link add "v$k" type veth peer name eth0 netns "$ns" || exit 1
  ip -n "$switch" link set "v$k" master br0 up || exit 1
  ip -n "$ns" addr add "$subnet.$((k + 1))/24" dev eth0 || exit 1
  ip -n "$ns" link set lo up && ip -n "$ns" link set eth0 up || exit 1
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms ||
    exit 1
  # The holder keeps the node's UTS and mount namespaces alive for nsenter; "ready" says its
  # host name and mounts are in place.
  ip netns exec "$ns" unshare --uts --mount --propagation private -- sh -c "
    hostname node$k && mount -t tmpfs -o size=4g,mode=1777 shm /dev/shm &&
    mount --bind '$work/hosts' /etc/hosts && echo ready > '$work/ready$k' && exec sleep infinity" &
  holders+=($!)
  disown $!
  echo "$k $!" >>"$work/holders"
done
for ((k = 0; k < nodes; k++)); do
  tries=0
  while [[ ! -s $work/ready$k ]] && ((tries++ < 100)); do sleep 0.05; done
  [[ -s $work/ready$k ]] || { echo "cluster-sim: node$k did not come up" >&2; exit 1; }
done

# Cores for node k when --cores-per-node is given: C of the machine's cores, wrapping around.
cpus() {
  local k=$1 total list="" c
  total=$(nproc --all)
  for ((c = 0; c < cores_per_node; c++)); do list+="${list:+,}$(((k * cores_per_node + c) % total))"; done
  echo "$list"
}
{
  echo '#!/usr/bin/env bash'
  echo '# plm_rsh_agent for cluster-sim.sh: "agent [ssh options] HOST COMMAND..." runs COMMAND'
  echo '# on HOST the way ssh would (through a shell), inside that node'"'"'s namespaces.'
  echo 'while [[ $1 == -* ]]; do shift; done'
  echo 'host=$1; shift'
  echo 'k=${host#node}'
  echo "pid=\$(awk -v k=\"\$k\" '\$1 == k { print \$2 }' '$work/holders')"
  echo '[[ -n $pid ]] || { echo "cluster-sim agent: no node named $host" >&2; exit 255; }'
  echo 'pin=()'
  for ((k = 0; k < nodes; k++)); do
    ((cores_per_node > 0)) && echo "[[ \$k == $k ]] && pin=(taskset -c $(cpus "$k"))"
  done
  # What ssh would give: a login environment, not the caller's; mpirun's -x adds to it.
  printf 'login=(HOME=%q USER=%q LOGNAME=%q SHELL=/bin/sh LANG=C.UTF-8 PATH=%q)\n' \
    "${HOME:-/root}" "$(id -un)" "$(id -un)" "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  echo 'exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- env -i "${login[@]}" "${pin[@]}" /bin/sh -c "$*"'
} >"$work/agent"
chmod +x "$work/agent"

if ((partition_after > 0)); then
  last=$(node_ns $((nodes - 1)))
  (sleep "$partition_after" && ip -n "$last" link set eth0 down &&
    echo "cluster-sim: node$((nodes - 1))'s link is down (partition)" >&2) &
fi

yield_value=0
[[ $yield == on ]] && yield_value=1
pin0=()
((cores_per_node > 0)) && pin0=(taskset -c "$(cpus 0)")
# mpirun refuses root unless told; a cluster user is not root, but this script must be.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  echo '#!/usr/bin/env bash'
  echo '# mpirun for the cluster of cluster-sim.sh: "$CLUSTER_SIM_MPIRUN [mpirun args] PROGRAM...".'
  printf 'exec mpirun -np %d --hostfile %q --bind-to none --mca plm rsh --mca plm_rsh_agent %q ' \
    $((nodes * ranks_per_node)) "$work/hostfile" "$work/agent"
  printf -- '--mca pml ob1 --mca btl tcp,self,vader --mca btl_tcp_if_include %q ' "$subnet.0/24"
  printf -- '--mca oob_tcp_if_include %q --mca mpi_yield_when_idle %d "$@"\n' "$subnet.0/24" \
    "$yield_value"
} >"$work/mpirun"
chmod +x "$work/mpirun"
echo "cluster-sim: $nodes node(s) x $ranks_per_node rank(s), links at $rate ($burst_text; kernel HZ $(
  zcat /proc/config.gz 2>/dev/null | sed -n 's/^CONFIG_HZ=//p' | grep . || echo unknown))$(
  ((cores_per_node)) && echo ", $cores_per_node core(s) per node"), mpi_yield_when_idle=$yield_value" >&2
if ((shell)); then
  launch=(env CLUSTER_SIM_MPIRUN="$work/mpirun" "$@")
else
  launch=("$work/mpirun" "$@")
fi
nsenter -t "${holders[0]}" --net --uts --mount --wd="$PWD" -- "${pin0[@]}" "${launch[@]}" &
# In the background and waited for, so that Ctrl-C or a TERM reaches the trap (and the cleanup)
# even while mpirun hangs, as it does when a node has dropped off the network.
launcher=$!
wait "$launcher"
exit $?
