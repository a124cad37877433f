#!/usr/bin/env python3
"""The main job's Fashion-MNIST CNN in PyTorch on one GPU: eager, eager under torch.autocast in
bf16 and fp16, and torch.compile (optional).

The same model as examples/fashion_mnist_cnn.ini builds in mpigrad (nn/models.cpp make_cnn: two
blocks of conv 3x3 pad 1, BatchNorm, ReLU, max-pool 2, then Linear 1568-128, ReLU, Linear 128-10),
the same batch (64), optimizer (SGD, lr 0.05, momentum 0.9, weight decay 1e-4), schedule (linear
warmup for 100 steps, then cosine to 0) and input normalization, trained for the same number of
epochs on the same HDF5 files (read with h5py), reshuffled every epoch (whole batches only: 937
steps per epoch where mpigrad takes 938). The data are put on the GPU
once, as uint8, and each batch is normalized there: PyTorch at its best, not a copy of mpigrad's
host pipeline. The modes (--modes, in order):

    eager      fp32
    amp_bf16   eager, forward and loss under torch.autocast("cuda", torch.bfloat16)
    amp_fp16   eager, under torch.autocast("cuda", torch.float16), with torch.amp.GradScaler
    compile    fp32, the step under torch.compile

The amp modes train for --amp-epochs (mpigrad's autocast runs in the GPU check are one epoch
each), against which mpigrad's bf16 and fp16 runs are set. Prints one line per mode and, with
--json, writes

    {"device": ..., "torch": ..., "eager": {...}, "amp_bf16": {...}, "amp_fp16": {...},
     "compile": {...}, "eager_samples_per_s": ..., "amp_bf16_samples_per_s": ..., ...}

where each mode has samples_per_s (over the timed epochs, after a warm-up that for compile
includes the compilation), test_accuracy, epochs and steps, and compile has compile_seconds. A
mode that fails records its error instead and the others still run. Used by scripts/gpu-check.sh's
run.sh; needs torch, h5py and numpy.

    python3 torch_fashion_mnist.py --train a.h5,b.h5 --test test.h5 [--epochs 3] [--json out.json]
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time

import h5py
import numpy as np
import torch
from torch import nn

STARTED = time.perf_counter()  # --time-limit counts from here (after the imports)
MEAN, STD = 0.2860, 0.3530  # [data] normalize of examples/fashion_mnist_cnn.ini
BATCH = 64
LR, MOMENTUM, WEIGHT_DECAY, WARMUP = 0.05, 0.9, 1e-4, 100
WARMUP_STEPS_UNTIMED = 20  # steps before the clock starts (compilation, cuDNN autotuning)


def load(paths, device):
    xs, ys = [], []
    for path in paths:
        with h5py.File(path, "r") as f:
            xs.append(np.array(f["x"]))
            ys.append(np.array(f["y"]))
    x = torch.from_numpy(np.concatenate(xs)).to(device)
    y = torch.from_numpy(np.concatenate(ys).astype(np.int64)).to(device)
    return x, y


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def learning_rate(step, total):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, total - WARMUP)
    return LR * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def normalize(x_uint8):
    return (x_uint8.float() / 255.0 - MEAN) / STD


AUTOCAST_DTYPES = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}


def run_mode(mode, train, test, epochs, device, time_limit, seed):
    torch.manual_seed(seed)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)
    loss_fn = nn.CrossEntropyLoss()
    autocast_dtype = AUTOCAST_DTYPES.get(mode)

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=autocast_dtype)

    # fp16 needs loss scaling, as mpigrad's precision = fp16 does (both start at 2^16).
    scaler = None
    if mode == "amp_fp16":
        scaler = (torch.amp.GradScaler(device.type) if hasattr(torch.amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(normalize(x)), y)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
        return loss

    def optimizer_step():
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    step_fn = torch.compile(step) if mode == "compile" else step
    x_train, y_train = train
    n = x_train.shape[0]
    # Whole batches only: a last, smaller batch would make torch.compile compile a second graph.
    steps_per_epoch = n // BATCH
    total = epochs * steps_per_epoch
    generator = torch.Generator(device="cpu").manual_seed(seed)
    began = time.perf_counter()
    timed_from, timed_samples, steps, compile_seconds = None, 0, 0, None
    stopped_early = False
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(n, generator=generator).to(device)
        for first in range(0, steps_per_epoch * BATCH, BATCH):
            index = order[first:first + BATCH]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(steps, total)
            step_fn(x_train[index], y_train[index])
            optimizer_step()
            steps += 1
            if steps == 1 and mode == "compile":
                synchronize(device)
                compile_seconds = time.perf_counter() - began
            if steps == WARMUP_STEPS_UNTIMED:
                synchronize(device)
                timed_from = time.perf_counter()
            elif timed_from is not None:
                timed_samples += index.numel()
            if time.perf_counter() - began > time_limit:
                stopped_early = True
                break
        if stopped_early:
            break
    synchronize(device)
    timed = time.perf_counter() - timed_from if timed_from is not None else float("nan")
    model.eval()
    correct = 0
    x_test, y_test = test
    with torch.no_grad(), autocast():
        for first in range(0, x_test.shape[0], 1000):
            logits = model(normalize(x_test[first:first + 1000]))
            correct += int((logits.argmax(1) == y_test[first:first + 1000]).sum())
    result = {
        "samples_per_s": timed_samples / timed if timed > 0 else None,
        "test_accuracy": correct / x_test.shape[0],
        "epochs": epochs, "steps": steps, "steps_planned": total,
        "stopped_early": stopped_early, "seconds": time.perf_counter() - began,
    }
    if compile_seconds is not None:
        result["compile_seconds"] = compile_seconds
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="comma-separated HDF5 shards (x, y)")
    parser.add_argument("--test", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--amp-epochs", type=int, default=1,
                        help="epochs of the amp_bf16 and amp_fp16 modes")
    parser.add_argument("--modes", default="eager,amp_bf16,amp_fp16,compile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=100.0,
                        help="seconds for everything after the imports (loading the data, all "
                             "modes); a mode stops training early past its share")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)  # "cpu" checks the script itself on a machine without GPU
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch_fashion_mnist: torch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    train = load(args.train.split(","), device)
    test = load([args.test], device)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in ("eager", "compile", *AUTOCAST_DTYPES)]
    if unknown:
        parser.error(f"unknown mode(s) {','.join(unknown)}: choose from eager, amp_bf16, "
                     "amp_fp16, compile")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"device": name, "torch": torch.__version__}
    failed = False
    for i, mode in enumerate(modes):
        # The eager modes need little; compile (or the last mode) gets what is left, less a
        # margin for the test pass.
        left = args.time_limit - (time.perf_counter() - STARTED)
        share = left * 0.3 if (mode != "compile" and i + 1 < len(modes)) else left - 5
        epochs = args.amp_epochs if mode in AUTOCAST_DTYPES else args.epochs
        try:
            result = run_mode(mode, train, test, epochs, device, share, args.seed)
            rate = result["samples_per_s"]
            print(f"torch {mode}: {rate:.0f} samples/s, test accuracy "
                  f"{result['test_accuracy']:.4f} after {result['steps']} of "
                  f"{result['steps_planned']} steps"
                  + (f", compiled in {result['compile_seconds']:.1f} s"
                     if "compile_seconds" in result else ""), flush=True)
        except Exception as error:  # the other mode still runs; the report says why
            result = {"error": f"{type(error).__name__}: {error}"}
            print(f"torch {mode}: failed: {result['error']}", flush=True)
            failed = True
        report[mode] = result
        report[f"{mode}_samples_per_s"] = result.get("samples_per_s")
        if args.json:  # after each mode: a run cut short still leaves what it measured
            with open(args.json + ".tmp", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(args.json + ".tmp", args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
