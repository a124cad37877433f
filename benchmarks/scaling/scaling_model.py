#!/usr/bin/env python3
"""alpha-beta model of DDP's step time, projected from 1 to 1,024 nodes (weak scaling).

    python3 benchmarks/scaling/scaling_model.py [--ddp-json ddp.json] [--csv FILE]

Weak scaling: every rank keeps its batch, so compute per step stays what one rank measures; the
only thing that grows with the node count is communication. For each model, node kind, network
and all-reduce scheme the script prints the parallel efficiency E(N) = compute / step time.

Calibration (this machine, 2-core VM; pass --ddp-json with a mpigrad-bench-ddp JSON to use your
own): the 9.4M-parameter MLP's step without communication (step_nocomm_ms) and the shared-memory
averaging of its 36 MiB of gradients inside a step (3 ms, stop 10's in-step figure, i.e. an
effective 12.6 GB/s for a node's average; shared_average_all_grads_ms is the hot 1.4 ms). Stated
network figures: HDR InfiniBand 25 GB/s and NDR 50 GB/s a NIC, 2 us per hop; H200 nodes: 8 GPUs,
NVLink 450 GB/s busbw (nccl-tests), one NDR NIC per GPU.

Model (the assumptions, stated once):
  * all-reduce of M bytes over n endpoints, link bandwidth beta, latency alpha per message:
      ring  2 (n-1) alpha + 2 (n-1)/n M / beta
      tree  2 ceil(log2 n) alpha + 2 (n-1)/n M / beta   (double binary tree / Rabenseifner:
            logarithmic latency, bandwidth-optimal, as NCCL's tree and MPI's large-message
            algorithms are)
  * flat: every rank is an endpoint. A ring in rank order crosses the network once per node, so
    it runs at the NIC's bandwidth but pays 2 (P-1) alphas over P = N x L ranks; a tree's
    partners are mostly on other nodes, so the L ranks of a node share its NIC(s).
  * hierarchical (mpigrad's, Horovod's, NCCL's): a reduce-scatter inside the node, an all-reduce
    of each rank's shard M/L across the N nodes (ring or tree) on the ranks sharing its local
    rank, an all-gather inside the node. Inside a CPU node the two node steps cost one shared-
    memory averaging (measured); inside a GPU node 2 (L-1)/L M / busbw. CPU nodes share one NIC
    among their L ranks; GPU nodes have one NIC per GPU. mpigrad adds one tiny status all-reduce
    per bucket (2 log2 N alpha).
  * overlap: DDP's buckets (25 MiB, the first 1 MiB, in backward order) become ready as backward
    produces their bytes at a constant rate over the backward pass (2/3 of compute); one link
    serves them in order; what is still being sent when backward ends is exposed. The last
    bucket can only start then, so at least its all-reduce is always exposed.
  * communication costs the compute nothing: true for NIC and NVLink DMA, and for CPU nodes that
    leave a core to the communication thread; on the 2-core VM, where it does not,
    mpigrad-bench-ddp measures the difference.
  * no congestion, no stragglers, no topology effects beyond one NIC per node (or GPU): a full
    fat tree. Real jobs at 1,024 nodes lose more, which is why the published figures matter.
"""

import argparse
import json
import math
import sys

MIB = 1 << 20
US = 1e-6

# Published weak-scaling figures, with their setups, to set beside the model (see
# docs/benchmarks.md, "Scaling").
PUBLISHED = [
    ("Horovod (Sergeev & Del Balso 2018; horovod docs/benchmarks)",
     "32 servers x 4 Pascal GPUs, 25 Gbit/s RoCE, TensorFlow",
     "128 GPUs: 90% Inception V3, 90% ResNet-101, 79% VGG-16"),
    ("Horovod (same authors, later run)",
     "128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE",
     "512 GPUs: 90% Inception V3, 90% ResNet-101, 68% VGG-16"),
    ("PyTorch DDP (Li et al., VLDB 2020)",
     "their GPU cluster, NCCL",
     "'near-linear scalability using 256 GPUs' (abstract)"),
]


def ring(n, size, alpha, beta):
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta


def tree(n, size, alpha, beta):
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * alpha + 2 * (n - 1) / n * size / beta


ALGORITHMS = {"ring": ring, "tree": tree}


class NodeKind:
    def __init__(self, name, ranks, intra, edge_gbps, nic_per_rank, nic_gbps, alpha_us, gpu):
        self.name = name
        self.ranks = ranks              # L
        self.intra = intra              # seconds for the node's average of M bytes: intra(M)
        self.edge = edge_gbps * 1e9     # bytes/s between two ranks of the node (a ring's edge)
        self.nic_per_rank = nic_per_rank
        self.beta = nic_gbps * 1e9      # bytes/s of one NIC
        self.alpha = alpha_us * US
        self.gpu = gpu


def all_reduce_time(scheme, algorithm, nodes, node, size):
    """Seconds for one bucket of `size` bytes over `nodes` nodes of `node`."""
    ranks = nodes * node.ranks
    inter = ALGORITHMS[algorithm]
    if nodes == 1:
        return node.intra(size)
    if scheme == "flat":
        if algorithm == "ring":
            # A ring in rank order leaves each node once: its bandwidth is the NIC's (one ring
            # per NIC when every GPU has one, as NCCL builds them), or the node's inner edges'.
            nics = node.ranks if node.nic_per_rank else 1
            return inter(ranks, size, node.alpha, min(node.beta * nics, node.edge))
        share = 1 if node.nic_per_rank else node.ranks  # the node's ranks share its NIC
        return inter(ranks, size, node.alpha, node.beta / share)
    # hierarchical: node steps, then each rank's shard across the nodes on its own group
    shard = size / node.ranks
    beta = node.beta if node.nic_per_rank else node.beta / node.ranks
    status = 2 * math.ceil(math.log2(nodes)) * node.alpha  # mpigrad's status word
    return node.intra(size) + inter(nodes, shard, node.alpha, beta) + status


def step_time(model, scheme, algorithm, nodes, node):
    """compute + the communication still in flight when backward ends."""
    backward = model["compute_s"] * model["backward_fraction"]
    total = sum(model["buckets"])
    ready, link_free = 0.0, 0.0
    produced = 0.0
    for size in model["buckets"]:  # launch order
        produced += size
        ready = backward * produced / total
        start = max(ready, link_free)
        link_free = start + all_reduce_time(scheme, algorithm, nodes, node, size)
    return model["compute_s"] + max(0.0, link_free - backward)


def ddp_buckets(parameter_bytes_backward, cap=25 * MIB, first_cap=1 * MIB):
    """DDP's buckets (distributed_data_parallel.cpp's plan_buckets) from parameter sizes in
    backward order."""
    buckets = []
    for size in parameter_bytes_backward:
        limit = first_cap if len(buckets) <= 1 else cap
        if buckets and (buckets[-1] == 0 or buckets[-1] + size <= limit):
            buckets[-1] += size
        else:
            buckets.append(size)
    return buckets


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ddp-json", help="mpigrad-bench-ddp --json output to calibrate from")
    parser.add_argument("--mlp-compute-ms", type=float, default=49.2,
                        help="MLP step without communication, one rank (default: measured)")
    parser.add_argument("--shm-average-ms", type=float, default=3.0,
                        help="shared-memory average of the MLP's gradients in a step")
    parser.add_argument("--resnet-compute-ms", type=float, default=100.0)
    parser.add_argument("--mlp-gpu-compute-ms", type=float,
                        help="the MLP's step on an H200 (not measured: without it the MLP is "
                             "projected on CPU nodes only)")
    parser.add_argument("--csv", help="also write every point as CSV")
    args = parser.parse_args()
    if args.ddp_json:
        with open(args.ddp_json) as handle:
            measured = json.load(handle)
        args.mlp_compute_ms = measured["step_nocomm_ms"]

    mlp_bytes = 9_443_328 * 4
    shm_bandwidth = mlp_bytes / (args.shm_average_ms * 1e-3)  # a node's averaging, bytes/s
    # The MLP 1024-2048-2048-1024-1024, parameters in backward order (bias before weight).
    mlp_parameters = [1024 * 4, 1024 * 1024 * 4, 1024 * 4, 2048 * 1024 * 4, 2048 * 4,
                      2048 * 2048 * 4, 2048 * 4, 1024 * 2048 * 4]
    # ResNet-50 sized: 25.6M float32 gradients. Its fc layer (2048 x 1000 and its bias) comes
    # first in backward; the convolutions' tensors (0.04 to 9.4 MB each in ResNet-50) are taken
    # as 1 MiB each here, so the buckets fill to the cap as they would.
    resnet_bytes = 25_600_000 * 4
    body = resnet_bytes - 2049 * 1000 * 4
    resnet_parameters = [1000 * 4, 2048 * 1000 * 4] + [MIB] * (body // MIB) + [body % MIB]
    models = {
        "MLP 9.4M": {"compute_s": args.mlp_compute_ms * 1e-3, "backward_fraction": 2 / 3,
                     "buckets": ddp_buckets(mlp_parameters)},
        "ResNet-50 size": {"compute_s": args.resnet_compute_ms * 1e-3,
                           "backward_fraction": 2 / 3,
                           "buckets": ddp_buckets(resnet_parameters)},
    }

    def cpu_intra(size):
        return size / shm_bandwidth

    def gpu_intra(size, ranks=8, busbw=450e9):
        return 2 * (ranks - 1) / ranks * size / busbw

    # A CPU node like this VM: 2 ranks; a ring's edge inside it copies at about twice the
    # node-average rate (each byte of an average is read and written once per rank).
    shm_edge_gbps = 2 * shm_bandwidth / 1e9
    node_kinds = [
        NodeKind("CPU 2 ranks, HDR 25", 2, cpu_intra, shm_edge_gbps, False, 25, 2, False),
        NodeKind("CPU 2 ranks, NDR 50", 2, cpu_intra, shm_edge_gbps, False, 50, 2, False),
        NodeKind("H200 x8, NDR 50/GPU", 8, gpu_intra, 450, True, 50, 2, True),
    ]
    node_counts = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    schemes = [("flat", "ring"), ("flat", "tree"), ("hierarchical", "ring"),
               ("hierarchical", "tree")]

    rows = []
    for model_name, model in models.items():
        for node in node_kinds:
            if node.gpu and model_name.startswith("MLP"):
                if args.mlp_gpu_compute_ms is None:
                    continue
                model = dict(model, compute_s=args.mlp_gpu_compute_ms * 1e-3)
            for nodes in node_counts:
                row = {"model": model_name, "nodes": node.name, "N": nodes}
                for scheme, algorithm in schemes:
                    step = step_time(model, scheme, algorithm, nodes, node)
                    row[f"{scheme} {algorithm}"] = model["compute_s"] / step
                rows.append(row)

    print("# DDP weak-scaling efficiency E(N) = compute / step (alpha-beta model)")
    print(f"# MLP compute {args.mlp_compute_ms:.1f} ms, buckets (MiB) "
          + ", ".join(f"{b / MIB:.2f}" for b in models["MLP 9.4M"]["buckets"]))
    print(f"# ResNet-50 size compute {args.resnet_compute_ms:.0f} ms, buckets (MiB) "
          + ", ".join(f"{b / MIB:.2f}" for b in models["ResNet-50 size"]["buckets"]))
    print(f"# shared-memory node average {shm_bandwidth / 1e9:.1f} GB/s (from "
          f"{args.shm_average_ms} ms for 36 MiB)")
    headers = ["model", "nodes", "N"] + [f"{s} {a}" for s, a in schemes]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        if row["N"] not in (1, 8, 64, 256, 1024):
            continue
        cells = [row["model"], row["nodes"], str(row["N"])]
        cells += [f"{row[f'{s} {a}']:.2f}" for s, a in schemes]
        print("| " + " | ".join(cells) + " |")
    print()
    print("# Published figures (weak scaling, their setups):")
    for source, setup, figure in PUBLISHED:
        print(f"#   {source}: {setup}: {figure}")
    if args.csv:
        with open(args.csv, "w") as out:
            out.write(",".join(headers) + "\n")
            for row in rows:
                out.write(",".join(str(row[h]) for h in headers) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
