#!/usr/bin/env python3
"""mpigrad's ResNet-18 against the same network in PyTorch, step by step (optional; needs torch,
h5py, numpy; torchvision is not needed: the torch model below uses torchvision's layout and
names, with the small-image stem mpigrad uses below 64 pixels).

Writes a synthetic 3x32x32 uint8 image set with `mpigrad data synth`, trains `[model] name =
resnet` on it for --steps SGD steps on 1 rank (shuffle off, save_initial on, a loss logged every
step), then loads ckpt-step0.h5 into the torch model by name (strict) and takes the same steps on
the same batches. Prints both loss sequences and the largest relative difference.

With --float64 the torch model is also trained in float64 from the same checkpoint, as the
reference both float32 runs are measured against, and the inputs of every ReLU at the first step
are compared between torch's float32 and float64 runs: a pre-activation within float32 rounding
of 0 that changes sign flips that unit's gradient, and the runs then drift apart. It also runs
mpigrad's ResNet in float64 (mpigrad-parity-resnet-float64, built with the benchmarks, from the
same ckpt-step0.h5 and batches) and compares that with torch float64 step by step: the tight
check. The "ResNet" section of docs/workflows.md explains the numbers.

    python3 benchmarks/parity/resnet_parity.py --mpigrad build/bin/mpigrad --width 8 [--float64]
"""
import argparse
import json
import os
import subprocess
import tempfile

import h5py
import numpy as np
import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """torchvision.models.resnet18's modules and names; conv1 3x3 stride 1 and no max-pool."""

    def __init__(self, channels, width, classes, stages=(2, 2, 2, 2)):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        cin = width
        for i, blocks in enumerate(stages):
            cout = width << i
            layer = []
            for b in range(blocks):
                layer.append(BasicBlock(cin, cout, 2 if (i > 0 and b == 0) else 1))
                cin = cout
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def run_mpigrad(args, workdir):
    subprocess.run([args.mpigrad, "data", "synth", "-o", f"{workdir}/train.h5", "--samples",
                    str(args.steps * args.batch), "--shape", "3,32,32", "--seed", "1"],
                   check=True, capture_output=True)
    config = f"{workdir}/resnet.ini"
    with open(config, "w") as f:
        f.write(f"""[data]
train = {workdir}/train.h5
num_classes = 10
[model]
name = resnet
depth = 18
width = {args.width}
[optim]
name = sgd
lr = {args.lr}
momentum = {args.momentum}
[train]
epochs = 1
max_steps = {args.steps}
batch_size = {args.batch}
seed = {args.seed}
shuffle = false
save_initial = true
log_every = 1
out_dir = {workdir}/run
""")
    subprocess.run([args.mpigrad, "train", "--config", config], check=True, capture_output=True)
    with open(f"{workdir}/run/metrics.jsonl") as f:
        losses = [json.loads(line)["loss"] for line in f if '"step"' in line]
    return losses, f"{workdir}/run/ckpt-step0.h5", f"{workdir}/train.h5"


def run_torch(args, initial, data, dtype=torch.float32, record_relu=False):
    """The torch losses of every step, the number of tensors loaded, and with record_relu the
    input of every ReLU call of the first step ((label, float64 tensor) in call order)."""
    with h5py.File(data, "r") as f:
        x = torch.from_numpy(f["x"][:]).to(dtype) / 255.0  # as mpigrad scales uint8 images
        y = torch.from_numpy(f["y"][:]).long()
    model = ResNet(3, args.width, 10)
    with h5py.File(initial, "r") as f:
        group = f["model"]
        names = []
        group.visit(lambda name: names.append(name) if isinstance(group[name], h5py.Dataset)
                    else None)
        state = {name.replace("/", "."): torch.from_numpy(np.array(group[name])) for name in names}
    model.load_state_dict(state, strict=True)
    model.to(dtype)
    relu_inputs = []

    def recorder(name):
        calls = [0]  # a block calls its ReLU twice: after bn1, and after the residual sum

        def record(module, inputs):  # a pre-hook sees the input before an inplace ReLU changes it
            calls[0] += 1
            relu_inputs.append((f"{name} call {calls[0]}", inputs[0].detach().double().clone()))
        return record

    hooks = [m.register_forward_pre_hook(recorder(name)) for name, m in model.named_modules()
             if record_relu and isinstance(m, nn.ReLU)]
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model.train()
    losses = []
    for step in range(args.steps):
        batch = slice(step * args.batch, (step + 1) * args.batch)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 0:
            for hook in hooks:
                hook.remove()
    return losses, len(state), relu_inputs


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def run_mpigrad_float64(args, initial, data):
    """mpigrad's float64 losses from the float64 driver, on the same checkpoint and batches."""
    driver = args.float64_driver or os.path.join(
        os.path.dirname(os.path.abspath(args.mpigrad)), "..", "benchmarks", "parity",
        "mpigrad-parity-resnet-float64")
    if not os.path.exists(driver):
        raise SystemExit(f"--float64 needs {driver} (build the benchmarks, or pass --float64-driver)")
    result = subprocess.run([driver, "--checkpoint", initial, "--data", data, "--width",
                             str(args.width), "--steps", str(args.steps), "--batch", str(args.batch),
                             "--lr", str(args.lr), "--momentum", str(args.momentum)],
                            check=True, capture_output=True, text=True)
    return [float(line) for line in result.stdout.split()]


def compare_with_float64(ours, theirs, reference, ours64, relu32, relu64):
    print("mpigrad float64 against torch float64 (the tight check):")
    print("step  mpigrad f64        torch f64          relative difference")
    worst64 = 0.0
    for step, (a, r) in enumerate(zip(ours64, reference)):
        worst64 = max(worst64, relative(a, r))
        print(f"{step + 1:4d}  {a:.15f}  {r:.15f}  {relative(a, r):.2e}")
    print(f"max relative difference over {len(reference)} steps, mpigrad float64 vs torch float64: "
          f"{worst64:.2e}")
    if len(ours64) != len(reference):
        raise SystemExit(f"mpigrad float64 gave {len(ours64)} losses, expected {len(reference)}")
    print("with torch float64 as the reference:")
    print("step  mpigrad f32    torch f32      torch f64     mpigrad vs f64  torch f32 vs f64")
    worst_ours = worst_theirs = 0.0
    for step, (a, b, r) in enumerate(zip(ours, theirs, reference)):
        worst_ours = max(worst_ours, relative(a, r))
        worst_theirs = max(worst_theirs, relative(b, r))
        print(f"{step + 1:4d}  {a:.8f}  {b:.8f}  {r:.10f}  {relative(a, r):.2e}        "
              f"{relative(b, r):.2e}")
    print(f"max relative difference to torch float64: mpigrad float32 {worst_ours:.2e}, torch "
          f"float32 {worst_theirs:.2e}")
    flips, units, nearest = [], 0, float("inf")
    for (call, a), (_, b) in zip(relu32, relu64):
        units += b.numel()
        nearest = min(nearest, b.abs().min().item())
        for index in torch.nonzero((a > 0) != (b > 0)).tolist():
            flips.append((call, index, a[tuple(index)].item(), b[tuple(index)].item()))
    print(f"step 1: {len(flips)} of {units} ReLU inputs differ in sign between torch float32 and "
          f"float64 (smallest |float64 input| {nearest:.2e})")
    for call, index, a, b in flips:
        print(f"  {call}, input element {index}: float32 {a:.3e}, float64 {b:.3e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpigrad", required=True, help="the mpigrad program")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--float64", action="store_true",
                        help="also train both models in float64, the torch one as the reference")
    parser.add_argument("--float64-driver", help="mpigrad-parity-resnet-float64 (default: "
                        "build/benchmarks/parity/ next to --mpigrad's build/bin/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as workdir:
        ours, initial, data = run_mpigrad(args, workdir)
        theirs, tensors, relu32 = run_torch(args, initial, data, record_relu=args.float64)
        if args.float64:
            reference, _, relu64 = run_torch(args, initial, data, torch.float64, True)
            ours64 = run_mpigrad_float64(args, initial, data)
    print(f"ResNet-18 width {args.width}, 3x32x32 synthetic images, batch {args.batch}, SGD lr "
          f"{args.lr} momentum {args.momentum}; torch loaded {tensors} tensors of ckpt-step0.h5 "
          "by name (strict)")
    print("step  mpigrad loss   torch loss     relative difference")
    worst = 0.0
    for step, (a, b) in enumerate(zip(ours, theirs)):
        rel = relative(a, b)
        worst = max(worst, rel)
        print(f"{step + 1:4d}  {a:.8f}  {b:.8f}  {rel:.2e}")
    print(f"max relative difference over {len(theirs)} steps: {worst:.2e}")
    if len(ours) != len(theirs):
        raise SystemExit(f"mpigrad logged {len(ours)} losses, expected {len(theirs)}")
    if args.float64:
        compare_with_float64(ours, theirs, reference, ours64, relu32, relu64)


if __name__ == "__main__":
    main()
