// The radius graph on a GPU (radius_graph_batch and the batch transform on CUDA positions,
// kernels/cuda/neighbor_list.cu) against the host's cell list: the same edges, order, shifts and
// edges_ptr, bit for bit, on random batches (periodic cubic, triclinic and thin cells, mixed and
// open ones) with and without max_neighbors and self loops, and on one batch of many structures.
#include <doctest/doctest.h>

#include <limits>
#include <random>
#include <vector>

#include "cuda_test.h"
#include "data/neighbor_batches.h"
#include "mpigrad/data/neighbor_list.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

const core::Device kGpu = core::cuda(0);

// The batch with every field on the GPU.
data::Batch on_gpu(const data::Batch& batch) {
  data::Batch moved = batch;
  for (auto& [name, tensor] : moved.fields) tensor = tensor.to(kGpu);
  return moved;
}

void check_same_graph(const data::Batch& gpu, const data::Batch& cpu) {
  for (const char* name : {"edge_index", "edge_shifts", "edges_ptr"}) {
    INFO(name);
    CHECK(gpu[name].device() == kGpu);
    CHECK(gpu[name].shape() == cpu[name].shape());
  }
  CHECK(gpu["edge_index"].to(core::kCPU).to_vector<int64_t>() ==
        cpu["edge_index"].to_vector<int64_t>());
  CHECK(gpu["edge_shifts"].to(core::kCPU).to_vector<float>() ==
        cpu["edge_shifts"].to_vector<float>());
  CHECK(gpu["edges_ptr"].to(core::kCPU).to_vector<int64_t>() ==
        cpu["edges_ptr"].to_vector<int64_t>());
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("the radius graph on a GPU is the host's, bit for bit") {
  int64_t total_edges = 0;
  for (const test::NeighborBatchCase& c : test::neighbor_batches(11)) {
    for (const double cutoff : {2.3, 3.1}) {
      for (const int64_t max_neighbors : {int64_t(0), int64_t(3), int64_t(8)}) {
        for (const bool self_loops : {false, true}) {
          INFO(c.name, ", cutoff ", cutoff, ", max_neighbors ", max_neighbors, ", self loops ",
               self_loops);
          const data::NeighborListOptions options{
              .cutoff = cutoff, .max_neighbors = max_neighbors, .self_loops = self_loops};
          const auto transform = data::radius_graph_transform(options);
          const data::Batch cpu = transform(c.batch);
          const data::Batch gpu = transform(on_gpu(c.batch));
          check_same_graph(gpu, cpu);
          total_edges += cpu["edge_index"].shape()[1];
        }
      }
    }
  }
  CHECK(total_edges > 10000);
}

MPIGRAD_CUDA_TEST_CASE("the radius graph of many structures on a GPU is the host's") {
  // 200 periodic structures of 20 to 60 atoms: many blocks of targets, ragged offsets.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> positions, cells;
  std::vector<uint8_t> pbcs;
  std::vector<int64_t> atoms_ptr = {0};
  data::Batch batch;
  for (int64_t b = 0; b < 200; ++b) {
    const int64_t atoms = 20 + int64_t(unit(rng) * 41);
    const double side = 5.0 + 3.0 * unit(rng);
    const double cell[9] = {side, 0, 0, 0.5 * unit(rng), side, 0, 0, 0.3 * unit(rng), side};
    for (int64_t a = 0; a < 3 * atoms; ++a) positions.push_back(float(side * unit(rng)));
    for (double v : cell) cells.push_back(float(v));
    for (int k = 0; k < 3; ++k) pbcs.push_back(b % 4 == 3 ? 0 : 1);
    atoms_ptr.push_back(atoms_ptr.back() + atoms);
    batch.indices.push_back(b);
  }
  batch.set("positions", Tensor::from_vector<float>(positions, {atoms_ptr.back(), 3}));
  batch.set("atoms_ptr", Tensor::from_vector<int64_t>(atoms_ptr, {201}));
  batch.set("cell", Tensor::from_vector<float>(cells, {200, 3, 3}));
  batch.set("pbc", Tensor::from_vector<uint8_t>(pbcs, {200, 3}).to(core::kBool));
  for (const int64_t max_neighbors : {int64_t(0), int64_t(12)}) {
    INFO("max_neighbors ", max_neighbors);
    const auto transform =
        data::radius_graph_transform({.cutoff = 3.0, .max_neighbors = max_neighbors});
    const data::Batch cpu = transform(batch);
    CHECK(cpu["edge_index"].shape()[1] > 50000);
    check_same_graph(transform(on_gpu(batch)), cpu);
  }
}

MPIGRAD_CUDA_TEST_CASE("the radius graph on a GPU names a structure with a bad position") {
  data::Batch batch = test::neighbor_batches(5)[0].batch;
  std::vector<float> positions = batch["positions"].to_vector<float>();
  positions[3 * 12 + 2] = std::numeric_limits<float>::infinity();  // structure 1, its atom 3
  batch.set("positions", Tensor::from_vector<float>(positions, batch["positions"].shape()));
  CHECK_THROWS_WITH_AS(data::radius_graph_transform({.cutoff = 2.5})(on_gpu(batch)),
                       "radius_graph_batch: structure 1: atom 3 has a position component that is "
                       "not finite",
                       core::Error);
}
