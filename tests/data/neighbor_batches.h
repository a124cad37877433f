// Random ragged batches for the neighbor searches, shared by the data tests (the all-pairs search
// on the CPU against the cell list) and the CUDA suite (the search on a GPU against the CPU).
//
// Each batch mixes what a search can get wrong: cubic and triclinic periodic cells, a cell
// thinner than the cutoff (several images of one atom), mixed and no periodicity, atoms outside
// the cell (to be wrapped), a structure of one atom and one of none, and a few atoms on the
// same spot (equal distances, where max_neighbors breaks ties by order).
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/data/batch.h"

namespace mpigrad::test {

struct NeighborBatchCase {
  std::string name;
  data::Batch batch;  // positions, atoms_ptr, cell, pbc on the host
};

inline std::vector<NeighborBatchCase> neighbor_batches(uint64_t seed) {
  using Cell = std::array<double, 9>;
  const Cell cubic = {4.0, 0, 0, 0, 4.0, 0, 0, 0, 4.0};
  const Cell triclinic = {4.2, 0, 0, 1.3, 3.9, 0, -0.8, 0.9, 4.4};
  const Cell thin = {1.7, 0, 0, 0.4, 1.9, 0, 0.2, -0.3, 2.1};  // thinner than the cutoff
  const Cell slab = {5.0, 0, 0, 0.7, 4.5, 0, 0, 0, 12.0};
  struct Structure {
    int64_t atoms;
    Cell cell;
    std::array<bool, 3> pbc;
  };
  const std::vector<std::vector<Structure>> batches = {
      {{9, cubic, {true, true, true}},
       {14, triclinic, {true, true, true}},
       {1, cubic, {true, true, true}}},
      {{11, thin, {true, true, true}},
       {0, cubic, {true, true, true}},
       {6, thin, {true, false, true}}},
      {{17, slab, {true, true, false}},
       {13, Cell{}, {false, false, false}},
       {20, triclinic, {false, true, false}}},
      {{40, triclinic, {true, true, true}}, {33, Cell{}, {false, false, false}}},
  };
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> fraction(-0.5, 1.5), box(0.0, 5.0);
  std::vector<NeighborBatchCase> cases;
  for (size_t i = 0; i < batches.size(); ++i) {
    std::vector<float> positions, cells;
    std::vector<uint8_t> pbcs;
    std::vector<int64_t> atoms_ptr = {0};
    for (const Structure& s : batches[i]) {
      const bool periodic = s.pbc[0] || s.pbc[1] || s.pbc[2];
      for (int64_t a = 0; a < s.atoms; ++a) {
        if (a == 3 && s.atoms > 5) {                    // on top of atom 1: ties in distance
          const size_t earlier = positions.size() - 6;  // atom a - 2
          for (size_t c = 0; c < 3; ++c) {
            const float x = positions[earlier + c];
            positions.push_back(x);
          }
          continue;
        }
        const double f[3] = {fraction(rng), fraction(rng), fraction(rng)};
        for (int c = 0; c < 3; ++c) {
          const double x = periodic ? f[0] * s.cell[size_t(c)] + f[1] * s.cell[size_t(3 + c)] +
                                          f[2] * s.cell[size_t(6 + c)]
                                    : box(rng);
          positions.push_back(float(x));
        }
      }
      for (double v : s.cell) cells.push_back(float(v));
      for (bool v : s.pbc) pbcs.push_back(v ? 1 : 0);
      atoms_ptr.push_back(atoms_ptr.back() + s.atoms);
    }
    const int64_t structures = int64_t(batches[i].size());
    NeighborBatchCase c;
    c.name = "batch " + std::to_string(i);
    for (int64_t b = 0; b < structures; ++b) c.batch.indices.push_back(100 * int64_t(i) + b);
    c.batch.set("positions", core::Tensor::from_vector<float>(positions, {atoms_ptr.back(), 3}));
    c.batch.set("atoms_ptr", core::Tensor::from_vector<int64_t>(atoms_ptr, {structures + 1}));
    c.batch.set("cell", core::Tensor::from_vector<float>(cells, {structures, 3, 3}));
    c.batch.set("pbc", core::Tensor::from_vector<uint8_t>(pbcs, {structures, 3}).to(core::kBool));
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace mpigrad::test
