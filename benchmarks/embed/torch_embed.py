#!/usr/bin/env python3
"""The in-situ example's training step in PyTorch against mpigrad's C API (optional; needs torch).

Times the same models, batch and optimizer as benchmarks/embed/mpigrad-bench-embed (the
1024 -> 1024 MLP and the 3x3 circular conv of examples/insitu, batch 16 of 1x32x32, MSE, Adam)
in torch eager on the same CPU cores, runs mpigrad-bench-embed, and prints samples/s of both
and their ratio.

    python3 benchmarks/embed/torch_embed.py --bench build/benchmarks/embed/mpigrad-bench-embed
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import torch
from torch import nn


def torch_samples_per_s(model, lr, steps, repeats):
    x = torch.sin(0.01 * torch.arange(16 * 1024, dtype=torch.float32)).reshape(16, 1, 32, 32)
    y = torch.cos(0.01 * torch.arange(16 * 1024, dtype=torch.float32)).reshape(16, 1, 32, 32)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step():
        optimizer.zero_grad()
        out = model(x)
        loss = nn.functional.mse_loss(out.reshape(16, -1), y.reshape(16, -1))
        loss.backward()
        optimizer.step()

    for _ in range(steps):
        step()
    best = 1e30
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, (time.perf_counter() - start) / steps)
    return 16 / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="the mpigrad-bench-embed program")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {
        "mlp": (nn.Sequential(nn.Flatten(), nn.Linear(1024, 1024)), 3e-4),
        "conv": (nn.Conv2d(1, 1, 3, padding=1, padding_mode="circular"), 0.1),
    }
    theirs = {name: torch_samples_per_s(m, lr, args.steps, args.repeats)
              for name, (m, lr) in models.items()}
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "embed.json")
        subprocess.run([args.bench, "--json", path, "--steps", str(args.steps), "--repeats",
                        str(args.repeats)], check=True, capture_output=True)
        with open(path) as f:
            ours = json.load(f)
    print(f"training step, batch 16, {args.threads} thread(s); samples/s")
    print("model  mpigrad C API    torch eager   mpigrad / torch")
    for name in models:
        mine = ours[f"{name}_samples_per_s"]
        print(f"{name:5s}  {mine:13.0f}  {theirs[name]:13.0f}  {mine / theirs[name]:15.2f}")


if __name__ == "__main__":
    main()
