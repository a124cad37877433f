// The atoms calls of the C API against the library's own path: the energies and forces a host
// gets are predict_energy_forces' (launch/train/atomistic_steps.h) on the batch mpigrad train
// would build (radius_graph_transform of [graph]), for the same config and seed; and an ONNX
// potential exported from PyTorch, given the host's neighbor list, gives PyTorch's energies and
// forces (tests/data/atomistic/reference.h5).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/batch.h"
#include "mpigrad/data/neighbor_list.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/train/atomistic_steps.h"
#include "mpigrad/mpigrad_c.h"

namespace {

using namespace mpigrad;
using core::Tensor;

const std::string kPotential =
    "[model]\nname = schnet\nhidden = 16\nn_rbf = 10\ninteractions = 2\n[graph]\ncutoff = 2.5\n"
    "[loss]\nname = energy_force\n[train]\nseed = 11\n";

double largest(const std::vector<double>& values) {
  double most = 0;
  for (double v : values) most = std::max(most, std::abs(v));
  return most;
}

}  // namespace

TEST_CASE(
    "atoms calls: the energies and forces of predict_energy_forces on mpigrad train's batch") {
  // Two structures: 12 atoms in a periodic triclinic cell, 5 in a cluster.
  std::mt19937 random(4);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const std::vector<int64_t> counts = {12, 5};
  const int64_t atoms = 17;
  std::vector<double> positions(size_t(atoms) * 3),
      cells = {4.5, 0, 0, 0.6, 4.2, 0, 0.3, 0.4, 4.8, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < atoms; ++i) {
    for (int d = 0; d < 3; ++d) positions[size_t(3 * i + d)] = uniform(random) * (i < 12 ? 4.4 : 3);
  }
  std::vector<int32_t> numbers(static_cast<size_t>(atoms));
  std::vector<int32_t> pbc = {1, 1, 1, 0, 0, 0};
  for (int64_t i = 0; i < atoms; ++i) numbers[size_t(i)] = int32_t(1 + i % 3 * 5);  // 1, 6, 11

  mpigrad_model model{};
  REQUIRE(mpigrad_model_create(&model, kPotential.c_str(), "cpu") == MPIGRAD_SUCCESS);
  const int64_t v_shape[2] = {atoms, 3}, n_shape[1] = {atoms}, b_shape[1] = {2},
                cell_shape[3] = {2, 3, 3}, pbc_shape[2] = {2, 3};
  std::vector<int64_t> count_values = counts;
  std::vector<double> energy(2), forces(size_t(atoms) * 3);
  mpigrad_array p = mpigrad_host_array(positions.data(), 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array z = mpigrad_host_array(numbers.data(), 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array n =
      mpigrad_host_array(count_values.data(), 1, b_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
  mpigrad_array c = mpigrad_host_array(cells.data(), 3, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array b = mpigrad_host_array(pbc.data(), 2, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array e = mpigrad_host_array(energy.data(), 1, b_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array f = mpigrad_host_array(forces.data(), 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_atoms structures = mpigrad_atoms_of(&p, &z);
  structures.num_atoms = &n;
  structures.cell = &c;
  structures.pbc = &b;
  REQUIRE_MESSAGE(mpigrad_atoms_predict(model, &structures, &e, &f) == MPIGRAD_SUCCESS,
                  mpigrad_last_error());
  CHECK(mpigrad_model_destroy(&model) == MPIGRAD_SUCCESS);

  // The same potential from the same config, on the batch mpigrad train's loader would give it.
  const launch::TrainConfig config = launch::parse_config_text(kPotential, "test");
  std::shared_ptr<nn::AtomisticModel> reference = launch::make_atomistic_model(config);
  data::Batch batch;
  batch.indices = {0, 1};
  std::vector<float> single(positions.begin(), positions.end());
  std::vector<float> single_cells(cells.begin(), cells.end());
  std::vector<int64_t> long_numbers(numbers.begin(), numbers.end()), structure_of;
  for (int64_t s = 0; s < 2; ++s) structure_of.insert(structure_of.end(), size_t(counts[s]), s);
  batch.set("positions", Tensor::from_vector<float>(single, {atoms, 3}));
  batch.set("atomic_numbers", Tensor::from_vector<int64_t>(long_numbers, {atoms}));
  batch.set("batch", Tensor::from_vector<int64_t>(structure_of, {atoms}));
  batch.set("atoms_ptr", Tensor::from_vector<int64_t>({0, 12, 17}, {3}));
  batch.set("cell", Tensor::from_vector<float>(single_cells, {2, 3, 3}));
  batch.set("pbc", Tensor::from_vector<int32_t>(pbc, {2, 3}).to(core::kBool));
  batch = data::radius_graph_transform({.cutoff = 2.5})(std::move(batch));
  CHECK(batch["edge_index"].size(1) > 20);
  const launch::EnergyForcePrediction expected =
      launch::predict_energy_forces(*reference, batch, true, false, false);
  const std::vector<double> want_e = expected.energy.to(core::kFloat64).to_vector<double>();
  const std::vector<double> want_f = expected.forces.to(core::kFloat64).to_vector<double>();
  for (size_t s = 0; s < 2; ++s) CHECK(energy[s] == doctest::Approx(want_e[s]).epsilon(1e-6));
  const double scale = largest(want_f);
  CHECK(scale > 1e-4);
  for (size_t i = 0; i < want_f.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(forces[i] - want_f[i]) <= 1e-6 * scale);
  }
}

TEST_CASE("atoms calls: an ONNX potential from PyTorch, on the host's neighbor list") {
  const std::string data = MPIGRAD_SOURCE_DIR "/tests/data/atomistic/";
  const core::hdf5::File file = core::hdf5::File::open(data + "reference.h5");
  const std::string config = "[model]\nname = onnx\nfile = " + data +
                             "potential.scatter_add.onnx\n[loss]\nname = energy_force\n";
  mpigrad_model model{};
  REQUIRE_MESSAGE(mpigrad_model_create(&model, config.c_str(), "cpu") == MPIGRAD_SUCCESS,
                  mpigrad_last_error());
  std::vector<double> positions = file.read_tensor("positions").to_vector<double>();
  std::vector<int64_t> numbers = file.read_tensor("atomic_numbers").to_vector<int64_t>();
  std::vector<int64_t> edges = file.read_tensor("edge_index").to_vector<int64_t>();
  std::vector<double> shifts =
      file.read_tensor("edge_shifts").to(core::kFloat64).to_vector<double>();
  std::vector<double> cells = file.read_tensor("cell").to(core::kFloat64).to_vector<double>();
  const std::vector<int64_t> batch = file.read_tensor("batch").to_vector<int64_t>();
  std::vector<int64_t> counts(2, 0);
  for (int64_t s : batch) ++counts[size_t(s)];
  const int64_t atoms = int64_t(numbers.size()), edge_count = int64_t(edges.size() / 2);
  const int64_t v_shape[2] = {atoms, 3}, n_shape[1] = {atoms}, b_shape[1] = {2},
                cell_shape[3] = {2, 3, 3}, e_shape[2] = {2, edge_count},
                s_shape[2] = {edge_count, 3};
  std::vector<double> energy(2), forces(size_t(atoms) * 3);
  mpigrad_array p = mpigrad_host_array(positions.data(), 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array z = mpigrad_host_array(numbers.data(), 1, n_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
  mpigrad_array n = mpigrad_host_array(counts.data(), 1, b_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
  mpigrad_array c = mpigrad_host_array(cells.data(), 3, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array index = mpigrad_host_array(edges.data(), 2, e_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
  mpigrad_array shift = mpigrad_host_array(shifts.data(), 2, s_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array e = mpigrad_host_array(energy.data(), 1, b_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array f = mpigrad_host_array(forces.data(), 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_atoms structures = mpigrad_atoms_of(&p, &z);
  structures.num_atoms = &n;
  structures.cell = &c;
  // Without a neighbor list, and [graph] cutoff 0, mpigrad cannot build one.
  CHECK(mpigrad_atoms_predict(model, &structures, &e, &f) == MPIGRAD_ERROR_CONFIG);
  CHECK(std::string(mpigrad_last_error()).find("[graph] cutoff is 0") != std::string::npos);
  structures.edge_index = &index;
  structures.edge_shifts = &shift;
  REQUIRE_MESSAGE(mpigrad_atoms_predict(model, &structures, &e, &f) == MPIGRAD_SUCCESS,
                  mpigrad_last_error());
  const std::vector<double> want_e = file.read_tensor("energy").to_vector<double>();
  const std::vector<double> want_f = file.read_tensor("forces").to_vector<double>();
  for (size_t s = 0; s < 2; ++s) CHECK(energy[s] == doctest::Approx(want_e[s]).epsilon(1e-5));
  const double scale = largest(want_f);
  for (size_t i = 0; i < want_f.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(forces[i] - want_f[i]) <= 1e-4 * scale);
  }
  // An atomic number past the graph's embedding table is the graph's error, naming its node.
  const int64_t saved = numbers[0];
  numbers[0] = 12;
  CHECK(mpigrad_atoms_predict(model, &structures, &e, &f) == MPIGRAD_ERROR_RUNTIME);
  const std::string message = mpigrad_last_error();
  CHECK(message.find("node '/embedding/Gather'") != std::string::npos);
  CHECK(message.find("index out of range") != std::string::npos);
  numbers[0] = saved;
  // Training on PyTorch's own labels: the loss is (nearly) zero at once.
  double loss = -1;
  REQUIRE_MESSAGE(mpigrad_atoms_train_step(model, &structures, &e, &f, &loss) == MPIGRAD_SUCCESS,
                  mpigrad_last_error());
  CHECK(loss >= 0);
  CHECK(loss < 1e-8);
  CHECK(mpigrad_model_destroy(&model) == MPIGRAD_SUCCESS);
}
