// A store written by nvalchemi-toolkit 0.3.0's own AtomicDataZarrWriter (tests/data/alchemi/,
// made by benchmarks/alchemi/write_store.py): sharded zstd arrays with a crc32c shard index,
// fields zarr never wrote (all zeros), and a structure soft-deleted by the writer's delete().
// The numbers below are what ALCHEMI's AtomicDataZarrReader printed for it.
#include <doctest/doctest.h>

#include "mpigrad/data/atomic_dataset.h"
#include "mpigrad/data/zarr_array.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT

std::vector<float> row(const std::vector<float>& values, int64_t r) {
  return std::vector<float>(values.begin() + r * 3, values.begin() + r * 3 + 3);
}

}  // namespace

TEST_CASE("the store nvalchemi-toolkit wrote reads as ALCHEMI's own reader reads it") {
  AtomicDataset dataset(MPIGRAD_ALCHEMI_STORE);
  const AtomicStore& store = dataset.store();
  CHECK(store.num_samples() == 5);
  CHECK(dataset.size() == 4);  // structure 2 was deleted
  CHECK(store.active() == std::vector<int64_t>{0, 1, 3, 4});
  CHECK(dataset.atom_counts() == std::vector<int64_t>{3, 2, 5, 3});
  const auto* positions = dynamic_cast<const ZarrArray*>(store.find("positions")->array.get());
  REQUIRE(positions != nullptr);
  CHECK(positions->sharded());
  CHECK(positions->read_shape() == std::vector<int64_t>{4, 3});

  Batch batch = dataset.get_batch(std::vector<int64_t>{2, 0, 3, 1});
  CHECK(batch["atoms_ptr"].to_vector<int64_t>() == std::vector<int64_t>{0, 5, 8, 11, 13});
  const auto xyz = batch["positions"].to_vector<float>();
  CHECK(row(xyz, 0) ==
        std::vector<float>{3.2424659729003906f, 1.8866260051727295f, 0.3386833667755127f});
  CHECK(row(xyz, 4) ==
        std::vector<float>{0.9582159519195557f, 1.0990111827850342f, 1.1919996738433838f});
  CHECK(row(xyz, 5) ==
        std::vector<float>{1.0482656955718994f, 0.5901525020599365f, 3.749995231628418f});
  CHECK(row(xyz, 10) ==
        std::vector<float>{2.1955578327178955f, 2.9384429454803467f, 2.4300270080566406f});
  CHECK(row(xyz, 12) ==
        std::vector<float>{3.3558731079101562f, 1.9485268592834473f, 0.5121235847473145f});
  CHECK(batch["atomic_numbers"].to_vector<int64_t>() ==
        std::vector<int64_t>{19, 27, 13, 14, 15, 3, 1, 1, 29, 23, 28, 27, 15});
  const auto forces = batch["forces"].to_vector<float>();
  CHECK(row(forces, 4) ==
        std::vector<float>{1.4145959615707397f, 0.10281603038311005f, 0.14292392134666443f});
  CHECK(row(forces, 7) ==
        std::vector<float>{2.123649835586548f, 0.01677825301885605f, 0.7926217317581177f});
  CHECK(row(forces, 12) ==
        std::vector<float>{0.9740431308746338f, -1.0239284038543701f, -0.36825475096702576f});
  CHECK(batch["energy"].to_vector<float>() == std::vector<float>{-5.0f, -1.25f, -6.25f, -2.5f});
  const auto cell = batch["cell"].to_vector<float>();
  CHECK(cell[0] == 7.0f);
  CHECK(cell[9] == 4.0f);
  CHECK(cell[18 + 4] == 8.0f);
  CHECK(cell[27 + 8] == 5.0f);
  CHECK(batch["pbc"].to_vector<uint8_t>() ==
        std::vector<uint8_t>{1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0});
  const auto stress = batch["stress"].to_vector<float>();
  CHECK(stress[1] == -0.28299424052238464f);
  CHECK(stress[9 + 1] == -0.8646219372749329f);
  CHECK(stress[18 + 1] == -0.4789830148220062f);
  CHECK(stress[27 + 1] == 0.6581790447235107f);

  // ALCHEMI's structure-local rings, here in batch rows: 0..4, then 5..7, 8..10, 11..12.
  CHECK(batch["edges_ptr"].to_vector<int64_t>() == std::vector<int64_t>{0, 5, 8, 11, 13});
  CHECK(batch["edge_index"].to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9,  10, 11, 12,
                             1, 2, 3, 4, 0, 6, 7, 5, 9, 10, 8,  12, 11});
  const auto shifts = batch["edge_shifts"].to_vector<float>();
  CHECK(row(shifts, 4) == std::vector<float>{7.0f, 0.0f, 0.0f});
  CHECK(row(shifts, 7) == std::vector<float>{4.0f, 0.0f, 0.0f});
  CHECK(row(shifts, 10) == std::vector<float>{8.0f, 0.0f, 0.0f});
  CHECK(row(shifts, 12) == std::vector<float>{5.0f, 0.0f, 0.0f});
  CHECK(row(shifts, 0) == std::vector<float>{0.0f, 0.0f, 0.0f});

  // Fields the writer created but zarr never wrote (all zeros) read as their fill value.
  REQUIRE(batch.has("velocities"));
  CHECK(batch["velocities"].shape() == core::Shape{13, 3});
  CHECK(batch["velocities"].to_vector<float>() == std::vector<float>(39, 0.0f));
}
