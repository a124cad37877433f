// make-atomic-store OUT.h5 STRUCTURES SEED [--neighbor-list CUTOFF]: a small store of atomic
// structures in ALCHEMI's layout, written as HDF5 with core's writer, for atomistic_checks.sh:
//   meta/atoms_ptr int64 [S + 1]; core/positions float32 [V, 3], core/atomic_numbers int64 [V],
//   core/forces float32 [V, 3], core/energy float32 [S, 1], core/cell float32 [S, 3, 3],
//   core/pbc bool [S, 3], core/stress float32 [S, 3, 3]
// labelled by a Morse pair potential (cutoff 2.4; energy, forces and virial stress): 2 to 6 atoms
// each, at least 1.0 apart, every other structure periodic in a triclinic cell. With
// --neighbor-list, every structure is a cluster and the store also holds core/neighbor_list int32
// [E, 2] (store-global rows, source then target) and meta/edges_ptr int64 [S + 1].
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/data/neighbor_list.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr, "usage: %s OUT.h5 STRUCTURES SEED [--neighbor-list CUTOFF]\n", argv[0]);
    return 2;
  }
  try {
    const std::string out = argv[1];
    const int64_t count = std::stoll(argv[2]);
    std::mt19937_64 rng(std::stoull(argv[3]));
    const bool lists = argc == 6;
    const double list_cutoff = lists ? std::stod(argv[5]) : 0.0;
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double cutoff = 2.4;
    std::vector<float> positions, forces, energies, cells, stresses;
    std::vector<uint8_t> pbc;
    std::vector<int64_t> numbers, atoms_ptr = {0}, edges_ptr = {0};
    std::vector<int32_t> neighbors;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t atoms = 2 + int64_t(rng() % 5);
      const bool periodic = !lists && i % 2 == 0;
      std::array<double, 9> cell = {2.6, 0.0, 0.0, 0.5, 2.5, 0.0, -0.3, 0.4, 2.8};
      if (!periodic) cell = {};
      const std::array<bool, 3> axes = {periodic, periodic, periodic};
      // Atoms at least 1.0 apart (periodic images included), so forces stay moderate.
      std::vector<double> p;
      for (int64_t a = 0; a < atoms; ++a) {
        for (int attempt = 0;; ++attempt) {
          std::vector<double> trial = p;
          for (int c = 0; c < 3; ++c) trial.push_back(2.4 * unit(rng));
          if (data::radius_graph(trial, cell, axes, {.cutoff = 1.0}).size() == 0) {
            p = trial;
            break;
          }
          if (attempt == 1000) throw std::runtime_error("cannot place an atom");
        }
        numbers.push_back(a % 2 == 0 ? 6 : 8);
      }
      const data::StructureEdges edges = data::radius_graph(p, cell, axes, {.cutoff = cutoff});
      double energy = 0;
      std::vector<double> f(p.size(), 0.0);
      std::array<double, 9> virial{};
      for (int64_t e = 0; e < edges.size(); ++e) {
        const int64_t t = edges.target[size_t(e)], s = edges.source[size_t(e)];
        double v[3], r = 0;
        for (int c = 0; c < 3; ++c) {
          v[c] = p[size_t(3 * t + c)] - p[size_t(3 * s + c)] + edges.shift[size_t(3 * e + c)];
          r += v[c] * v[c];
        }
        r = std::sqrt(r);
        const double x = std::exp(-1.5 * (r - 1.2));
        energy += 0.5 * ((1 - x) * (1 - x) - 1);
        const double slope = 0.5 * 2 * (1 - x) * 1.5 * x;
        for (int c = 0; c < 3; ++c) {
          f[size_t(3 * t + c)] -= slope * v[c] / r;
          f[size_t(3 * s + c)] += slope * v[c] / r;
          for (int d = 0; d < 3; ++d) virial[size_t(3 * c + d)] += slope * v[c] * v[d] / r;
        }
      }
      const double volume = std::abs(cell[0] * (cell[4] * cell[8] - cell[5] * cell[7]) -
                                     cell[1] * (cell[3] * cell[8] - cell[5] * cell[6]) +
                                     cell[2] * (cell[3] * cell[7] - cell[4] * cell[6]));
      for (double x : p) positions.push_back(float(x));
      for (double x : f) forces.push_back(float(x));
      for (double x : cell) cells.push_back(float(x));
      for (double x : virial) stresses.push_back(periodic ? float(x / volume) : 0.0f);
      for (int c = 0; c < 3; ++c) pbc.push_back(periodic ? 1 : 0);
      energies.push_back(float(energy));
      if (lists) {
        const data::StructureEdges listed =
            data::radius_graph(p, cell, axes, {.cutoff = list_cutoff});
        for (int64_t e = 0; e < listed.size(); ++e) {
          neighbors.push_back(int32_t(atoms_ptr.back() + listed.source[size_t(e)]));
          neighbors.push_back(int32_t(atoms_ptr.back() + listed.target[size_t(e)]));
        }
        edges_ptr.push_back(edges_ptr.back() + listed.size());
      }
      atoms_ptr.push_back(atoms_ptr.back() + atoms);
    }
    const int64_t v = atoms_ptr.back();
    core::hdf5::File file = core::hdf5::File::create(out);
    file.write_tensor("meta/atoms_ptr", Tensor::from_vector<int64_t>(atoms_ptr, {count + 1}));
    file.write_tensor("core/positions", Tensor::from_vector<float>(positions, {v, 3}));
    file.write_tensor("core/atomic_numbers", Tensor::from_vector<int64_t>(numbers, {v}));
    file.write_tensor("core/forces", Tensor::from_vector<float>(forces, {v, 3}));
    file.write_tensor("core/energy", Tensor::from_vector<float>(energies, {count, 1}));
    file.write_tensor("core/cell", Tensor::from_vector<float>(cells, {count, 3, 3}));
    file.write_tensor("core/pbc", Tensor::from_vector<uint8_t>(pbc, {count, 3}).to(core::kBool));
    file.write_tensor("core/stress", Tensor::from_vector<float>(stresses, {count, 3, 3}));
    if (lists) {
      const int64_t e = int64_t(neighbors.size() / 2);
      file.write_tensor("meta/edges_ptr", Tensor::from_vector<int64_t>(edges_ptr, {count + 1}));
      file.write_tensor("core/neighbor_list", Tensor::from_vector<int32_t>(neighbors, {e, 2}));
    }
    file.close();
    std::printf("%s: %lld structures, %lld atoms\n", out.c_str(), static_cast<long long>(count),
                static_cast<long long>(v));
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make-atomic-store: %s\n", error.what());
    return 1;
  }
}
