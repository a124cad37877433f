#!/usr/bin/env python3
"""Writes the data of mpigrad's training parity test against PyTorch (tests/train/
atomistic_parity_checks.sh): a small ALCHEMI store, a SchNet-like potential exported by both of
PyTorch's ONNX exporters, and PyTorch's loss at each of 20 AdamW steps of energy + force training.

Optional, never run by CI: it needs torch, onnx, onnxscript and nvalchemi-toolkit (0.3.0 wrote the
committed files). From the repository root:

    /work/venv/bin/python benchmarks/atomistic/make_parity.py [--out tests/data/atomistic]

Writes under --out:
  parity.zarr                    16 structures of 3 to 8 atoms labelled by a Morse potential, every
                                 fourth in a triclinic periodic cell, the rest clusters; written by
                                 nvalchemi-toolkit's own AtomicDataZarrWriter, with its neighbor
                                 lists (cutoff 3) and shifts
  parity.legacy.onnx             SchNet(hidden 16, n_rbf 8, 2 interactions, cutoff 3), legacy
                                 TorchScript exporter (dynamo=False), opset 17, aggregation by
                                 scatter_add (ScatterElements, reduction add)
  parity.dynamo.onnx             the same weights, default (dynamo) exporter, opset 18, with
                                 optimize=False as docs/your-own-model.md says (its optimizer
                                 turns Python scalars into float initializers, which mpigrad, as
                                 for any float initializer read as data, would train)
  parity_reference.txt           "step loss" for steps 1..20 in PyTorch: batches of 4 structures in
                                 store order (5 epochs of 4), AdamW(lr 0.002, betas 0.9/0.999, eps
                                 1e-8, weight decay 0.01), loss 1 x energy per atom + 10 x forces
                                 (potential.energy_force_loss, mpigrad's energy_force), forces by
                                 create_graph on the store's neighbor lists
"""

import argparse
import os
import shutil
import sys

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import potential  # noqa: E402

CUTOFF = 3.0
LR = 0.002
STEPS = 20
BATCH = 4


def write_store(path, structures):
    from nvalchemi.data import AtomicData
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrWriter

    shutil.rmtree(path, ignore_errors=True)
    AtomicDataZarrWriter(path).write([AtomicData(**s) for s in structures])


def read_store(path):
    """The structures as ALCHEMI's own reader gives them back (what both sides train on)."""
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader

    reader = AtomicDataZarrReader(path)
    out = []
    for i in range(len(reader)):
        data, _ = reader[i]
        out.append({key: data[key] for key in ("positions", "atomic_numbers", "forces", "energy",
                                                 "cell", "neighbor_list", "shifts")})
    return out


def export(model, inputs, path, dynamo):
    args = tuple(inputs)
    if dynamo:
        vertices, edges, structures = (torch.export.Dim(n) for n in ("V", "E", "B"))
        shapes = {"positions": {0: vertices}, "atomic_numbers": {0: vertices},
                  "edge_index": {1: edges}, "edge_shifts": {0: edges}, "batch": {0: vertices},
                  "cell": {0: structures}}
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18,
                                    input_names=potential.INPUT_NAMES, output_names=["energy"],
                                    dynamic_shapes=shapes, optimize=False)
        program.save(path, external_data=False)
        # The exporter records each node's Python stack and FX names: 5x the file, read by no one.
        proto = onnx.load(path)
        del proto.metadata_props[:]
        for node in proto.graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
        onnx.save(proto, path)
    else:
        axes = {"positions": {0: "V"}, "atomic_numbers": {0: "V"}, "edge_index": {1: "E"},
                "edge_shifts": {0: "E"}, "batch": {0: "V"}, "cell": {0: "B"}, "energy": {0: "B"}}
        torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                          input_names=potential.INPUT_NAMES, output_names=["energy"],
                          dynamic_axes=axes, do_constant_folding=False)


def train(model, structures):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.01)
    batches = [structures[i:i + BATCH] for i in range(0, len(structures), BATCH)]
    losses = []
    for step in range(STEPS):
        inputs, energy, forces, counts = potential.collate(batches[step % len(batches)])
        predicted, predicted_forces = potential.energy_and_forces(model, *inputs)
        loss = potential.energy_force_loss(predicted, predicted_forces, energy, forces, inputs[4],
                                           counts, energy_weight=1.0, force_weight=10.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/data/atomistic")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    store = os.path.join(args.out, "parity.zarr")
    write_store(store, potential.morse_structures(16, 3, 8, 4, CUTOFF, seed=35))
    structures = read_store(store)

    torch.manual_seed(7)
    model = potential.SchNet(hidden=16, n_rbf=8, interactions=2, cutoff=CUTOFF, max_z=10)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    inputs, _, _, _ = potential.collate(structures[:BATCH])
    export(model, inputs, os.path.join(args.out, "parity.legacy.onnx"), dynamo=False)
    export(model, inputs, os.path.join(args.out, "parity.dynamo.onnx"), dynamo=True)
    model.load_state_dict(initial)

    losses = train(model, structures)
    with open(os.path.join(args.out, "parity_reference.txt"), "w") as f:
        f.write("# step loss: PyTorch " + torch.__version__ + ", benchmarks/atomistic/"
                "make_parity.py\n")
        for step, loss in enumerate(losses, 1):
            f.write(f"{step} {loss:.9g}\n")
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{len(structures)} structures, {parameters} parameters; losses {losses[0]:.6g} .. "
          f"{losses[-1]:.6g}")


if __name__ == "__main__":
    main()
