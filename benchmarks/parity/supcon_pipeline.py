#!/usr/bin/env python3
"""BioEncoder's two-stage pipeline in mpigrad and in PyTorch, side by side (optional; needs torch,
h5py, numpy).

On a subset of Fashion-MNIST (the HDF5 files scripts/main.sh converts from Debian's
dataset-fashion-mnist), both run:
  stage 1  SupCon: the CNN encoder of the zoo (conv 3x3, BatchNorm, ReLU, max-pool 2 per
           channel width; no hidden Linear) + the projection head Linear(f, f) ReLU
           Linear(f, projection), L2-normalized, on two augmented views per sample (zero-padded
           random crop, horizontal flip), SupConLoss (temperature = base temperature);
  stage 2  a linear probe: a Linear head on the frozen encoder (BatchNorm in eval mode), cross
           entropy, no augmentation; its test accuracy is the figure compared.
Same architecture, augmentation definitions, epochs, batch size and optimizer (Adam) on both
sides; the random draws (initialization, shuffling, augmentation) are each framework's own, so
the accuracies agree statistically, not bitwise. Throughput is training samples per second of
each stage (a sample is counted once although SupCon forwards two views of it).

    python3 benchmarks/parity/supcon_pipeline.py --mpigrad build/bin/mpigrad

mpigrad runs as `mpirun -np RANKS mpigrad train` (batch per rank = batch / RANKS, so the global
batch is the same; with RANKS > 1 SupCon contrasts within each rank's half, as DDP without a
feature gather does) and torch as one process with --threads threads.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MEAN, STD = 0.2860, 0.3530


def subset(source_files, path, count, seed):
    xs, ys = [], []
    for name in source_files:
        with h5py.File(name, "r") as f:
            xs.append(f["x"][()])
            ys.append(f["y"][()])
    x, y = np.concatenate(xs), np.concatenate(ys).astype(np.int64)
    pick = np.sort(np.random.default_rng(seed).permutation(len(x))[:count])
    with h5py.File(path, "w") as f:
        f["x"] = x[pick]
        f["y"] = y[pick]
    return x[pick], y[pick]


def ini(args, stage, train, test, out_dir, init_from=""):
    text = f"""[data]
train = {train}
test = {test}
num_classes = 10
mean = {MEAN}
std = {STD}
augment = {args.augment if stage == "supcon" else ""}
[model]
name = cnn
channels = {args.channels}
hidden =
projection = {args.projection}
[loss]
temperature = {args.temperature}
[optim]
name = adam
lr = {args.lr if stage == "supcon" else args.probe_lr}
[train]
stage = {stage}
epochs = {args.epochs if stage == "supcon" else args.probe_epochs}
batch_size = {args.batch // args.ranks}
seed = {args.seed}
log_every = 1000000
out_dir = {out_dir}
"""
    if init_from:
        text += f"init_from = {init_from}\nfreeze_encoder = true\n"
    return text


def run_mpigrad(args, config_path):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MPIGRAD_NUM_THREADS=str(max(1, args.threads // args.ranks)))
    command = ["mpirun", "-np", str(args.ranks), "--oversubscribe", args.mpigrad, "train",
               "--config", config_path]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mpigrad failed:\n{out.stdout}\n{out.stderr}")
    done = [line for line in out.stdout.splitlines() if "done after" in line][-1]
    rate = float(re.search(r"throughput (\d+) samples/s", done).group(1))
    return done, rate


# ---- torch: the same model, augmentations and losses ------------------------------------------

def encoder(channels):
    layers, c = [], 1
    for width in channels:
        layers += [nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                   nn.MaxPool2d(2)]
        c = width
    layers.append(nn.Flatten())
    return nn.Sequential(*layers), c * (28 >> len(channels)) ** 2


def augment(x_uint8, padding, flip, generator):
    """Zero-padded random crop and horizontal flip on the stored values, then the scaling and
    normalization: the order of data/augment.h."""
    x = x_uint8.float()
    n, _, h, w = x.shape
    if padding > 0:
        padded = F.pad(x, (padding,) * 4)
        dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
        dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
        rows = (dy[:, None] + torch.arange(h)[None, :])  # [n, h]
        cols = (dx[:, None] + torch.arange(w)[None, :])  # [n, w]
        x = padded[torch.arange(n)[:, None, None, None], torch.arange(x.shape[1])[None, :, None, None],
                   rows[:, None, :, None], cols[:, None, None, :]]
    if flip:
        mirror = torch.rand(n, generator=generator) < 0.5
        x[mirror] = x[mirror].flip(-1)
    return (x / 255.0 - MEAN) / STD


def supcon_loss(features, labels, temperature):
    """SupContrast's SupConLoss, contrast_mode 'all', base_temperature = temperature."""
    n, views = features.shape[:2]
    contrast = torch.cat(torch.unbind(features, 1), 0)  # view-major [V n, d]
    logits = contrast @ contrast.T / temperature
    logits = logits - logits.max(1, keepdim=True).values.detach()
    same = (labels[:, None] == labels[None, :]).float().repeat(views, views)
    not_self = 1 - torch.eye(views * n)
    positives = same * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(1, keepdim=True))
    mean_log_prob = (positives * log_prob).sum(1) / positives.sum(1).clamp(min=1)
    return -mean_log_prob.mean()


def batches(n, batch, generator):
    order = torch.randperm(n, generator=generator)
    return [order[i:i + batch] for i in range(0, n, batch)]


def run_torch(args, x_train, y_train, x_test, y_test):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    padding = int(re.search(r"crop:(\d+)", args.augment).group(1)) if "crop" in args.augment else 0
    flip = "flip" in args.augment
    body, features = encoder([int(c) for c in args.channels.split(",")])
    head = nn.Sequential(nn.Linear(features, features), nn.ReLU(),
                         nn.Linear(features, args.projection))
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    optimizer = torch.optim.Adam(list(body.parameters()) + list(head.parameters()), lr=args.lr)
    start = time.perf_counter()
    for _ in range(args.epochs):
        body.train()
        for index in batches(len(xt), args.batch, generator):
            views = torch.cat([augment(xt[index], padding, flip, generator),
                               augment(xt[index], padding, flip, generator)])
            projected = F.normalize(head(body(views)), dim=1)
            n = len(index)
            grouped = torch.stack([projected[:n], projected[n:]], 1)
            loss = supcon_loss(grouped, yt[index], args.temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    supcon_rate = args.epochs * len(xt) / (time.perf_counter() - start)

    # Stage 2: a linear probe on the frozen encoder.
    body.eval()
    for p in body.parameters():
        p.requires_grad_(False)
    probe = nn.Linear(features, 10)
    optimizer = torch.optim.Adam(probe.parameters(), lr=args.probe_lr)
    normalize = lambda x: (x.float() / 255.0 - MEAN) / STD  # noqa: E731
    start = time.perf_counter()
    for _ in range(args.probe_epochs):
        for index in batches(len(xt), args.batch, generator):
            with torch.no_grad():
                f = body(normalize(xt[index]))
            loss = F.cross_entropy(probe(f), yt[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    probe_rate = args.probe_epochs * len(xt) / (time.perf_counter() - start)
    with torch.no_grad():
        xs, ys = torch.from_numpy(x_test), torch.from_numpy(y_test)
        correct = sum((probe(body(normalize(xs[i:i + 500]))).argmax(1) == ys[i:i + 500]).sum().item()
                      for i in range(0, len(xs), 500))
    return correct / len(xs), supcon_rate, probe_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mpigrad", default="build/bin/mpigrad")
    parser.add_argument("--data", default="build/datasets/fashion-mnist")
    parser.add_argument("--train-samples", type=int, default=10000)
    parser.add_argument("--test-samples", type=int, default=2000)
    parser.add_argument("--channels", default="16,32")
    parser.add_argument("--projection", type=int, default=128)
    parser.add_argument("--augment", default="crop:2,flip")
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--probe-epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--probe-lr", type=float, default=1e-3)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="threads in all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    train_files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data)
                         if f.startswith("train-"))
    work = tempfile.mkdtemp(prefix="supcon-pipeline-")
    train = os.path.join(work, "train.h5")
    test = os.path.join(work, "test.h5")
    x_train, y_train = subset(train_files, train, args.train_samples, args.seed)
    x_test, y_test = subset([os.path.join(args.data, "test.h5")], test, args.test_samples,
                            args.seed + 1)

    stage1, stage2 = os.path.join(work, "stage1"), os.path.join(work, "stage2")
    with open(os.path.join(work, "supcon.ini"), "w") as f:
        f.write(ini(args, "supcon", train, test, stage1))
    with open(os.path.join(work, "classifier.ini"), "w") as f:
        f.write(ini(args, "classifier", train, test, stage2, os.path.join(stage1, "last.h5")))
    supcon_line, mpigrad_supcon_rate = run_mpigrad(args, os.path.join(work, "supcon.ini"))
    probe_line, mpigrad_probe_rate = run_mpigrad(args, os.path.join(work, "classifier.ini"))
    mpigrad_accuracy = float(re.search(r"test accuracy ([0-9.]+)", probe_line).group(1))
    retrieval = re.search(r"precision@1 ([0-9.]+), mAP@R ([0-9.]+)", supcon_line)

    torch_accuracy, torch_supcon_rate, torch_probe_rate = run_torch(args, x_train, y_train,
                                                                     x_test, y_test)
    figures = {
        "train_samples": args.train_samples, "test_samples": args.test_samples,
        "epochs": args.epochs, "probe_epochs": args.probe_epochs, "batch": args.batch,
        "mpigrad_ranks": args.ranks, "threads": args.threads,
        "mpigrad_linear_probe_accuracy": mpigrad_accuracy,
        "torch_linear_probe_accuracy": torch_accuracy,
        "mpigrad_precision_at_1": float(retrieval.group(1)) if retrieval else None,
        "mpigrad_map_at_r": float(retrieval.group(2)) if retrieval else None,
        "mpigrad_supcon_samples_per_s": mpigrad_supcon_rate,
        "torch_supcon_samples_per_s": torch_supcon_rate,
        "mpigrad_probe_samples_per_s": mpigrad_probe_rate,
        "torch_probe_samples_per_s": torch_probe_rate,
    }
    print(f"{'':24s} {'mpigrad':>10s} {'torch':>10s}")
    print(f"{'linear-probe accuracy':24s} {mpigrad_accuracy:10.4f} {torch_accuracy:10.4f}")
    print(f"{'SupCon samples/s':24s} {mpigrad_supcon_rate:10.0f} {torch_supcon_rate:10.0f}")
    print(f"{'probe samples/s':24s} {mpigrad_probe_rate:10.0f} {torch_probe_rate:10.0f}")
    print(f"mpigrad stage 1: {supcon_line}")
    print(f"difference {mpigrad_accuracy - torch_accuracy:+.4f} (target: within 0.01)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
