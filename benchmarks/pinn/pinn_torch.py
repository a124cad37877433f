#!/usr/bin/env python3
"""The PINN of examples/pinn/pinn.cpp in PyTorch, for its loss curve and its errors side by side
with mpigrad's (optional; needs torch, h5py, numpy).

It builds the same network (Linear 2-32, Tanh, 32-32, Tanh, 32-32, Tanh, 32-1) from the initial
weights `pinn --save-init` wrote (mpigrad's checkpoints keep PyTorch's names and layouts), trains
it with Adam on the same collocation points (the R2 sequence, rank-interleaved for --ranks R,
with the ranks' losses averaged as DDP averages their gradients), and prints the loss every 500
steps and the relative L2 and max errors against sin(pi x) sin(pi y) on a 101 x 101 grid.

    mpirun -np 2 build/examples/pinn --save-init /tmp/pinn0.h5 --csv /tmp/pinn_mpigrad.csv
    /work/venv/bin/python benchmarks/pinn/pinn_torch.py --init /tmp/pinn0.h5 --ranks 2 \\
        --csv /tmp/pinn_torch.csv --compare /tmp/pinn_mpigrad.csv
"""
import argparse
import csv
import math
import time

import h5py
import numpy as np
import torch
from torch import nn

A1, A2 = 0.7548776662466927, 0.5698402909980532


def r2(k):
    return math.fmod(0.5 + A1 * (k + 1), 1.0), math.fmod(0.5 + A2 * (k + 1), 1.0)


def collocation(step, n, ranks):
    """Every rank's points of `step`, as pinn.cpp draws them: [ranks] of (interior, boundary)."""
    out = []
    for rank in range(ranks):
        interior = [r2(step * n * ranks + i * ranks + rank) for i in range(n)]
        boundary = []
        for i in range(n // 4):
            k = step * n * ranks + i * ranks + rank
            t = r2(k)[0]
            boundary.append([(t, 0.0), (t, 1.0), (0.0, t), (1.0, t)][k % 4])
        out.append((torch.tensor(interior, dtype=torch.float32),
                    torch.tensor(boundary, dtype=torch.float32)))
    return out


def network():
    layers, width = [], 2
    for _ in range(3):
        layers += [nn.Linear(width, 32), nn.Tanh()]
        width = 32
    return nn.Sequential(*layers, nn.Linear(width, 1))


def loss_of(model, interior, boundary, weight):
    x = interior.clone().requires_grad_(True)
    u = model(x)
    du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
    u_xx = torch.autograd.grad(du[:, 0].sum(), x, create_graph=True)[0][:, 0]
    u_yy = torch.autograd.grad(du[:, 1].sum(), x, create_graph=True)[0][:, 1]
    f = 2 * math.pi ** 2 * torch.sin(math.pi * interior[:, 0]) * torch.sin(math.pi * interior[:, 1])
    residual = u_xx + u_yy + f
    return (residual ** 2).mean() + weight * (model(boundary) ** 2).mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", required=True, help="pinn --save-init's checkpoint")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--csv", help="write step,loss here")
    parser.add_argument("--compare", help="mpigrad's --csv, printed beside this run's losses")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = network()
    with h5py.File(args.init) as f:
        state = {name: torch.from_numpy(np.array(f["model"][name])) for name in f["model"]}
    model.load_state_dict(state)
    adam = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        adam.zero_grad()
        parts = [loss_of(model, i, b, 10.0) for i, b in collocation(step, args.points, args.ranks)]
        loss = sum(parts) / len(parts)
        loss.backward()
        adam.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    grid = torch.tensor([[i / 100, j / 100] for i in range(101) for j in range(101)])
    with torch.no_grad():
        u = model(grid)[:, 0].double()
    exact = torch.sin(math.pi * grid[:, 0].double()) * torch.sin(math.pi * grid[:, 1].double())
    l2 = ((u - exact).norm() / exact.norm()).item()
    worst = (u - exact).abs().max().item()
    theirs = {}
    if args.compare:
        with open(args.compare) as f:
            theirs = {int(row["step"]): float(row["loss"]) for row in csv.DictReader(f)}
    print("step   pytorch loss   mpigrad loss")
    for step in [1] + list(range(500, args.steps + 1, 500)):
        print(f"{step:5d}  {losses[step - 1]:12.6g}  {theirs.get(step, float('nan')):12.6g}")
    print(f"pytorch: {args.steps} steps ({args.ranks} rank(s) of {args.points} points, one process, "
          f"1 thread) in {seconds:.1f} s; relative L2 error {l2:.3e}, max error {worst:.3e}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("step,loss\n")
            for step, value in enumerate(losses, 1):
                f.write(f"{step},{value}\n")


if __name__ == "__main__":
    main()
