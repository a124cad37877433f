#!/usr/bin/env python3
"""PyTorch reference data for mpigrad's double-backward test through ONNX graphs (optional; needs
torch, onnx, numpy, h5py). CI never runs this: it reads what this script wrote into
tests/data/double_backward/.

Two models, exported with the legacy exporter (opset 17, no constant folding) so their
initializers keep the modules' parameter names:
  * mlp:   x [8, 3] -> Linear(3, 16), Tanh, Linear(16, 16), Softplus, Linear(16, 1): an energy
           per sample;
  * graph: positions [V, 3] and edge_index [2, E] (int64) -> each edge's vector
           positions[src] - positions[dst] (Gather), its length, a radial basis, a Linear + Tanh
           message, scatter_add onto the receiving atoms (ScatterElements, reduction add), and a
           Linear, SiLU, Linear atom energy summed to one energy: a SchNet-like potential.

For each, in float64 (the module converted after export), with E the summed energy:
  g  = dE/dx           (autograd.grad with create_graph; x = the input, positions for graph)
  L  = sum(g * g)      (a force-like loss)
  dL/dx and dL/dtheta  for every parameter theta (a double backward)
written to reference.h5 as /<model>/x, /<model>/energy, /<model>/input_grad,
/<model>/input_grad_of_loss and /<model>/param_grads/<initializer name> (float64), and
/graph/edge_index (int64).

    /work/venv/bin/python benchmarks/double_backward/make_reference.py --out tests/data/double_backward
"""
import argparse
import os

import h5py
import numpy as np
import onnx
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 16), nn.Softplus(),
                                 nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


class GraphNet(nn.Module):
    def __init__(self, basis=8, hidden=16):
        super().__init__()
        self.basis = basis
        self.embed = nn.Linear(basis, hidden)
        self.update = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, positions, edge_index):
        src, dst = edge_index[0], edge_index[1]
        vec = positions[src] - positions[dst]
        dist = torch.sqrt((vec * vec).sum(-1, keepdim=True) + 1e-6)
        centers = torch.linspace(0.5, 3.0, self.basis, dtype=positions.dtype)
        rbf = torch.exp(-4.0 * (dist - centers) ** 2)
        message = torch.tanh(self.embed(rbf))
        width = message.shape[1]
        index = dst.unsqueeze(-1).expand(-1, width)
        atoms = torch.zeros(positions.shape[0], width, dtype=positions.dtype)
        aggregated = atoms.scatter_add(0, index, message)
        return self.update(aggregated).sum().reshape(1)


def cluster(generator):
    """7 atoms in a loose cluster, and every ordered pair within 2.6 of each other as an edge."""
    positions = torch.rand(7, 3, generator=generator, dtype=torch.float64) * 2.4
    edges = [(i, j) for i in range(7) for j in range(7)
             if i != j and torch.linalg.norm(positions[i] - positions[j]) < 2.6]
    return positions, torch.tensor(edges, dtype=torch.int64).t().contiguous()


def export(model, inputs, names, path):
    torch.onnx.export(model, inputs, path, dynamo=False, opset_version=17,
                      input_names=names, output_names=["energy"], do_constant_folding=False)
    initializers = {i.name for i in onnx.load(path).graph.initializer}
    missing = [name for name, _ in model.named_parameters() if name not in initializers]
    if missing:
        raise SystemExit(f"{path}: parameters {missing} are not initializers of that name")


def reference(model, inputs, wrt_index):
    model = model.double()
    inputs = [t.clone() for t in inputs]
    x = inputs[wrt_index].requires_grad_(True)
    energy = model(*inputs).sum()
    g = torch.autograd.grad(energy, x, create_graph=True)[0]
    loss = (g * g).sum()
    params = [p for _, p in model.named_parameters()]
    # The energy's last bias does not move the forces: its gradient is zero (None from torch).
    grads = [torch.zeros_like(t) if grad is None else grad for t, grad in zip(
        [x] + params, torch.autograd.grad(loss, [x] + params, allow_unused=True))]
    return {
        "x": x.detach(),
        "energy": energy.detach().reshape(1),
        "input_grad": g.detach(),
        "input_grad_of_loss": grads[0],
        "param_grads": {name: grad for (name, _), grad in zip(model.named_parameters(), grads[1:])},
    }


def write(group, data):
    for key in ("x", "energy", "input_grad", "input_grad_of_loss"):
        group.create_dataset(key, data=data[key].numpy())
    params = group.create_group("param_grads")
    for name, grad in data["param_grads"].items():
        params.create_dataset(name, data=grad.numpy())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)

    mlp = Mlp()
    x = torch.rand(8, 3, generator=generator) * 2 - 1
    export(mlp, (x,), ["x"], os.path.join(args.out, "mlp.legacy.onnx"))
    mlp_data = reference(mlp, [x.double()], 0)

    graph = GraphNet()
    positions, edge_index = cluster(generator)
    export(graph, (positions.float(), edge_index), ["positions", "edge_index"],
           os.path.join(args.out, "graph.legacy.onnx"))
    graph_data = reference(graph, [positions, edge_index], 0)

    with h5py.File(os.path.join(args.out, "reference.h5"), "w") as out:
        out.attrs["torch"] = np.bytes_(torch.__version__)
        write(out.create_group("mlp"), mlp_data)
        group = out.create_group("graph")
        write(group, graph_data)
        group.create_dataset("edge_index", data=edge_index.numpy())
    print(f"wrote mlp ({len(mlp_data['param_grads'])} parameters) and graph "
          f"({edge_index.shape[1]} edges, {len(graph_data['param_grads'])} parameters) to "
          f"{args.out}")


if __name__ == "__main__":
    main()
