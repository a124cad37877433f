#!/usr/bin/env python3
"""PyTorch DDP (gloo) on the same model and batch as mpigrad-bench-ddp, for a side-by-side run.

    MPIGRAD_NUM_THREADS=1 torchrun --nproc_per_node 2 benchmarks/ddp/torch_ddp.py [--json FILE]

Optional: needs torch, which mpigrad itself never uses. Prints the same keys as the C++ program
(step_local_ms, step_ddp_bucket_<cap>mib_ms, overlap_ratio_bucket_<cap>mib) where "local" is the
bare model; PyTorch has no communication-free DDP, so the ratio is against the bare model.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def model(width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def time_steps(net, x, y, iterations, repeats):
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=False)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    for _ in range(iterations):
        step()
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        best = min(best, (time.perf_counter() - start) / iterations)
    slowest = torch.tensor([best], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--buckets", default="1,5,25,100")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("MPIGRAD_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(args.batch, 1024, generator=gen)
    y = torch.randn(args.batch, 1024, generator=gen)
    net = model(args.width)
    results = {"parameters": sum(p.numel() for p in net.parameters()),
               "ranks": dist.get_world_size(), "batch_per_rank": args.batch}
    local = time_steps(net, x, y, args.iterations, args.repeats)
    results["step_local_ms"] = local * 1e3
    for cap in [float(c) for c in args.buckets.split(",")]:
        ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cap)
        seconds = time_steps(ddp, x, y, args.iterations, args.repeats)
        key = f"bucket_{cap:g}mib"
        results[f"step_ddp_{key}_ms"] = seconds * 1e3
        results[f"overlap_ratio_{key}"] = seconds / local
        del ddp
    if rank == 0:
        for key, value in results.items():
            print(f"{key:<32} {value:14.4f}" if isinstance(value, float) else f"{key:<32} {value}")
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as out:
                json.dump(results, out, indent=2)
            os.replace(tmp, args.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
