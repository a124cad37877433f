#!/usr/bin/env python3
"""The zoo's GPU arm: on a GPU machine that has torch, h5py and numpy but neither torchvision nor
transformers (the GPU check's machine), it builds two of the zoo's architecture families in plain
PyTorch, exports them to ONNX there, and times PyTorch eager on the GPU against `mpigrad train`
on the same GPU, A B A B, with the same weights, data, batch and optimizer. Optional, never
needed by CI; scripts/gpu-check.sh packs it into the GPU bundle and run.sh runs it:

    gpu_arm.py --mpigrad BUNDLE/bin/mpigrad --work OUT/zoo --json OUT/zoo.json
    gpu_arm.py --mpigrad build/bin/mpigrad --work /tmp/zoo-cpu --device cpu   # the flow, no GPU

Models (written here rather than imported, because the GPU machine has no torchvision or
transformers; the same layers, shapes and initialization as theirs):
  resnet18    torchvision's ResNet-18 (BasicBlock, [2, 2, 2, 2]), 10 classes, uint8 3x32x32
              images, batch 64, SGD (lr 0.01, momentum 0.9): cuDNN convolutions, BatchNorm;
  gpt2_small  a GPT-2 decoder (4 layers, width 256, 4 heads, vocabulary 50,257, 128 tokens,
              tanh GELU, eager attention with a causal mask, an untied LM head), batch 8,
              AdamW (lr 1e-4): cuBLAS GEMMs, softmax, LayerNorm, a 50k-class cross entropy.
Each model is exported with the legacy exporter as export_models.py does; where the `onnx`
package is missing, the exporter's one use of it (inserting onnxscript functions, which these
models do not have) is skipped. Step times: PyTorch's with torch.cuda.synchronize() around each
step; mpigrad's from the metrics it logs every step (run_zoo.py's mpigrad_round), its first
--warmup steps left out. The JSON (rewritten after each model) gives both medians and their
ratio, PyTorch / mpigrad: above 1, mpigrad is faster.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo_models  # noqa: E402


# ---- the models, in plain PyTorch ----

class BasicBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                            nn.BatchNorm2d(outputs))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        blocks, width = [], 64
        for stage, outputs in enumerate((64, 128, 256, 512)):
            for index in range(2):
                blocks.append(BasicBlock(width, outputs, 2 if stage > 0 and index == 0 else 1))
                width = outputs
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)
        for module in self.modules():  # torchvision's initialization
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class DecoderBlock(nn.Module):
    def __init__(self, width, heads, tokens):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)
        self.register_buffer("causal", torch.tril(torch.ones(tokens, tokens, dtype=torch.bool)),
                             persistent=False)

    def attention(self, x):
        n, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        scores = scores.masked_fill(~self.causal[:t, :t], torch.finfo(scores.dtype).min)
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(n, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """Logits as [N, V, T], cross-entropy's layout with [N, T] labels (as zoo_models.LogitsVT)."""

    def __init__(self, vocab, tokens, width, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(tokens, width)
        self.blocks = nn.Sequential(*[DecoderBlock(width, heads, tokens) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("positions", torch.arange(tokens), persistent=False)
        for module in self.modules():  # GPT-2's initialization
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(self.positions[:ids.shape[1]])
        return self.lm_head(self.ln_f(self.blocks(x))).transpose(1, 2)


GPU_MODELS = [
    zoo_models.ZooModel("resnet18_gpu", "ResNet-18 (batch 64)", "image", batch=64,
                        optimizer="sgd", steps=10, warmup=3),
    zoo_models.ZooModel("gpt2_small_gpu", "GPT-2 decoder, 4 x 256 (batch 8, 128 tokens)", "lm",
                        batch=8, optimizer="adamw", seq_len=128, vocab=zoo_models.GPT2_VOCAB,
                        steps=10, warmup=3),
]
# ZooModel.build() looks its builder up by name.
zoo_models._BUILDERS["resnet18_gpu"] = lambda: ResNet18(zoo_models.IMAGE_CLASSES)
zoo_models._BUILDERS["gpt2_small_gpu"] = lambda: GPT2(zoo_models.GPT2_VOCAB, 128, 256, 4, 4)


# ---- export without the onnx package ----

def allow_export_without_onnx():
    """The legacy exporter imports `onnx` only to insert onnxscript functions into the model,
    and fails where the package is missing even when there are none (our models have none)."""
    try:
        import onnx  # noqa: F401
        return
    except ImportError:
        pass
    import importlib
    for name in ("torch.onnx._internal.torchscript_exporter.onnx_proto_utils",
                 "torch.onnx._internal.onnx_proto_utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "_add_onnxscript_fn"):
            module._add_onnxscript_fn = lambda model_bytes, custom_opsets: model_bytes
            return


# ---- timing ----

def torch_steps(model, device, count, work):
    """Step times (s) of `count` training steps in PyTorch eager on `device`, after the same
    number of warm-up steps as mpigrad leaves out."""
    import h5py
    module = model.build().train().to(device)
    optimizer = model.optimizer_for(module.parameters())
    with h5py.File(os.path.join(work, model.name + ".h5")) as f:
        x_all, y_all = torch.from_numpy(f["x"][()]), torch.from_numpy(f["y"][()])
    batches = x_all.shape[0] // model.batch
    times = []
    for index in range(model.warmup + count):
        start = index % batches * model.batch
        x = x_all[start:start + model.batch]
        y = y_all[start:start + model.batch].to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        x = x.to(device)
        if x.dtype == torch.uint8:
            x = x.float().div_(255)  # as mpigrad's loader scales uint8 images
        loss = F.cross_entropy(module(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if index >= model.warmup:
            times.append(time.perf_counter() - begin)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mpigrad", required=True, help="the mpigrad program")
    parser.add_argument("--work", required=True, help="folder for the ONNX files, data, configs")
    parser.add_argument("--json", help="results file (rewritten after each model)")
    parser.add_argument("--device", default="cuda:0", help="cuda:0 (default) or cpu")
    parser.add_argument("--rounds", type=int, default=2, help="A B rounds per model (2)")
    parser.add_argument("--ld-library-path", default="",
                        help="LD_LIBRARY_PATH for mpigrad (the bundle's), not for this python")
    parser.add_argument("--time-limit", type=float, default=1e9,
                        help="seconds; a model that would start after it is left out")
    args = parser.parse_args()
    start = time.time()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_arm.py: torch sees no GPU (torch.cuda.is_available() is False)")
    allow_export_without_onnx()
    import export_models
    import run_zoo
    child_env = {"MPIGRAD_DEVICE": args.device}
    if args.ld_library_path:
        child_env["LD_LIBRARY_PATH"] = args.ld_library_path
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "models": {}}

    def write():
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(results, f, indent=2)
            os.replace(args.json + ".tmp", args.json)

    for model in GPU_MODELS:
        if time.time() - start > args.time_limit:
            results["models"][model.name] = {"status": "not run: time limit"}
            write()
            continue
        stem = os.path.join(work, model.name)
        export_models.export(model, stem + ".onnx")
        export_models.write_data(model, stem + ".h5")
        export_models.write_config(model, stem + ".ini")
        torch_times, mpigrad_times = [], []
        saved = {key: os.environ.get(key) for key in child_env}
        for _ in range(args.rounds):
            torch_times += torch_steps(model, device, model.steps, work)
            os.environ.update(child_env)
            try:
                mpigrad_times += run_zoo.mpigrad_round(
                    os.path.abspath(args.mpigrad), model.name, 1, work, model.warmup, model.steps,
                    model.batch, timeout=300)["times"]
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        torch_step, mpigrad_step = statistics.median(torch_times), statistics.median(mpigrad_times)
        results["models"][model.name] = {
            "title": model.title, "batch": model.batch, "optimizer": model.optimizer,
            "torch_step_s": torch_step, "mpigrad_step_s": mpigrad_step,
            "torch_over_mpigrad": torch_step / mpigrad_step}
        print(f"zoo {model.name}: PyTorch {torch_step * 1e3:.2f} ms, mpigrad "
              f"{mpigrad_step * 1e3:.2f} ms a step, PyTorch / mpigrad "
              f"{torch_step / mpigrad_step:.2f}", flush=True)
        write()


if __name__ == "__main__":
    main()
