#!/usr/bin/env python3
"""The PyTorch arms of the interatomic-potential throughput benchmark (run_throughput.sh drives
all arms; optional: torch, onnx, nvalchemi-toolkit; CI never runs it).

    throughput.py store DIR        writes DIR/clusters.zarr (with nvalchemi-toolkit's
                                   AtomicDataZarrWriter: 2048 clusters of 4 to 12 atoms labelled
                                   by a Morse potential, with neighbor lists, cutoff 3) and
                                   DIR/schnet.onnx (the 38,677-parameter SchNet of potential.py:
                                   hidden 64, 20 Gaussians, 2 interactions; legacy exporter)
    throughput.py torch DIR        the plain PyTorch loop: 1 thread per rank; DDP over gloo when
                                   launched by torchrun with 2 processes
    throughput.py alchemi DIR      ALCHEMI's own stack (nvalchemi-toolkit 0.3.0): TrainingStrategy
                                   with its DataLoader over its Dataset and AtomicDataZarrReader,
                                   the model as a BaseModelMixin, its NeighborListHook rebuilding
                                   the graph before every forward, EnergyMSELoss(per_atom) +
                                   10 x ForceMSELoss, AdamW, DDPHook under torchrun

Every arm trains the same model on the same store: batches of --batch structures per rank,
energy + 10 x force loss (forces by create_graph), AdamW(lr 1e-3). It prints one line
"graphs/s N" (all ranks' structures over the wall time of the timed steps, after --warmup steps)
and rank 0's structures per second of its process's CPU time over the same steps.
"""

import argparse
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import potential  # noqa: E402

CUTOFF = 3.0
MODEL = dict(hidden=64, n_rbf=20, interactions=2, cutoff=CUTOFF, max_z=10)


def write(directory):
    from nvalchemi.data import AtomicData
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrWriter

    os.makedirs(directory, exist_ok=True)
    store = os.path.join(directory, "clusters.zarr")
    shutil.rmtree(store, ignore_errors=True)
    structures = potential.morse_structures(2048, 4, 12, 0, CUTOFF, seed=36)
    AtomicDataZarrWriter(store).write([AtomicData(**s) for s in structures])
    torch.manual_seed(0)
    model = potential.SchNet(**MODEL)
    inputs, _, _, _ = potential.collate(structures[:4])
    axes = {"positions": {0: "V"}, "atomic_numbers": {0: "V"}, "edge_index": {1: "E"},
            "edge_shifts": {0: "E"}, "batch": {0: "V"}, "cell": {0: "B"}, "energy": {0: "B"}}
    torch.onnx.export(model, tuple(inputs), os.path.join(directory, "schnet.onnx"), dynamo=False,
                      opset_version=17, input_names=potential.INPUT_NAMES,
                      output_names=["energy"], dynamic_axes=axes, do_constant_folding=False)
    atoms = sum(s["positions"].shape[0] for s in structures)
    edges = sum(s["neighbor_list"].shape[0] for s in structures)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{len(structures)} structures, {atoms} atoms, {edges} edges; {parameters} parameters")


def load(directory):
    """Every structure of the store, read with zarr (outside the timed loop)."""
    import zarr

    root = zarr.open_group(os.path.join(directory, "clusters.zarr"), mode="r")
    atoms_ptr = root["meta/atoms_ptr"][:]
    edges_ptr = root["meta/edges_ptr"][:]
    core = {key: torch.from_numpy(root["core/" + key][:])
            for key in ("positions", "atomic_numbers", "forces", "energy", "cell",
                        "neighbor_list", "shifts")}
    out = []
    for i in range(len(atoms_ptr) - 1):
        a0, a1, e0, e1 = atoms_ptr[i], atoms_ptr[i + 1], edges_ptr[i], edges_ptr[i + 1]
        out.append({"positions": core["positions"][a0:a1],
                    "atomic_numbers": core["atomic_numbers"][a0:a1].long(),
                    "forces": core["forces"][a0:a1], "energy": core["energy"][i],
                    "cell": core["cell"][i], "shifts": core["shifts"][e0:e1],
                    # store-wide atom rows, sender first: back to the structure's own rows
                    "neighbor_list": core["neighbor_list"][e0:e1] - int(a0)})
    return out


def distributed():
    """(rank, size), with gloo set up when torchrun started several processes."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1:
        torch.distributed.init_process_group("gloo")
        return torch.distributed.get_rank(), size
    return 0, 1


def plain_torch(args):
    torch.set_num_threads(1)
    rank, size = distributed()
    structures = load(args.dir)
    torch.manual_seed(0)
    model = potential.SchNet(**MODEL)
    trained = model
    if size > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    order = torch.randperm(len(structures), generator=generator).tolist()
    per_step = args.batch * size
    steps = args.warmup + args.steps
    start = None
    for step in range(steps):
        if step == args.warmup:
            if size > 1:
                torch.distributed.barrier()
            start, cpu = time.perf_counter(), time.process_time()
        first = (step * per_step) % (len(order) - per_step + 1)
        mine = order[first + rank * args.batch:first + (rank + 1) * args.batch]
        inputs, energy, forces, counts = potential.collate([structures[i] for i in mine])
        predicted, predicted_forces = potential.energy_and_forces(trained, *inputs)
        loss = potential.energy_force_loss(predicted, predicted_forces, energy, forces,
                                           inputs[4], counts, energy_weight=1.0,
                                           force_weight=10.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if size > 1:
        torch.distributed.barrier()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if rank == 0:
        print(f"plain PyTorch, {size} rank(s), batch {args.batch} per rank: "
              f"loss {float(loss.detach()):.4g}; graphs per CPU-second of rank 0 "
              f"{args.steps * args.batch / cpu:.1f}; "
              f"graphs/s {args.steps * per_step / elapsed:.1f}")
    if size > 1:
        torch.distributed.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arm", choices=["store", "torch", "alchemi"])
    parser.add_argument("dir")
    parser.add_argument("--batch", type=int, default=32, help="structures per rank and step")
    parser.add_argument("--steps", type=int, default=40, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args()
    if args.arm == "store":
        write(args.dir)
    elif args.arm == "torch":
        plain_torch(args)
    else:
        import alchemi_arm

        alchemi_arm.run(args, MODEL)


if __name__ == "__main__":
    main()
