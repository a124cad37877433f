#!/usr/bin/env python3
"""Reference models, batches and PyTorch losses for mpigrad's ONNX parity test (optional; needs
torch, onnx, onnxscript, numpy, h5py). CI never runs this: it compares against what this script
wrote into tests/data/onnx/.

For each model (an MLP, a CNN with BatchNorm, a small U-Net, a small transformer encoder, and
the Fashion-MNIST CNN equivalent to `mpigrad train`'s built-in `cnn`), it
  * exports the freshly initialized module with both exporters: legacy (opset 17, training mode,
    no constant folding: <name>.legacy.onnx) and dynamo (dynamic batch, no optimizer, weights in
    <name>.dynamo.onnx.data);
  * writes the fixed batches, /x and /y, to <name>.h5 (batch k is samples [kB, (k+1)B), so
    `mpigrad train` with shuffle = false and batch_size = B sees the same steps);
  * trains 20 SGD steps from the same initial weights on those batches, in float64 (the module
    converted after export, so float32 rounding on our side is the only difference), and writes
    the per-step losses to <name>.h5 /losses (float64 [20]), with the settings as attributes.

    /work/venv-torch/bin/python benchmarks/onnx/make_parity_data.py --out tests/data/onnx

With --checkpoint CKPT.h5 --model NAME it instead loads an mpigrad checkpoint's /model/<name>
tensors into the PyTorch module NAME by state_dict name and prints what matched; with
--exported TRAINED.onnx (from `mpigrad onnx export`) too, it runs that file in ONNX Runtime on
NAME's first batch and compares the output with the module's (needs onnxruntime).
"""
import argparse
import math
import os
import shutil
import sys

import h5py
import numpy as np
import torch
from torch import nn

STEPS = 20
BATCH = 8


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)


class CnnBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(6 * 2 * 2, 3)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class UNet(nn.Module):
    """Two levels: conv, pool, conv, transposed conv up, skip concat, conv to one channel."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(8, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 1))

    def forward(self, x):
        skip = self.enc(x)
        up = self.up(self.mid(self.pool(skip)))
        return self.dec(torch.cat([up, skip], dim=1))


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        # Three projections, not one split in three: the dynamo exporter writes a split as
        # SplitToSequence, and the parity data predates OnnxModel's sequence ops (it runs them
        # now; tests/onnx covers them).
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        head = d // self.heads
        q = self.q(x).reshape(n, t, self.heads, head).transpose(1, 2)
        k = self.k(x).reshape(n, t, self.heads, head).transpose(1, 2)
        v = self.v(x).reshape(n, t, self.heads, head).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(n, t, d))


class EncoderBlock(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Token ids int64 [N, T] -> logits [N, V, T] (class dim second, as cross_entropy wants)."""

    VOCAB, LENGTH, DIM = 11, 6, 16

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, self.DIM)
        self.position = nn.Parameter(torch.randn(1, self.LENGTH, self.DIM) * 0.1)
        self.blocks = nn.ModuleList([EncoderBlock(self.DIM, 2, 32)])
        self.norm = nn.LayerNorm(self.DIM)
        self.head = nn.Linear(self.DIM, self.VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).transpose(1, 2)


def fashion_cnn():
    """`mpigrad train`'s cnn with channels = 16,32 and hidden = 32 on [1, 28, 28]: the same
    layers in the same nn.Sequential order, so the parameter names match too."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10))


# name: (constructor, one sample's shape, loss, lr, momentum)
MODELS = {
    "mlp": (Mlp, (12,), "cross_entropy", 0.1, 0.9),
    "cnn_bn": (CnnBatchNorm, (1, 8, 8), "cross_entropy", 0.05, 0.9),
    "unet": (UNet, (1, 8, 8), "mse", 0.05, 0.9),
    "transformer": (Transformer, (Transformer.LENGTH,), "cross_entropy", 0.03, 0.9),
    "fashion_cnn": (fashion_cnn, (1, 28, 28), "cross_entropy", 0.05, 0.9),
}


def make_batches(name, shape, generator):
    n = STEPS * BATCH
    if name == "transformer":
        x = torch.randint(0, Transformer.VOCAB, (n,) + shape, generator=generator)
        # The next token of a fixed permutation: learnable, so the losses move.
        y = (x * 3 + 1) % Transformer.VOCAB
        return x, y
    x = torch.randn((n,) + shape, generator=generator)
    if name == "unet":
        y = torch.tanh(x) * 0.5 + x.roll(1, dims=-1) * 0.25
        return x, y
    classes = {"mlp": 5, "cnn_bn": 3, "fashion_cnn": 10}[name]
    y = torch.randint(0, classes, (n,), generator=generator)
    return x, y


def loss_of(kind, output, target):
    if kind == "mse":
        return nn.functional.mse_loss(output, target)
    return nn.functional.cross_entropy(output, target)


def train_reference(model, x, y, loss_kind, lr, momentum):
    model = model.double().train()
    x = x.double() if x.is_floating_point() else x
    y = y.double() if y.is_floating_point() else y
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for step in range(STEPS):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        optimizer.zero_grad()
        loss = loss_of(loss_kind, model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def export_both(model, sample, path_stem):
    model.train()
    torch.onnx.export(model, sample, path_stem + ".legacy.onnx", dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    batch = torch.export.Dim("batch", min=1, max=1024)
    torch.onnx.export(model, (sample,), path_stem + ".dynamo.onnx",
                      dynamic_shapes=({0: batch},), optimize=False, external_data=True)


# Models for benchmarks/onnx only: their batches would outweigh the test data.
BENCHMARK_ONLY = {"fashion_cnn"}


def check_initializers(stem, state):
    """Every parameter is an initializer of both files under its state_dict name, bit for bit."""
    import onnx
    from onnx import numpy_helper
    for path in (stem + ".legacy.onnx", stem + ".dynamo.onnx"):
        stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
        for key, value in state.items():
            if key.endswith(("running_mean", "running_var", "num_batches_tracked")):
                continue
            assert key in stored, f"{path}: no initializer {key}"
            assert np.array_equal(stored[key], value.numpy()), f"{path}: {key} differs"


def write_all(out_dir, names):
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        constructor, shape, loss_kind, lr, momentum = MODELS[name]
        torch.manual_seed(1234)
        model = constructor()
        generator = torch.Generator().manual_seed(99)
        x, y = make_batches(name, shape, generator)
        stem = os.path.join(out_dir, name)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        export_both(model, x[:BATCH], stem)
        # Tracing ran forward in training mode, which moved BatchNorm's running statistics:
        # train from the weights as they were (the losses do not read those statistics).
        model.load_state_dict(initial)
        check_initializers(stem, initial)
        if name in BENCHMARK_ONLY:
            print(f"{name}: exported (benchmark model, no reference run)")
            continue
        losses = train_reference(model, x, y, loss_kind, lr, momentum)
        with h5py.File(stem + ".h5", "w") as f:
            f["x"] = x.numpy()
            f["y"] = y.numpy()
            f["losses"] = np.asarray(losses, dtype=np.float64)
            f.attrs["loss"] = loss_kind
            f.attrs["lr"] = lr
            f.attrs["momentum"] = momentum
            f.attrs["batch_size"] = BATCH
            f.attrs["steps"] = STEPS
        print(f"{name}: losses {losses[0]:.6f} -> {losses[-1]:.6f}")


def check_checkpoint(path, name, exported="", data_dir="tests/data/onnx"):
    """Loads the checkpoint into the PyTorch module by state_dict name; with `exported` (the
    output of `mpigrad onnx export`), also runs that file in ONNX Runtime on the first batch of
    <name>.h5 and compares its output with the module's."""
    model = MODELS[name][0]()
    state = model.state_dict()
    loaded = {}
    with h5py.File(path, "r") as f:
        group = f["model"]
        group.visititems(lambda key, item: loaded.__setitem__(key.replace("/", "."), item[()])
                         if isinstance(item, h5py.Dataset) else None)
    tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in loaded.items() if k in state}
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    extra = sorted(set(loaded) - set(state))
    print(f"{name}: {len(tensors)} tensors loaded into the PyTorch module; missing {missing}; "
          f"not in the module {extra}")
    failed = bool(missing or extra)
    if exported:
        import onnxruntime
        with h5py.File(os.path.join(data_dir, name + ".h5"), "r") as f:
            x = f["x"][:BATCH]
        model.eval()
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        session = onnxruntime.InferenceSession(exported)
        got = session.run(None, {session.get_inputs()[0].name: x})[0]
        difference = float(np.max(np.abs(got - expected)))
        print(f"{name}: {exported} in ONNX Runtime against the module with the checkpoint: "
              f"largest difference {difference:.3g}")
        failed = failed or difference > 1e-4
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/data/onnx")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--copy-to", default="", help="also copy the files to this folder")
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--model", default="")
    parser.add_argument("--exported", default="", help="with --checkpoint: an exported .onnx")
    args = parser.parse_args()
    if args.checkpoint:
        return check_checkpoint(args.checkpoint, args.model, args.exported, args.out)
    names = [n for n in args.models.split(",") if n]
    write_all(args.out, names)
    if args.copy_to:
        os.makedirs(args.copy_to, exist_ok=True)
        for entry in os.listdir(args.out):
            shutil.copy(os.path.join(args.out, entry), args.copy_to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
