// The all-pairs radius graph (radius_graph_batch, kernels/neighbor_list.h) on the CPU against the
// cell list of radius_graph_transform: the same edges, order, shifts and edges_ptr, bit for bit,
// on random batches with and without max_neighbors and self loops. The CUDA suite holds the GPU
// search against the same reference (tests/cuda/test_cuda_neighbor_list.cpp).
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "../error_message.h"
#include "mpigrad/data/neighbor_list.h"
#include "neighbor_batches.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::error_message;

TEST_CASE("radius_graph_batch on the CPU finds what the cell list finds") {
  int64_t total_edges = 0, capped = 0;
  for (const test::NeighborBatchCase& c : test::neighbor_batches(7)) {
    for (const double cutoff : {2.3, 3.1}) {
      for (const int64_t max_neighbors : {int64_t(0), int64_t(3), int64_t(8)}) {
        for (const bool self_loops : {false, true}) {
          INFO(c.name, ", cutoff ", cutoff, ", max_neighbors ", max_neighbors, ", self loops ",
               self_loops);
          const data::NeighborListOptions options{
              .cutoff = cutoff, .max_neighbors = max_neighbors, .self_loops = self_loops};
          const data::Batch expected = data::radius_graph_transform(options)(c.batch);
          const data::BatchGraph found =
              data::radius_graph_batch(c.batch["positions"], c.batch["atoms_ptr"], c.batch["cell"],
                                       c.batch["pbc"], options, c.batch.indices);
          CHECK(found.edge_index.shape() == expected["edge_index"].shape());
          CHECK(found.edge_index.to_vector<int64_t>() ==
                expected["edge_index"].to_vector<int64_t>());
          CHECK(found.edge_shifts.to_vector<float>() == expected["edge_shifts"].to_vector<float>());
          CHECK(found.edges_ptr.to_vector<int64_t>() == expected["edges_ptr"].to_vector<int64_t>());
          total_edges += found.edge_index.shape()[1];
          if (max_neighbors > 0) {
            // Some target had more sources than it kept: the selection ran.
            const data::NeighborListOptions all{.cutoff = cutoff, .self_loops = self_loops};
            const int64_t uncapped =
                data::radius_graph_transform(all)(c.batch)["edge_index"].shape()[1];
            if (uncapped > found.edge_index.shape()[1]) ++capped;
          }
        }
      }
    }
  }
  CHECK(total_edges > 10000);  // the cases are not empty
  CHECK(capped > 10);
}

TEST_CASE("radius_graph_batch without cell and pbc treats every axis as open") {
  data::Batch batch = test::neighbor_batches(3)[2].batch;
  const data::NeighborListOptions options{.cutoff = 2.0};
  const data::BatchGraph open =
      data::radius_graph_batch(batch["positions"], batch["atoms_ptr"], Tensor(), Tensor(), options);
  batch.set("pbc", core::zeros({batch.size(), 3}, core::kBool));
  const data::Batch expected = data::radius_graph_transform(options)(batch);
  CHECK(open.edge_index.to_vector<int64_t>() == expected["edge_index"].to_vector<int64_t>());
  CHECK(open.edge_shifts.to_vector<float>() == expected["edge_shifts"].to_vector<float>());
}

TEST_CASE("radius_graph_batch: bad input is one error naming the structure") {
  data::Batch batch = test::neighbor_batches(5)[0].batch;
  const data::NeighborListOptions options{.cutoff = 2.5};
  std::vector<float> positions = batch["positions"].to_vector<float>();
  positions[3 * 12 + 1] = std::numeric_limits<float>::quiet_NaN();  // structure 1, its atom 3
  const Tensor bad = Tensor::from_vector<float>(positions, batch["positions"].shape());
  CHECK(error_message([&] {
          data::radius_graph_batch(bad, batch["atoms_ptr"], batch["cell"], batch["pbc"], options,
                                   batch.indices);
        }) ==
        "radius_graph_batch: structure 1: atom 3 has a position component that is not "
        "finite");
  const Tensor flat = core::zeros({batch.size(), 3, 3}, core::kFloat32);
  CHECK(error_message([&] {
          data::radius_graph_batch(batch["positions"], batch["atoms_ptr"], flat, batch["pbc"],
                                   options, batch.indices);
        }).find("radius_graph_batch: structure 0: pbc is set on an axis but the cell") == 0);
  CHECK(error_message([&] {
          data::radius_graph_batch(batch["positions"], batch["atoms_ptr"], batch["cell"],
                                   batch["pbc"], {.cutoff = 0.0});
        }) == "radius_graph_batch: the cutoff must be positive, got 0");
}
