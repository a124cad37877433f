"""The PyTorch side of mpigrad's interatomic-potential parity test and throughput benchmark.

Shared by make_parity.py and the benchmark drivers (optional: torch, and nvalchemi-toolkit for the
stores; CI never imports it):

- SchNet: the PyTorch twin of mpigrad's built-in `[model] name = schnet` (nn/schnet.cpp): an
  embedding of atomic numbers; per interaction a filter network (Linear, shifted softplus, Linear)
  on Gaussians of the edge length under a cosine cutoff, messages in2f(h)[source] * W aggregated
  on the targets with scatter_add, a residual update f2out; an atom-wise MLP F -> F/2 -> 1 summed
  per structure. One difference: the Gaussians' centers are a parameter here (mpigrad's SchNet
  keeps them fixed), because an exported constant initializer is a trainable parameter of an
  ONNX model in mpigrad, and the parity test must train the same parameters in both.
- energy_force_loss: `[loss] name = energy_force` with MSE, as launch/train/atomistic_steps.cpp
  forms it: (w_E / B) sum_i ((E^_i - E_i) / N_i)^2 + (w_F / B) sum_i (1 / 3N_i) sum |F^ - F|^2.
- radius_graph: the neighbor list of data/neighbor_list.h by brute force (every ordered pair at
  every periodic image strictly closer than the cutoff, no self loops; by target, then source).
- morse_structures: small labelled structures (clusters, optionally periodic cells) for a store.
"""

import itertools
import math

import torch
from torch import nn

INPUT_NAMES = ["positions", "atomic_numbers", "edge_index", "edge_shifts", "batch", "cell"]
LN2 = math.log(2.0)


class ShiftedSoftplus(nn.Module):
    def forward(self, x):
        return nn.functional.softplus(x) - LN2


class Interaction(nn.Module):
    def __init__(self, hidden, n_rbf):
        super().__init__()
        self.filter = nn.Sequential(nn.Linear(n_rbf, hidden), ShiftedSoftplus(),
                                    nn.Linear(hidden, hidden))
        self.in2f = nn.Linear(hidden, hidden, bias=False)
        self.f2out = nn.Sequential(nn.Linear(hidden, hidden), ShiftedSoftplus(),
                                   nn.Linear(hidden, hidden))

    def forward(self, features, basis, envelope, source, target):
        filters = self.filter(basis) * envelope
        messages = self.in2f(features)[source] * filters
        index = target.unsqueeze(-1).expand(-1, features.shape[1])
        aggregated = torch.zeros_like(features).scatter_add(0, index, messages)
        return self.f2out(aggregated)


class SchNet(nn.Module):
    def __init__(self, hidden=64, n_rbf=20, interactions=2, cutoff=3.0, max_z=10):
        super().__init__()
        self.cutoff = cutoff
        self.spacing = cutoff / (n_rbf - 1) if n_rbf > 1 else cutoff
        self.embedding = nn.Embedding(max_z + 1, hidden)
        self.centers = nn.Parameter(torch.arange(n_rbf, dtype=torch.float32) * self.spacing)
        self.interactions = nn.ModuleList(Interaction(hidden, n_rbf) for _ in range(interactions))
        self.output = nn.Sequential(nn.Linear(hidden, hidden // 2), ShiftedSoftplus(),
                                    nn.Linear(hidden // 2, 1))

    def forward(self, positions, atomic_numbers, edge_index, edge_shifts, batch, cell):
        source, target = edge_index[0], edge_index[1]
        vectors = positions[target] - positions[source] + edge_shifts
        length = torch.sqrt((vectors * vectors).sum(-1, keepdim=True) + 1e-12)
        offset = length - self.centers
        basis = torch.exp(offset * offset * (-0.5 / (self.spacing * self.spacing)))
        envelope = (torch.cos(torch.clamp(length, 0.0, self.cutoff) * (math.pi / self.cutoff))
                    + 1.0) * 0.5
        features = self.embedding(atomic_numbers)
        for interaction in self.interactions:
            features = features + interaction(features, basis, envelope, source, target)
        atoms = self.output(features).squeeze(-1)
        structures = torch.zeros(cell.shape[0], dtype=atoms.dtype, device=atoms.device)
        return structures.scatter_add(0, batch, atoms)


def energy_force_loss(energy, forces, target_energy, target_forces, batch, num_atoms,
                      energy_weight=1.0, force_weight=10.0):
    """mpigrad's energy_force loss (MSE, per-atom energy), over the B structures of the batch."""
    structures = energy.shape[0]
    atoms = num_atoms.to(energy.dtype)
    energy_term = (((energy - target_energy) / atoms) ** 2).sum() / structures
    per_atom = ((forces - target_forces) ** 2).sum(-1)
    per_structure = torch.zeros(structures, dtype=energy.dtype).index_add(0, batch, per_atom)
    force_term = (per_structure / (3.0 * atoms)).sum() / structures
    return energy_weight * energy_term + force_weight * force_term


def energy_and_forces(model, positions, *rest):
    """Energy [B] and forces = -dE/dpositions with create_graph (a force loss trains on them)."""
    positions = positions.detach().requires_grad_(True)
    energy = model(positions, *rest)
    (gradient,) = torch.autograd.grad(energy.sum(), positions, create_graph=True)
    return energy, -gradient


def radius_graph(positions, cell, pbc, cutoff):
    """Edges [2, E] (sources, targets) and Cartesian shifts [E, 3] of one structure, float64."""
    positions = torch.as_tensor(positions, dtype=torch.float64)
    cell = torch.as_tensor(cell, dtype=torch.float64).reshape(3, 3)
    ranges = []
    for axis in range(3):
        if not pbc[axis]:
            ranges.append([0])
            continue
        # Images as far as the cutoff reaches across the cell's faces.
        normal = torch.linalg.cross(cell[(axis + 1) % 3], cell[(axis + 2) % 3])
        width = abs(float(cell[axis] @ normal)) / float(torch.linalg.norm(normal))
        reach = math.ceil(cutoff / width)
        ranges.append(range(-reach, reach + 1))
    images = [torch.tensor(n, dtype=torch.float64) for n in itertools.product(*ranges)]
    edges, shifts = [], []
    atoms = positions.shape[0]
    for t in range(atoms):
        for s in range(atoms):
            for n in images:
                if s == t and not bool(n.any()):
                    continue
                shift = n @ cell
                if float(torch.linalg.norm(positions[t] - positions[s] + shift)) < cutoff:
                    edges.append((s, t))
                    shifts.append(shift)
    edge_index = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t().contiguous()
    edge_shifts = torch.stack(shifts) if shifts else torch.zeros(0, 3, dtype=torch.float64)
    return edge_index, edge_shifts


def morse(r, depth=1.0, width=1.5, r0=1.2):
    x = torch.exp(-width * (r - r0))
    return depth * (x * x - 2.0 * x)


def label(positions, numbers, cell, pbc, cutoff):
    """Morse energy and forces over the radius graph (pairs strictly inside the cutoff), float64."""
    positions = torch.as_tensor(positions, dtype=torch.float64).clone().requires_grad_(True)
    edge_index, shifts = radius_graph(positions.detach(), cell, pbc, cutoff)
    vectors = positions[edge_index[1]] - positions[edge_index[0]] + shifts
    r = torch.sqrt((vectors * vectors).sum(-1))
    scale = 1.0 + 0.1 * (numbers[edge_index[0]] + numbers[edge_index[1]]).to(torch.float64)
    energy = 0.5 * (scale * morse(r)).sum()
    (gradient,) = torch.autograd.grad(energy, positions)
    return float(energy.detach()), -gradient


def random_structure(generator, atoms, periodic, elements=(1, 6, 7, 8), spacing=1.1):
    """A structure of `atoms` atoms at least `spacing` apart: a cluster, or a triclinic cell."""
    numbers = torch.tensor(elements)[torch.randint(len(elements), (atoms,), generator=generator)]
    if periodic:
        edge = 1.3 * atoms ** (1.0 / 3.0) + 1.8
        cell = torch.eye(3, dtype=torch.float64) * edge
        cell[1, 0] = 0.3 * edge * float(torch.rand(1, generator=generator))
        cell[2, 1] = 0.2 * edge * float(torch.rand(1, generator=generator))
    else:
        edge = 1.2 * atoms ** (1.0 / 3.0) + 0.5
        cell = torch.zeros(3, 3, dtype=torch.float64)
    positions = []
    while len(positions) < atoms:
        p = torch.rand(3, generator=generator, dtype=torch.float64) * edge
        if periodic:
            p = p / edge @ cell
        if all(float(torch.linalg.norm(p - q)) >= spacing for q in positions):
            positions.append(p)
    return torch.stack(positions), numbers, cell, [periodic] * 3


def morse_structures(count, min_atoms, max_atoms, periodic_every, cutoff, seed):
    """`count` labelled structures: every `periodic_every`-th periodic (0: clusters only).

    Each is a dict of AtomicData's fields, float32, with its neighbor list (structure-local rows,
    sender first) and Cartesian shifts."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        atoms = int(torch.randint(min_atoms, max_atoms + 1, (1,), generator=generator))
        periodic = periodic_every > 0 and i % periodic_every == periodic_every - 1
        positions, numbers, cell, pbc = random_structure(generator, atoms, periodic)
        energy, forces = label(positions, numbers, cell, pbc, cutoff)
        edge_index, shifts = radius_graph(positions, cell, pbc, cutoff)
        out.append({
            "positions": positions.float(),
            "atomic_numbers": numbers.long(),
            "forces": forces.float(),
            "energy": torch.tensor([[energy]], dtype=torch.float32),
            "cell": cell.float().unsqueeze(0),
            "pbc": torch.tensor([pbc]),
            "neighbor_list": edge_index.t().contiguous().to(torch.int32),
            "shifts": shifts.float(),
        })
    return out


def collate(structures):
    """A ragged batch in mpigrad's layout: the model's six inputs, the targets, num_atoms."""
    positions, numbers, edges, shifts, batch, cells, energy, forces, counts = ([] for _ in range(9))
    offset = 0
    for b, s in enumerate(structures):
        n = s["positions"].shape[0]
        positions.append(s["positions"])
        numbers.append(s["atomic_numbers"])
        edges.append(s["neighbor_list"].t().long() + offset)
        shifts.append(s["shifts"])
        batch.append(torch.full((n,), b, dtype=torch.int64))
        cells.append(s["cell"].reshape(1, 3, 3))
        energy.append(s["energy"].reshape(1))
        forces.append(s["forces"])
        counts.append(n)
        offset += n
    inputs = [torch.cat(positions), torch.cat(numbers), torch.cat(edges, 1), torch.cat(shifts),
              torch.cat(batch), torch.cat(cells)]
    return inputs, torch.cat(energy), torch.cat(forces), torch.tensor(counts)
