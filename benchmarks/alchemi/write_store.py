"""Writes tests/data/alchemi/store.zarr with nvalchemi-toolkit's own AtomicDataZarrWriter, and
prints, as ALCHEMI's AtomicDataZarrReader reads them back, the numbers that
tests/data/test_alchemi_store.cpp checks mpigrad's reader against.

Optional, never run by CI: it needs nvalchemi-toolkit (pip install nvalchemi-toolkit; 0.3.0 wrote
the committed store) and zarr. Run from the repository root:

    python benchmarks/alchemi/write_store.py [--output tests/data/alchemi/store.zarr]

The store has 5 small periodic structures (2 to 5 atoms, a ring of edges in each, Cartesian image
shifts), core arrays in shards of 8 rows holding chunks of 4 (ALCHEMI's sharding, zstd inside,
crc32c on the shard index), and structure 2 soft-deleted with the writer's delete(). The
AtomicData fields nobody set (velocities, atomic_masses, ...) are all zeros, which zarr does
not write: they read as their fill value.
"""

import argparse
import shutil

import torch
from zarr.codecs import ZstdCodec

from nvalchemi.data import AtomicData
from nvalchemi.data.datapipes.backends.zarr import (
    AtomicDataZarrReader,
    AtomicDataZarrWriter,
    ZarrArrayConfig,
    ZarrWriteConfig,
)


def structures():
    generator = torch.Generator().manual_seed(35)
    result = []
    for s, n in enumerate((3, 2, 4, 5, 3)):
        positions = torch.rand(n, 3, generator=generator) * 4.0
        edges = torch.tensor([[i, (i + 1) % n] for i in range(n)], dtype=torch.int32)
        shifts = torch.zeros(n, 3)
        shifts[n - 1, 0] = 4.0 + s  # the ring's closing edge crosses the cell along x
        result.append(
            AtomicData(
                positions=positions,
                atomic_numbers=torch.randint(1, 30, (n,), generator=generator),
                forces=torch.randn(n, 3, generator=generator),
                energy=torch.tensor([[-1.25 * (s + 1)]]),
                cell=(torch.eye(3) * (4.0 + s)).unsqueeze(0),
                pbc=torch.tensor([[True, True, s % 2 == 0]]),
                stress=torch.randn(1, 3, 3, generator=generator),
                neighbor_list=edges,
                shifts=shifts,
            )
        )
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="tests/data/alchemi/store.zarr")
    args = parser.parse_args()
    shutil.rmtree(args.output, ignore_errors=True)
    config = ZarrWriteConfig(
        core=ZarrArrayConfig(compressors=(ZstdCodec(level=3),), chunk_size=4, shard_size=8)
    )
    writer = AtomicDataZarrWriter(args.output, config)
    writer.write(structures())
    writer.delete([2])

    reader = AtomicDataZarrReader(args.output)
    print(f"active structures: {len(reader)} of {reader.num_samples}")
    for index in range(len(reader)):
        data, meta = reader[index]
        print(f"index {index} (stored {meta['physical_index']}): atoms {data['positions'].shape[0]}")
        print("  positions[0]  ", [float(x) for x in data["positions"][0]])
        print("  positions[-1] ", [float(x) for x in data["positions"][-1]])
        print("  atomic_numbers", [int(x) for x in data["atomic_numbers"]])
        print("  forces[-1]    ", [float(x) for x in data["forces"][-1]])
        print("  energy        ", float(data["energy"].reshape(-1)[0]))
        print("  cell[0][0]    ", float(data["cell"].reshape(-1)[0]))
        print("  pbc           ", [bool(x) for x in data["pbc"].reshape(-1)])
        print("  stress[0][1]  ", float(data["stress"].reshape(-1)[1]))
        print("  neighbor_list ", data["neighbor_list"].tolist())  # structure-local rows
        print("  shifts[-1]    ", [float(x) for x in data["shifts"][-1]])


if __name__ == "__main__":
    main()
