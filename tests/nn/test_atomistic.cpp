// Interatomic potentials: SchNet (one energy per structure, independent of the rest of the batch,
// invariant under translation, rotation and atom order, smooth at the cutoff, its forces and
// their second derivatives against float64 finite differences), and ONNX energy models exported
// from PyTorch (tests/data/atomistic, written by make_models.py there): inputs bound by name,
// energy and forces against PyTorch's, PyTorch's parameter names, and the legacy exporter's
// index_add refused with what to do instead.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../error_message.h"
#include "../second_order_check.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/onnx/onnx_energy_model.h"
#include "mpigrad/nn/schnet.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::error_message;

namespace {

const std::string kDataDir = MPIGRAD_SOURCE_DIR "/tests/data/";

// One structure: positions, atomic numbers, and its cell (zeros: a cluster).
struct Structure {
  std::vector<double> positions;
  std::vector<int64_t> numbers;
  std::array<double, 9> cell{};
  bool periodic = false;
};

Structure random_structure(int64_t atoms, bool periodic, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Structure s;
  s.periodic = periodic;
  s.cell = {3.6, 0.0, 0.0, 0.4, 3.3, 0.0, -0.3, 0.5, 3.9};
  for (int64_t a = 0; a < atoms; ++a) {
    for (int c = 0; c < 3; ++c) s.positions.push_back(3.0 * unit(rng));
    s.numbers.push_back(std::vector<int64_t>{1, 6, 8}[size_t(a % 3)]);
  }
  if (!periodic) s.cell = {};
  return s;
}

// The graph of `structures` in that order: every pair closer than `cutoff`, at the periodic
// images (-1..1)^3 for a periodic one (the cells here are larger than the cutoff).
nn::AtomicGraph graph_of(const std::vector<Structure>& structures, double cutoff,
                         core::DType dtype = core::kFloat32) {
  std::vector<double> positions, shifts, cells;
  std::vector<int64_t> numbers, sources, targets, owner;
  int64_t offset = 0;
  for (size_t b = 0; b < structures.size(); ++b) {
    const Structure& s = structures[b];
    const int64_t atoms = int64_t(s.numbers.size());
    const int reach = s.periodic ? 1 : 0;
    for (int64_t t = 0; t < atoms; ++t) {
      for (int64_t src = 0; src < atoms; ++src) {
        for (int n0 = -reach; n0 <= reach; ++n0)
          for (int n1 = -reach; n1 <= reach; ++n1)
            for (int n2 = -reach; n2 <= reach; ++n2) {
              if (src == t && n0 == 0 && n1 == 0 && n2 == 0) continue;
              double shift[3], d2 = 0;
              for (int c = 0; c < 3; ++c) {
                shift[c] = n0 * s.cell[size_t(c)] + n1 * s.cell[size_t(3 + c)] +
                           n2 * s.cell[size_t(6 + c)];
                const double v =
                    s.positions[size_t(3 * t + c)] - s.positions[size_t(3 * src + c)] + shift[c];
                d2 += v * v;
              }
              if (d2 >= cutoff * cutoff) continue;
              sources.push_back(offset + src);
              targets.push_back(offset + t);
              shifts.insert(shifts.end(), shift, shift + 3);
            }
      }
    }
    positions.insert(positions.end(), s.positions.begin(), s.positions.end());
    numbers.insert(numbers.end(), s.numbers.begin(), s.numbers.end());
    cells.insert(cells.end(), s.cell.begin(), s.cell.end());
    for (int64_t a = 0; a < atoms; ++a) owner.push_back(int64_t(b));
    offset += atoms;
  }
  const int64_t edges = int64_t(sources.size());
  std::vector<int64_t> index(sources);
  index.insert(index.end(), targets.begin(), targets.end());
  nn::AtomicGraph graph;
  graph.positions = Tensor::from_vector<double>(positions, {offset, 3}).to(dtype);
  graph.atomic_numbers = Tensor::from_vector<int64_t>(numbers, {offset});
  graph.edge_index = Tensor::from_vector<int64_t>(index, {2, edges});
  graph.edge_shifts = Tensor::from_vector<double>(shifts, {edges, 3}).to(dtype);
  graph.batch = Tensor::from_vector<int64_t>(owner, {offset});
  graph.num_structures = int64_t(structures.size());
  graph.cell = Tensor::from_vector<double>(cells, {graph.num_structures, 3, 3}).to(dtype);
  return graph;
}

std::shared_ptr<nn::SchNet> small_schnet(double cutoff = 2.5, bool share_pair_filters = true) {
  core::Generator generator(3);
  return std::make_shared<nn::SchNet>(nn::SchNetOptions{.hidden = 8,
                                                        .n_rbf = 6,
                                                        .interactions = 2,
                                                        .cutoff = cutoff,
                                                        .share_pair_filters = share_pair_filters},
                                      generator);
}

std::vector<double> energies(nn::AtomisticModel& model, const nn::AtomicGraph& graph) {
  core::NoGradGuard no_grad;
  return model.energy(graph).to(core::kFloat64).to_vector<double>();
}

// A rotation about an oblique axis.
std::array<double, 9> rotation() {
  const double a = 0.7, x = 0.48, y = 0.6, z = 0.64;  // a unit axis
  const double c = std::cos(a), s = std::sin(a), t = 1 - c;
  return {t * x * x + c,     t * x * y - s * z, t * x * z + s * y, t * x * y + s * z, t * y * y + c,
          t * y * z - s * x, t * x * z - s * y, t * y * z + s * x, t * z * z + c};
}

void rotate(std::vector<double>& rows, const std::array<double, 9>& r) {
  for (size_t i = 0; i + 2 < rows.size(); i += 3) {
    const double v[3] = {rows[i], rows[i + 1], rows[i + 2]};
    for (int c = 0; c < 3; ++c) {
      rows[i + size_t(c)] =
          r[size_t(3 * c)] * v[0] + r[size_t(3 * c + 1)] * v[1] + r[size_t(3 * c + 2)] * v[2];
    }
  }
}

}  // namespace

TEST_CASE("SchNet: one energy per structure, each independent of the rest of the batch") {
  auto model = small_schnet();
  const std::vector<Structure> structures = {
      random_structure(5, true, 1), random_structure(3, false, 2), random_structure(7, true, 3)};
  const std::vector<double> together = energies(*model, graph_of(structures, 2.5));
  REQUIRE(together.size() == 3);
  for (size_t b = 0; b < structures.size(); ++b) {
    const std::vector<double> alone = energies(*model, graph_of({structures[b]}, 2.5));
    CHECK(alone[0] == doctest::Approx(together[b]).epsilon(1e-5));
  }
  // Reversed order: the same energies, reversed.
  const std::vector<double> reversed =
      energies(*model, graph_of({structures[2], structures[1], structures[0]}, 2.5));
  CHECK(reversed[0] == doctest::Approx(together[2]).epsilon(1e-5));
  CHECK(reversed[2] == doctest::Approx(together[0]).epsilon(1e-5));
  CHECK(model->num_parameters() > 0);
  CHECK(model->named_parameters().front().first == "embedding.weight");
  CHECK(error_message([&] { (*model)(Tensor()); }).find("call energy(AtomicGraph)") !=
        std::string::npos);
}

TEST_CASE("SchNet: invariant under translation, rotation and the order of the atoms") {
  auto model = small_schnet();
  Structure s = random_structure(6, true, 4);
  const double reference = energies(*model, graph_of({s}, 2.5))[0];
  Structure moved = s;
  for (size_t i = 0; i < moved.positions.size(); ++i) moved.positions[i] += 0.37 * double(i % 3);
  CHECK(energies(*model, graph_of({moved}, 2.5))[0] == doctest::Approx(reference).epsilon(1e-5));
  Structure turned = s;
  rotate(turned.positions, rotation());
  std::vector<double> cell(s.cell.begin(), s.cell.end());
  rotate(cell, rotation());
  std::copy(cell.begin(), cell.end(), turned.cell.begin());
  CHECK(energies(*model, graph_of({turned}, 2.5))[0] == doctest::Approx(reference).epsilon(1e-5));
  Structure shuffled = s;
  for (int64_t a = 0; a < 6; ++a) {
    const int64_t from = 5 - a;
    for (int c = 0; c < 3; ++c) {
      shuffled.positions[size_t(3 * a + c)] = s.positions[size_t(3 * from + c)];
    }
    shuffled.numbers[size_t(a)] = s.numbers[size_t(from)];
  }
  CHECK(energies(*model, graph_of({shuffled}, 2.5))[0] == doctest::Approx(reference).epsilon(1e-5));
}

TEST_CASE("SchNet: an edge fades out at the cutoff, and adds nothing beyond it") {
  auto model = small_schnet(2.0);
  auto pair = [&](double distance) {
    Structure s;
    s.positions = {0, 0, 0, distance, 0, 0};
    s.numbers = {6, 8};
    return energies(*model, graph_of({s}, 10.0))[0];  // the edge listed whatever its length
  };
  const double apart = pair(2.5);
  CHECK(pair(2.0) == doctest::Approx(apart).epsilon(1e-6));
  CHECK(pair(3.7) == doctest::Approx(apart).epsilon(1e-6));
  CHECK(std::abs(pair(1.99) - apart) < 1e-4);  // continuous
  CHECK(std::abs(pair(1.2) - apart) > 1e-3);   // but felt inside
}

TEST_CASE(
    "SchNet: forces, stress inputs and second derivatives against float64 finite "
    "differences") {
  auto model = small_schnet();
  model->to(core::kFloat64);
  const nn::AtomicGraph graph =
      graph_of({random_structure(4, true, 6), random_structure(3, false, 7)}, 2.5, core::kFloat64);
  // d(energies)/d(positions, shifts, cell) and their Hessian-vector products. (The cell is an
  // input SchNet does not read: its gradient must be zero, not missing.)
  test::SecondOrderCheck check;
  check.build = [&](const std::vector<Tensor>& inputs) {
    nn::AtomicGraph g = graph;
    g.positions = inputs[0];
    g.edge_shifts = inputs[1];
    return model->energy(g);
  };
  check.inputs = {graph.positions, graph.edge_shifts};
  check.differentiable = {true, true};
  check.step = 1e-5;
  check.tolerance = 1e-5;
  CHECK(test::check_second_order(check) == "");
  // And through the parameters: the gradient of a force loss reaches every parameter.
  Tensor positions = graph.positions.clone().set_requires_grad(true);
  nn::AtomicGraph g = graph;
  g.positions = positions;
  const Tensor forces =
      -core::grad({core::sum(model->energy(g))}, {positions}, {}, {.create_graph = true})[0];
  core::sum(forces * forces).backward();
  for (const auto& [name, parameter] : model->named_parameters()) {
    if (name == "output.2.bias") continue;  // shifts every energy alike: no force sees it
    CAPTURE(name);
    CHECK(parameter.grad().defined());
  }
}

TEST_CASE("pair_reverse_edges: each edge with its reverse, and unpaired edges alone") {
  nn::AtomicGraph graph =
      graph_of({random_structure(5, true, 8), random_structure(4, false, 9)}, 2.5);
  const int64_t edges = graph.edge_index.size(1);
  REQUIRE(edges > 20);
  const nn::EdgePairs pairs = nn::pair_reverse_edges(graph);
  CHECK(pairs.count * 2 == edges);  // a full list: every edge has its reverse
  const std::vector<int64_t> first = pairs.first.to_vector<int64_t>();
  const std::vector<int64_t> pair = pairs.pair.to_vector<int64_t>();
  const std::vector<int64_t> index = graph.edge_index.to_vector<int64_t>();
  const std::vector<double> shifts = graph.edge_shifts.to_vector<double>();
  std::vector<int> members(size_t(pairs.count), 0);
  for (int64_t e = 0; e < edges; ++e) {
    CAPTURE(e);
    const int64_t f = first[size_t(pair[size_t(e)])];
    ++members[size_t(pair[size_t(e)])];
    CHECK(f <= e);
    if (f == e) continue;
    CHECK(index[size_t(f)] == index[size_t(edges + e)]);  // source of one, target of the other
    CHECK(index[size_t(edges + f)] == index[size_t(e)]);
    for (int c = 0; c < 3; ++c) CHECK(shifts[size_t(3 * f + c)] == -shifts[size_t(3 * e + c)]);
  }
  for (int m : members) CHECK(m == 2);
  // Without edge 0's partner (the list cut short), edge 0 stands alone.
  const int64_t partner = [&] {
    for (int64_t e = 1; e < edges; ++e) {
      if (pair[size_t(e)] == pair[0]) return e;
    }
    return int64_t(-1);
  }();
  REQUIRE(partner > 0);
  std::vector<int64_t> kept;
  for (int64_t e = 0; e < edges; ++e) {
    if (e != partner) kept.push_back(e);
  }
  const Tensor keep = Tensor::from_vector<int64_t>(kept, {edges - 1});
  graph.edge_index = core::index_select(graph.edge_index, 1, keep);
  graph.edge_shifts = core::index_select(graph.edge_shifts, 0, keep);
  const nn::EdgePairs cut = nn::pair_reverse_edges(graph);
  CHECK(cut.count == pairs.count);
  CHECK(cut.pair.to_vector<int64_t>()[0] == 0);
  for (int64_t p : cut.pair.to_vector<int64_t>()) CHECK(p < cut.count);
}

TEST_CASE("SchNet: filters shared by the two directions of a pair give the per-edge model") {
  // The same weights with and without sharing: energies, forces, and the gradient of a force
  // loss in every parameter (the double backward of training) agree to float64 rounding; and
  // the forces' own derivatives match finite differences with sharing on.
  auto shared = small_schnet(2.5, true), per_edge = small_schnet(2.5, false);
  shared->to(core::kFloat64);
  per_edge->to(core::kFloat64);
  const nn::AtomicGraph graph = graph_of(
      {random_structure(5, true, 10), random_structure(4, false, 11)}, 2.5, core::kFloat64);
  const auto run = [&](nn::SchNet& model) {
    model.zero_grad();
    Tensor positions = graph.positions.clone().set_requires_grad(true);
    nn::AtomicGraph g = graph;
    g.positions = positions;
    const Tensor energy = model.energy(g);
    const Tensor forces =
        -core::grad({core::sum(energy)}, {positions}, {}, {.create_graph = true})[0];
    (core::sum(forces * forces * forces) + core::sum(energy)).backward();
    std::vector<double> values = energy.detach().to_vector<double>();
    const std::vector<double> f = forces.detach().to_vector<double>();
    values.insert(values.end(), f.begin(), f.end());
    for (const auto& [name, parameter] : model.named_parameters()) {
      if (!parameter.grad().defined()) continue;
      const std::vector<double> gradient = parameter.grad().to_vector<double>();
      values.insert(values.end(), gradient.begin(), gradient.end());
    }
    return values;
  };
  const std::vector<double> a = run(*shared), b = run(*per_edge);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-10).scale(1e-6));
  }
  test::SecondOrderCheck check;
  check.build = [&](const std::vector<Tensor>& inputs) {
    nn::AtomicGraph g = graph;
    g.positions = inputs[0];
    return shared->energy(g);
  };
  check.inputs = {graph.positions};
  check.differentiable = {true};
  CHECK(test::check_second_order(check) == "");
}

TEST_CASE("OnnxEnergyModel: a potential exported from PyTorch, its inputs bound by name") {
  const core::hdf5::File file = core::hdf5::File::open(kDataDir + "atomistic/reference.h5");
  auto graph = nn::OnnxModel::load(kDataDir + "atomistic/potential.scatter_add.onnx");
  REQUIRE(nn::OnnxEnergyModel::is_energy_model(*graph));
  nn::OnnxEnergyModel model(graph);
  // PyTorch's names, as the file has them.
  std::vector<std::string> names;
  for (const auto& [name, parameter] : model.named_parameters()) names.push_back(name);
  CHECK(std::find(names.begin(), names.end(), "embedding.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "filter.0.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "output.2.bias") != names.end());
  CHECK(model.num_parameters() == graph->num_parameters());

  nn::AtomicGraph g;
  g.positions = file.read_tensor("positions").to(core::kFloat32).set_requires_grad(true);
  g.atomic_numbers = file.read_tensor("atomic_numbers");
  g.edge_index = file.read_tensor("edge_index");
  g.edge_shifts = file.read_tensor("edge_shifts").to(core::kFloat32);
  g.batch = file.read_tensor("batch");
  g.cell = file.read_tensor("cell").to(core::kFloat32);
  g.num_structures = 2;
  const Tensor energy = model.energy(g);
  CHECK(energy.shape() == core::Shape{2});
  const std::vector<double> expected = file.read_tensor("energy").to_vector<double>();
  const std::vector<double> got = energy.to(core::kFloat64).to_vector<double>();
  for (size_t b = 0; b < 2; ++b) CHECK(got[b] == doctest::Approx(expected[b]).epsilon(1e-5));
  const Tensor forces = -core::grad({core::sum(energy)}, {g.positions})[0];
  const std::vector<double> want = file.read_tensor("forces").to_vector<double>();
  const std::vector<double> have = forces.to(core::kFloat64).to_vector<double>();
  double scale = 0;
  for (double f : want) scale = std::max(scale, std::abs(f));
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(have[i] - want[i]) <= 1e-4 * scale);
  }
}

TEST_CASE("OnnxEnergyModel: the legacy exporter's index_add, and a graph that is no potential") {
  const core::hdf5::File file = core::hdf5::File::open(kDataDir + "atomistic/reference.h5");
  nn::OnnxEnergyModel model(nn::OnnxModel::load(kDataDir + "atomistic/potential.index_add.onnx"));
  nn::AtomicGraph g;
  g.positions = file.read_tensor("positions").to(core::kFloat32);
  g.atomic_numbers = file.read_tensor("atomic_numbers");
  g.edge_index = file.read_tensor("edge_index");
  g.edge_shifts = file.read_tensor("edge_shifts").to(core::kFloat32);
  g.batch = file.read_tensor("batch");
  g.cell = file.read_tensor("cell").to(core::kFloat32);
  g.num_structures = 2;
  const std::string message = error_message([&] { model.energy(g); });
  CHECK(message.find("ScatterElements") != std::string::npos);
  CHECK(message.find("reduction 'none' with a repeated index") != std::string::npos);
  CHECK(message.find("export with scatter_add (reduction 'add') or the default (dynamo) "
                     "exporter") != std::string::npos);

  auto mlp = nn::OnnxModel::load(kDataDir + "onnx/mlp.legacy.onnx");
  CHECK_FALSE(nn::OnnxEnergyModel::is_energy_model(*mlp));
  CHECK(error_message([&] { nn::OnnxEnergyModel{mlp}; })
            .find("are not those of an interatomic potential, which are named from positions, "
                  "atomic_numbers, edge_index, edge_shifts, batch, cell") != std::string::npos);
}
