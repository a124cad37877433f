#!/usr/bin/env python3
"""PyTorch's side of mpigrad-bench-forces (optional; needs torch): the same SchNet-like model,
atoms and edges, timed the same way (alternating rounds of energy-only and force-training steps,
the median of 7, one thread), so the two ratios can be set side by side.

    /work/venv/bin/python benchmarks/double_backward/bench_forces_torch.py --atoms 64 --hidden 64
"""
import argparse
import math
import time

import torch
from torch import nn

CUTOFF, BASIS = 2.5, 16


def cluster(atoms):
    side = math.ceil(round(atoms ** (1 / 3), 9))
    g = torch.Generator().manual_seed(3)
    jitter = torch.rand(atoms, 3, generator=g) * 0.6 - 0.3
    grid = torch.tensor([[a % side, (a // side) % side, a // (side * side)] for a in range(atoms)],
                        dtype=torch.float32)
    p = grid * 1.25 + jitter
    d = torch.cdist(p, p)
    src, dst = torch.nonzero((d < CUTOFF) & ~torch.eye(atoms, dtype=torch.bool), as_tuple=True)
    return p, src, dst


class Potential(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.embed = nn.Linear(BASIS, hidden)
        self.update = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)
        self.register_buffer("centers", torch.linspace(0.5, 2.5, BASIS).reshape(1, BASIS))

    def forward(self, positions, src, dst):
        vec = positions[src] - positions[dst]
        dist = torch.sqrt((vec * vec).sum(1, keepdim=True) + 1e-6)
        rbf = torch.exp(-4.0 * (dist - self.centers) ** 2)
        message = torch.tanh(self.embed(rbf))
        atoms = torch.zeros(positions.shape[0], message.shape[1]).index_add(0, dst, message)
        return self.out(nn.functional.silu(self.update(atoms))).sum()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    positions, src, dst = cluster(args.atoms)
    model = Potential(args.hidden)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)

    def energy_step():
        sgd.zero_grad()
        ((model(positions, src, dst) - 1.0) ** 2).backward()
        sgd.step()

    def force_step():
        sgd.zero_grad()
        x = positions.detach().requires_grad_(True)
        e = model(x, src, dst)
        forces = -torch.autograd.grad(e, x, create_graph=True)[0]
        ((e - 1.0) ** 2 + 10.0 * (forces * forces).mean()).backward()
        sgd.step()

    def per_step(fn):
        fn()
        start = time.perf_counter()
        for _ in range(args.steps):
            fn()
        return (time.perf_counter() - start) / args.steps

    energy, force = [], []
    for _ in range(7):
        energy.append(per_step(energy_step))
        force.append(per_step(force_step))
    e, f = sorted(energy)[3] * 1e3, sorted(force)[3] * 1e3
    print(f"pytorch {torch.__version__}: {args.atoms} atoms, {src.numel()} edges, hidden "
          f"{args.hidden}: energy step {e:.4f} ms, force step {f:.4f} ms, ratio {f / e:.3f}")


if __name__ == "__main__":
    main()
