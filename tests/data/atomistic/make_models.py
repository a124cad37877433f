#!/usr/bin/env python3
"""Interatomic potentials exported from PyTorch for mpigrad's tests (optional; needs torch, onnx,
h5py). CI never runs this: tests/nn/test_atomistic.cpp reads what it wrote here.

One SchNet-like potential (embedding of atomic numbers, a Gaussian radial basis of edge lengths
under a cosine cutoff, a filter network, messages from sources to targets aggregated on the
targets, an atom-wise MLP, a sum per structure), with the inputs named as mpigrad binds them:
positions [V, 3], atomic_numbers [V], edge_index [2, E] (row 0 sources, row 1 targets),
edge_shifts [E, 3], batch [V], cell [B, 3, 3]; output energy [B]. Two exports by the legacy
(TorchScript) exporter, opset 17, no constant folding:
  potential.scatter_add.onnx  aggregation by scatter_add: ScatterElements with reduction add
  potential.index_add.onnx    aggregation by index_add: ScatterElements without a reduction, which
                              loses repeated messages; mpigrad refuses it, naming the node
reference.h5: a batch of two structures (a periodic one whose edges cross the cell, and a
cluster), the model's energy [B] and forces [V, 3] = -dE/dpositions in float64.

    /work/venv/bin/python tests/data/atomistic/make_models.py --out tests/data/atomistic
"""
import argparse
import math
import os

import h5py
import torch
from torch import nn

NAMES = ["positions", "atomic_numbers", "edge_index", "edge_shifts", "batch", "cell"]
CUTOFF = 3.0


class Potential(nn.Module):
    def __init__(self, index_add, hidden=8, basis=6):
        super().__init__()
        self.index_add = index_add
        self.basis = basis
        self.embedding = nn.Embedding(10, hidden)
        self.filter = nn.Sequential(nn.Linear(basis, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.output = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def aggregate(self, base, index, values):
        if self.index_add:
            return base.index_add(0, index, values)
        if values.dim() == 2:
            index = index.unsqueeze(-1).expand(-1, values.shape[1])
        return base.scatter_add(0, index, values)

    def forward(self, positions, atomic_numbers, edge_index, edge_shifts, batch, cell):
        source, target = edge_index[0], edge_index[1]
        vectors = positions[target] - positions[source] + edge_shifts
        length = torch.sqrt((vectors * vectors).sum(-1, keepdim=True) + 1e-12)
        centers = torch.linspace(0.0, CUTOFF, self.basis, dtype=positions.dtype)
        rbf = torch.exp(-2.0 * (length - centers) ** 2)
        envelope = 0.5 * (torch.cos(torch.clamp(length, max=CUTOFF) * (math.pi / CUTOFF)) + 1.0)
        features = self.embedding(atomic_numbers)
        messages = features[source] * self.filter(rbf) * envelope
        features = features + self.aggregate(torch.zeros_like(features), target, messages)
        atoms = self.output(features).squeeze(-1)
        structures = torch.zeros(cell.shape[0], dtype=atoms.dtype)
        return self.aggregate(structures, batch, atoms)


def batch_inputs():
    """Two structures: 4 atoms in a periodic cell (edges to images), and a cluster of 3."""
    cell0 = torch.tensor([[4.0, 0.0, 0.0], [0.5, 3.5, 0.0], [0.0, 0.3, 3.8]], dtype=torch.float64)
    positions = torch.tensor([[0.2, 0.1, 0.3], [1.4, 0.9, 0.2], [3.6, 3.1, 0.4], [0.9, 2.2, 3.5],
                              [10.0, 10.0, 10.0], [11.1, 10.2, 10.1], [10.4, 11.3, 9.8]],
                             dtype=torch.float64)
    numbers = torch.tensor([1, 6, 8, 6, 1, 1, 8], dtype=torch.int64)
    edges, shifts = [], []
    for t in range(4):
        for s in range(4):
            for n in [(a, b, c) for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1)]:
                if s == t and n == (0, 0, 0):
                    continue
                shift = torch.tensor(n, dtype=torch.float64) @ cell0
                if torch.linalg.norm(positions[t] - positions[s] + shift) < CUTOFF:
                    edges.append((s, t))
                    shifts.append(shift)
    for t in range(4, 7):
        for s in range(4, 7):
            if s != t and torch.linalg.norm(positions[t] - positions[s]) < CUTOFF:
                edges.append((s, t))
                shifts.append(torch.zeros(3, dtype=torch.float64))
    edge_index = torch.tensor(edges, dtype=torch.int64).t().contiguous()
    edge_shifts = torch.stack(shifts)
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1], dtype=torch.int64)
    cell = torch.stack([cell0, torch.zeros(3, 3, dtype=torch.float64)])
    return [positions, numbers, edge_index, edge_shifts, batch, cell]


def export(model, inputs, path):
    dynamic = {"positions": {0: "V"}, "atomic_numbers": {0: "V"}, "edge_index": {1: "E"},
               "edge_shifts": {0: "E"}, "batch": {0: "V"}, "cell": {0: "B"}, "energy": {0: "B"}}
    torch.onnx.export(model, tuple(t.float() if t.is_floating_point() else t for t in inputs),
                      path, dynamo=False, opset_version=17, input_names=NAMES,
                      output_names=["energy"], dynamic_axes=dynamic, do_constant_folding=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    inputs = batch_inputs()
    model = Potential(index_add=False)
    export(model, inputs, os.path.join(args.out, "potential.scatter_add.onnx"))
    twin = Potential(index_add=True)
    twin.load_state_dict(model.state_dict())
    export(twin, inputs, os.path.join(args.out, "potential.index_add.onnx"))

    model = model.double()
    positions = inputs[0].clone().requires_grad_(True)
    energy = model(positions, *inputs[1:])
    forces = -torch.autograd.grad(energy.sum(), positions)[0]
    with h5py.File(os.path.join(args.out, "reference.h5"), "w") as f:
        for name, tensor in zip(NAMES, inputs):
            f[name] = tensor.numpy()
        f["energy"] = energy.detach().numpy()
        f["forces"] = forces.detach().numpy()
    print(f"{inputs[2].shape[1]} edges; energy {energy.detach().numpy()}")


if __name__ == "__main__":
    main()
