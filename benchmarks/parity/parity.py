#!/usr/bin/env python3
"""PyTorch parity check for mpigrad's nn layer (optional; needs torch, h5py, numpy).

Runs mpigrad-parity-driver, which writes its model's initial weights (an mpigrad checkpoint),
the batches it trains on, and its per-step losses. This script builds the same MLP and CNN in
PyTorch, loads the initial weights from the checkpoint with h5py + torch.from_numpy, trains on
the same batches with the same SGD settings, and prints the largest per-step loss difference and
the time per step of each framework.

    python3 benchmarks/parity/parity.py --driver build/benchmarks/parity/mpigrad-parity-driver
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
from torch import nn


def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def load_mpigrad_weights(model, path):
    # The whole point of the checkpoint format: three lines of h5py.
    with h5py.File(path, "r") as f:
        state = {name: torch.from_numpy(np.array(f["model"][name])) for name in f["model"]}
    model.load_state_dict(state, strict=True)


def run(kind, driver, steps, batch, workdir):
    subprocess.run([driver, "--model", kind, "--steps", str(steps), "--batch", str(batch),
                    "--out", workdir], check=True)
    model = build(kind)
    load_mpigrad_weights(model, os.path.join(workdir, f"{kind}_init.h5"))
    with h5py.File(os.path.join(workdir, f"{kind}_data.h5"), "r") as f:
        xs = torch.from_numpy(np.array(f["x"]))
        ys = torch.from_numpy(np.array(f["y"]))
    with h5py.File(os.path.join(workdir, f"{kind}_losses.h5"), "r") as f:
        theirs = np.array(f["loss"])
        their_time = float(f.attrs["seconds_per_step"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    ours = []
    start = time.perf_counter()
    for s in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(xs[s]), ys[s])
        loss.backward()
        opt.step()
        ours.append(loss.item())
    torch_time = (time.perf_counter() - start) / steps
    diff = np.abs(np.array(ours) - theirs)
    print(f"{kind}: {steps} steps, batch {batch}: max |loss diff| = {diff.max():.3e} "
          f"(at step {int(diff.argmax())}), first loss torch {ours[0]:.6f} mpigrad {theirs[0]:.6f}, "
          f"last loss torch {ours[-1]:.6f} mpigrad {theirs[-1]:.6f}; "
          f"time/step torch {torch_time * 1e3:.2f} ms, mpigrad {their_time * 1e3:.2f} ms "
          f"(ratio {their_time / torch_time:.2f})")
    return diff.max()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True, help="path to mpigrad-parity-driver")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as workdir:
        worst = max(run(kind, args.driver, args.steps, args.batch, workdir) for kind in ("mlp", "cnn"))
    print(f"largest per-step loss difference over both models: {worst:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
