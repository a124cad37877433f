"""ALCHEMI's own training stack (nvalchemi-toolkit 0.3.0) on the throughput benchmark's store and
model: `throughput.py alchemi DIR` (under torchrun for 2 ranks). Optional; CI never runs it.

What runs is ALCHEMI's, end to end: AtomicDataZarrReader -> Dataset -> its DataLoader (batches of
--batch structures, shuffled); TrainingStrategy with default_training_fn; the potential wrapped
as a BaseModelMixin whose ModelConfig asks for a neighbor list (NeighborConfig, cutoff 3) and
forces by autograd on positions; ALCHEMI's NeighborListHook (nvalchemiops) rebuilding the graph
at BEFORE_FORWARD of every batch; EnergyMSELoss(per_atom=True) + 10 x ForceMSELoss; AdamW(lr
1e-3); DDPHook (gloo) when torchrun starts several processes. 1 thread per rank.
"""

import os
import time

import torch
from torch import nn

import potential


class _Timer:
    """A hook that stamps the wall clock after the warm-up steps and after the last step."""

    frequency = 1

    def __init__(self, stage, warmup, total):
        self.stage = stage
        self.warmup = warmup
        self.total = total
        self.batches = 0
        self.start = None
        self.end = None
        self.edges = 0
        self.loss = None

    def __call__(self, ctx, stage):
        self.batches += 1
        self.edges += int(ctx.batch.neighbor_list.shape[0])
        self.loss = float(ctx.loss.detach()) if ctx.loss is not None else None
        if self.batches == self.warmup:
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            self.start, self.cpu = time.perf_counter(), time.process_time()
        elif self.batches == self.total:
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            self.end, self.cpu = time.perf_counter(), time.process_time() - self.cpu


def run(args, model_options):
    from nvalchemi.data.datapipes import DataLoader, Dataset
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader
    from nvalchemi.hooks import NeighborListHook
    from nvalchemi.models.base import BaseModelMixin, ModelConfig, NeighborConfig
    from nvalchemi.training import (
        DDPHook,
        EnergyMSELoss,
        ForceMSELoss,
        OptimizerConfig,
        TrainingStage,
        TrainingStrategy,
        default_training_fn,
    )

    torch.set_num_threads(1)
    size = int(os.environ.get("WORLD_SIZE", "1"))
    neighbors = NeighborConfig(cutoff=model_options["cutoff"])

    class Wrapped(nn.Module, BaseModelMixin):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.model_config = ModelConfig(
                outputs=frozenset({"energy", "forces"}),
                autograd_outputs=frozenset({"forces"}),
                autograd_inputs=frozenset({"positions"}),
                supports_pbc=True,
                needs_pbc=False,
                neighbor_config=neighbors,
            )

        @property
        def embedding_shapes(self):
            return {}

        def compute_embeddings(self, data, **kwargs):
            raise NotImplementedError

        def forward(self, data, **kwargs):
            self.adapt_input(data, **kwargs)  # positions.requires_grad_(True)
            positions = data.positions
            edges = data.neighbor_list.t().long()
            shifts = getattr(data, "neighbor_list_shifts", None)
            if shifts is None:
                shifts = torch.zeros(edges.shape[1], 3, dtype=positions.dtype)
            else:
                # integer image offsets of each edge's system cell, in Cartesian form
                cells = data.cell.reshape(-1, 3, 3)[data.batch_idx[edges[1]]]
                shifts = torch.bmm(shifts.to(positions.dtype).unsqueeze(1), cells).squeeze(1)
            cell = data.cell.reshape(-1, 3, 3).to(positions.dtype)
            energy = self.model(positions, data.atomic_numbers.long(), edges, shifts,
                                data.batch_idx.long(), cell)
            (gradient,) = torch.autograd.grad(energy.sum(), positions,
                                              create_graph=self.training)
            return self.adapt_output({"energy": energy, "forces": -gradient}, data)

    torch.manual_seed(0)
    model = Wrapped(potential.SchNet(**model_options))
    reader = AtomicDataZarrReader(os.path.join(args.dir, "clusters.zarr"))
    loader = DataLoader(Dataset(reader, device="cpu"), batch_size=args.batch, shuffle=True,
                        drop_last=True)
    total = args.warmup + args.steps
    timer = _Timer(TrainingStage.AFTER_BATCH, args.warmup, total)
    class CountedNeighborListHook(NeighborListHook):
        calls = 0

        def __call__(self, ctx, stage):
            CountedNeighborListHook.calls += 1
            return super().__call__(ctx, stage)

    hooks = [CountedNeighborListHook(neighbors, stage=TrainingStage.BEFORE_FORWARD), timer]
    if size > 1:
        hooks.append(DDPHook(backend="gloo"))
    strategy = TrainingStrategy(
        models=model,
        optimizer_configs=OptimizerConfig(optimizer_cls=torch.optim.AdamW,
                                          optimizer_kwargs={"lr": 1e-3}),
        num_steps=total,
        training_fn=default_training_fn,
        loss_fn=EnergyMSELoss(per_atom=True) + 10.0 * ForceMSELoss(),
        devices=[torch.device("cpu")],
        hooks=hooks,
    )
    strategy.run(loader)
    rank = int(os.environ.get("RANK", "0"))  # DDPHook has torn the process group down
    if rank == 0:
        graphs = args.steps * args.batch * size
        rate = graphs / (timer.end - timer.start)
        print(f"ALCHEMI TrainingStrategy, {size} rank(s), batch {args.batch} per rank: "
              f"{CountedNeighborListHook.calls} neighbor-list builds, "
              f"{timer.edges / (timer.batches * args.batch):.1f} edges per graph, last loss "
              f"{timer.loss:.4g}; graphs per CPU-second of rank 0 "
              f"{args.steps * args.batch / timer.cpu:.1f}; graphs/s {rate:.1f}")
