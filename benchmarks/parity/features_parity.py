#!/usr/bin/env python3
"""mpigrad train against PyTorch on a float32 feature file in its natural range (optional;
needs torch, h5py, numpy).

Writes, the way a user would with h5py, a 10-class dataset of 20 float32 features in 0..16
(overlapping Gaussian classes, so accuracy stays below 100%) and int64 labels, under the field
names `features` and `label`. Trains the MLP of `mpigrad train` on it (1 rank, no shuffling, so
the batches are known), with save_initial = true, then trains the same torch.nn model from
that ckpt-step0.h5 on the same batches with the same SGD, and prints both test accuracies.

    python3 benchmarks/parity/features_parity.py --mpigrad build/bin/mpigrad
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
from torch import nn


def write_dataset(path, n, seed, centers, mixing):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(centers), size=n)
    noise = rng.normal(size=(n, centers.shape[1])) @ mixing
    features = np.clip(centers[labels] + noise, 0.0, 16.0).astype(np.float32)
    with h5py.File(path, "w") as f:
        f["features"] = features
        f["label"] = labels.astype(np.int64)


def run_mpigrad(binary, workdir, args):
    config = os.path.join(workdir, "features.ini")
    with open(config, "w") as f:
        f.write(f"""[data]
train = {workdir}/train.h5
test = {workdir}/test.h5
x = features
y = label
num_classes = 10
[model]
name = mlp
hidden = {",".join(str(h) for h in args.hidden)}
[optim]
name = sgd
lr = {args.lr}
momentum = {args.momentum}
[train]
epochs = {args.epochs}
batch_size = {args.batch}
seed = {args.seed}
shuffle = false
save_initial = true
log_every = 1000000
out_dir = {workdir}/run
""")
    out = subprocess.run([binary, "train", "--config", config], check=True, capture_output=True,
                         text=True).stdout
    accuracies = [float(a) for a in re.findall(r"test_accuracy ([0-9.]+)", out)]
    return accuracies, os.path.join(workdir, "run", "ckpt-step0.h5")


def build_torch_mlp(hidden, features):
    layers, width = [nn.Flatten()], features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def run_torch(args, workdir, initial):
    with h5py.File(os.path.join(workdir, "train.h5"), "r") as f:
        x, y = torch.from_numpy(f["features"][:]), torch.from_numpy(f["label"][:])
    with h5py.File(os.path.join(workdir, "test.h5"), "r") as f:
        tx, ty = torch.from_numpy(f["features"][:]), torch.from_numpy(f["label"][:])
    model = build_torch_mlp(args.hidden, x.shape[1])
    with h5py.File(initial, "r") as f:
        state = {name: torch.from_numpy(np.array(f["model"][name])) for name in f["model"]}
    model.load_state_dict(state, strict=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    accuracies = []
    for _ in range(args.epochs):
        model.train()
        for start in range(0, len(x), args.batch):  # shuffle = false: batches in file order
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[start:start + args.batch]),
                                               y[start:start + args.batch])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracies.append((model(tx).argmax(1) == ty).float().mean().item())
    return accuracies


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpigrad", required=True, help="the mpigrad program")
    parser.add_argument("--train-samples", type=int, default=20000)
    parser.add_argument("--test-samples", type=int, default=5000)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 32])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as workdir:
        rng = np.random.default_rng(7)
        centers = rng.uniform(4.0, 12.0, size=(10, 20))
        mixing = rng.normal(scale=1.5, size=(20, 20))
        write_dataset(os.path.join(workdir, "train.h5"), args.train_samples, 1, centers, mixing)
        write_dataset(os.path.join(workdir, "test.h5"), args.test_samples, 2, centers, mixing)
        ours, initial = run_mpigrad(args.mpigrad, workdir, args)
        theirs = run_torch(args, workdir, initial)
    print("float32 features in 0..16, 10 classes; MLP", args.hidden, f"batch {args.batch}, SGD lr "
          f"{args.lr} momentum {args.momentum}, same initial weights and batches")
    print("epoch  mpigrad test accuracy  torch test accuracy")
    for epoch, (a, b) in enumerate(zip(ours, theirs)):
        print(f"{epoch:5d}  {a:21.4f}  {b:19.4f}")
    if len(ours) != len(theirs):
        sys.exit("mpigrad reported %d evaluations, expected %d" % (len(ours), len(theirs)))


if __name__ == "__main__":
    main()
