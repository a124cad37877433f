// The energy_force step of interatomic potentials (launch/train/atomistic_steps.h), under
// mpirun -np 1 and 2: forces and stress by autograd against a pair potential's analytic forces
// and virial (edges that cross a triclinic cell, so the strain must reach the shifts) and
// against finite differences of SchNet's strained energy; the loss is the documented mean over
// structures (mse per atom, huber, stress) with the weights switching at their step; N ranks take
// exactly one rank's step on the same global batch, split unevenly; and validation's force MAE
// and RMSE over all atoms are exact across ranks and padding.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../error_message.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/neighbor_list.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/atomistic_steps.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/hooks/derived_metrics_hook.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/optim/sgd.h"
#include "mpigrad/nn/schnet.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

namespace {

constexpr double kCutoff = 2.4;

struct Structure {
  std::vector<double> positions;
  std::vector<int64_t> numbers;
  std::array<double, 9> cell{};
  std::array<bool, 3> pbc{};
  // Targets: a Morse potential's energy, forces and virial stress.
  double energy = 0;
  std::vector<double> forces;
  std::array<double, 9> stress{};
};

// phi(r) = (1 - e^{-1.5 (r - 1.2)})^2 - 1, and its derivative.
double morse(double r) {
  const double e = std::exp(-1.5 * (r - 1.2));
  return (1 - e) * (1 - e) - 1;
}
double morse_slope(double r) {
  const double e = std::exp(-1.5 * (r - 1.2));
  return 2 * (1 - e) * 1.5 * e;
}

// Energy 1/2 sum over directed edges of phi, its forces, and its virial / volume.
void label(Structure& s) {
  const data::StructureEdges edges =
      data::radius_graph(s.positions, s.cell, s.pbc, {.cutoff = kCutoff});
  const int64_t atoms = int64_t(s.numbers.size());
  s.energy = 0;
  s.forces.assign(size_t(3 * atoms), 0.0);
  s.stress = {};
  for (int64_t e = 0; e < edges.size(); ++e) {
    const int64_t t = edges.target[size_t(e)], src = edges.source[size_t(e)];
    double v[3], r = 0;
    for (int c = 0; c < 3; ++c) {
      v[c] = s.positions[size_t(3 * t + c)] - s.positions[size_t(3 * src + c)] +
             edges.shift[size_t(3 * e + c)];
      r += v[c] * v[c];
    }
    r = std::sqrt(r);
    s.energy += 0.5 * morse(r);
    const double slope = 0.5 * morse_slope(r);
    for (int c = 0; c < 3; ++c) {
      s.forces[size_t(3 * t + c)] -= slope * v[c] / r;
      s.forces[size_t(3 * src + c)] += slope * v[c] / r;
      for (int d = 0; d < 3; ++d) s.stress[size_t(3 * c + d)] += slope * v[c] * v[d] / r;
    }
  }
  if (s.pbc[0]) {
    const std::array<double, 9>& m = s.cell;
    const double volume =
        std::abs(m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
                 m[2] * (m[3] * m[7] - m[4] * m[6]));
    for (double& x : s.stress) x /= volume;
  } else {
    s.stress = {};
  }
}

// Small periodic triclinic crystals (their edges cross the cell) and clusters, of 2 to 6 atoms.
std::vector<Structure> structures(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Structure> out;
  for (int64_t i = 0; i < count; ++i) {
    Structure s;
    const int64_t atoms = 2 + int64_t(rng() % 5);
    const bool periodic = i % 2 == 0;
    s.cell = {2.6, 0.0, 0.0, 0.5, 2.5, 0.0, -0.3, 0.4, 2.8};
    if (periodic) {
      s.pbc = {true, true, true};
    } else {
      s.cell = {};
    }
    // At least 0.9 apart, images included: moderate forces.
    for (int64_t a = 0; a < atoms; ++a) {
      while (true) {
        std::vector<double> trial = s.positions;
        for (int c = 0; c < 3; ++c) trial.push_back(2.4 * unit(rng));
        if (data::radius_graph(trial, s.cell, s.pbc, {.cutoff = 0.9}).size() == 0) {
          s.positions = trial;
          break;
        }
      }
      s.numbers.push_back(a % 2 == 0 ? 6 : 8);
    }
    label(s);
    out.push_back(s);
  }
  return out;
}

// A ragged batch of `picked` (the layout of docs/interatomic-potentials.md), its neighbor list
// built by the loaders' transform.
data::Batch batch_of(const std::vector<Structure>& all, const std::vector<int64_t>& picked) {
  std::vector<float> positions, forces, cells, energies, stresses;
  std::vector<uint8_t> pbc;
  std::vector<int64_t> numbers, owner, pointer = {0}, counts;
  for (size_t b = 0; b < picked.size(); ++b) {
    const Structure& s = all[size_t(picked[b])];
    for (double x : s.positions) positions.push_back(float(x));
    for (double f : s.forces) forces.push_back(float(f));
    for (double c : s.cell) cells.push_back(float(c));
    for (double x : s.stress) stresses.push_back(float(x));
    for (bool p : s.pbc) pbc.push_back(p ? 1 : 0);
    energies.push_back(float(s.energy));
    numbers.insert(numbers.end(), s.numbers.begin(), s.numbers.end());
    for (size_t a = 0; a < s.numbers.size(); ++a) owner.push_back(int64_t(b));
    counts.push_back(int64_t(s.numbers.size()));
    pointer.push_back(pointer.back() + counts.back());
  }
  const int64_t structures = int64_t(picked.size()), atoms = pointer.back();
  data::Batch batch;
  batch.indices = picked;
  batch.set("positions", Tensor::from_vector<float>(positions, {atoms, 3}));
  batch.set("atomic_numbers", Tensor::from_vector<int64_t>(numbers, {atoms}));
  batch.set("batch", Tensor::from_vector<int64_t>(owner, {atoms}));
  batch.set("atoms_ptr", Tensor::from_vector<int64_t>(pointer, {structures + 1}));
  batch.set("num_atoms", Tensor::from_vector<int64_t>(counts, {structures}));
  batch.set("energy", Tensor::from_vector<float>(energies, {structures}));
  batch.set("forces", Tensor::from_vector<float>(forces, {atoms, 3}));
  batch.set("cell", Tensor::from_vector<float>(cells, {structures, 3, 3}));
  batch.set("pbc", Tensor::from_vector<uint8_t>(pbc, {structures, 3}).to(core::kBool));
  batch.set("stress", Tensor::from_vector<float>(stresses, {structures, 3, 3}));
  return data::radius_graph_transform({.cutoff = kCutoff})(std::move(batch));
}

// The structures as a Dataset, for loaders.
class StructureDataset final : public data::Dataset {
 public:
  explicit StructureDataset(std::vector<Structure> all) : all_(std::move(all)) {}
  int64_t size() const override { return int64_t(all_.size()); }
  const std::vector<data::FieldInfo>& fields() const override { return fields_; }
  data::Batch get_batch(std::span<const int64_t> indices) const override {
    return batch_of(all_, std::vector<int64_t>(indices.begin(), indices.end()));
  }
  std::string describe() const override { return "test structures"; }

 private:
  std::vector<Structure> all_;
  std::vector<data::FieldInfo> fields_;
};

// The Morse potential itself as a model: 1/2 sum over edges of phi(|r|), per structure.
class MorseModel final : public nn::AtomisticModel {
 public:
  Tensor energy(const nn::AtomicGraph& graph) override {
    const Tensor vectors = nn::edge_vectors(graph);
    const Tensor r = core::sqrt(core::sum(vectors * vectors, {1}));
    const Tensor e = core::exp((r - 1.2) * -1.5);
    const Tensor phi = (1.0 - e) * (1.0 - e) - 1.0;
    const Tensor zeros =
        core::zeros({graph.num_structures}, core::TensorOptions().dtype(phi.dtype()));
    const Tensor owner = core::index_select(graph.batch, 0, graph.edge_index.select(0, 1));
    return core::index_add(zeros, 0, owner, phi * 0.5);
  }
  std::string type_name() const override { return "MorseModel"; }
};

std::shared_ptr<nn::SchNet> schnet() {
  core::Generator generator(11);
  return std::make_shared<nn::SchNet>(
      nn::SchNetOptions{.hidden = 8, .n_rbf = 6, .interactions = 2, .cutoff = kCutoff}, generator);
}

std::vector<double> values(const Tensor& t) {
  return t.to(core::kFloat64).to_vector<double>();
}

double largest(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace

TEST_CASE("forces and stress of a pair potential by autograd: its analytic forces and virial") {
  const std::vector<Structure> all = structures(6, 1);
  const data::Batch batch = batch_of(all, {0, 1, 2, 3, 4, 5});
  MorseModel model;
  const launch::EnergyForcePrediction p =
      launch::predict_energy_forces(model, batch, true, true, false);
  const std::vector<double> energy = values(p.energy), forces = values(p.forces),
                            stress = values(p.stress);
  size_t atom = 0;
  for (size_t b = 0; b < all.size(); ++b) {
    CAPTURE(b);
    CHECK(energy[b] == doctest::Approx(all[b].energy).epsilon(1e-4));
    for (double f : all[b].forces)
      CHECK(forces[atom++] == doctest::Approx(f).epsilon(1e-3).scale(1));
    for (int k = 0; k < 9; ++k) {
      CHECK(stress[9 * b + size_t(k)] ==
            doctest::Approx(all[b].stress[size_t(k)]).epsilon(1e-3).scale(1e-3));
    }
  }
  CHECK(largest(stress) > 1e-2);  // the check has something to check
  // Without a cell (clusters), stress is zero, not a division by zero.
  CHECK(stress[9] == 0.0);
}

TEST_CASE("SchNet's stress: the derivative of its energy under strain, over the volume") {
  const std::vector<Structure> all = structures(2, 3);
  const data::Batch batch = batch_of(all, {0});
  auto model = schnet();
  model->to(core::kFloat64);
  data::Batch wide = batch;
  for (const char* name : {"positions", "cell", "edge_shifts"}) {
    wide.set(name, batch[name].to(core::kFloat64));
  }
  const launch::EnergyForcePrediction p =
      launch::predict_energy_forces(*model, wide, true, true, false);
  const std::vector<double> stress = values(p.stress);
  const std::array<double, 9>& m = all[0].cell;
  const double volume =
      std::abs(m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
               m[2] * (m[3] * m[7] - m[4] * m[6]));
  // E with every row vector (positions, cell rows, shifts) times I + h (e_ij + e_ji) / 2.
  const auto strained = [&](int i, int j, double h) {
    double deformation[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    deformation[3 * i + j] += h / 2;
    deformation[3 * j + i] += h / 2;
    nn::AtomicGraph graph = launch::atomic_graph(wide);
    for (Tensor* rows : {&graph.positions, &graph.cell, &graph.edge_shifts}) {
      std::vector<double> v = values(*rows);
      for (size_t r = 0; r + 2 < v.size(); r += 3) {
        const double x[3] = {v[r], v[r + 1], v[r + 2]};
        for (int c = 0; c < 3; ++c) {
          v[r + size_t(c)] =
              x[0] * deformation[c] + x[1] * deformation[3 + c] + x[2] * deformation[6 + c];
        }
      }
      *rows = Tensor::from_vector<double>(v, rows->shape());
    }
    core::NoGradGuard no_grad;
    return model->energy(graph).item<double>();
  };
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      const double h = 1e-5;
      const double numeric = (strained(i, j, h) - strained(i, j, -h)) / (2 * h) / volume;
      CAPTURE(i);
      CAPTURE(j);
      CHECK(stress[size_t(3 * i + j)] == doctest::Approx(numeric).epsilon(1e-5).scale(1e-6));
    }
  }
}

TEST_CASE("energy_force_step: the documented means over structures, and the weights' switch") {
  const std::vector<Structure> all = structures(5, 5);
  const data::Batch batch = batch_of(all, {0, 1, 2, 3, 4});
  auto model = schnet();
  launch::EnergyForceLossOptions options;
  options.weights = {2.0, 3.0, 5.0};
  const launch::EnergyForcePrediction p =
      launch::predict_energy_forces(*model, batch, true, true, false);
  const std::vector<double> energy = values(p.energy), forces = values(p.forces),
                            stress = values(p.stress);
  // By hand, per structure.
  const auto expected = [&](const launch::EnergyForceLossOptions& o,
                            const launch::EnergyForceWeights& w) {
    const auto score = [&](double r) {
      if (o.kind == launch::ErrorKind::Mse) return r * r;
      const double a = std::abs(r), d = o.huber_delta;
      return a < d ? 0.5 * r * r : d * (a - 0.5 * d);
    };
    double e = 0, f = 0, s = 0, cells = 0;
    size_t atom = 0;
    for (size_t b = 0; b < all.size(); ++b) {
      const double n = double(all[b].numbers.size());
      const double residual = float(energy[b]) - float(all[b].energy);
      e += score(o.per_atom_energy ? residual / n : residual);
      double fb = 0;
      for (size_t k = 0; k < all[b].forces.size(); ++k, ++atom) {
        fb += score(forces[atom] - float(all[b].forces[k]));
      }
      f += fb / (3 * n);
      if (all[b].pbc[0]) {
        double sb = 0;
        for (int k = 0; k < 9; ++k)
          sb += score(stress[9 * b + size_t(k)] - float(all[b].stress[size_t(k)]));
        s += sb / 9;
        cells += 1;
      }
    }
    const double structures = double(all.size());
    return w.energy * e / structures + w.force * f / structures + w.stress * s / cells;
  };
  const double mse = launch::energy_force_step(options, {})(*model, batch).item<double>();
  CHECK(mse == doctest::Approx(expected(options, options.weights)).epsilon(1e-4));

  launch::EnergyForceLossOptions huber = options;
  huber.kind = launch::ErrorKind::Huber;
  huber.huber_delta = 0.05;
  huber.per_atom_energy = false;
  const double h = launch::energy_force_step(huber, {})(*model, batch).item<double>();
  CHECK(h == doctest::Approx(expected(huber, huber.weights)).epsilon(1e-4));

  // From step 7 on: energy 0.5, forces unchanged (-1), stress 0.
  launch::EnergyForceLossOptions switching = options;
  switching.switch_step = 7;
  switching.weights_after = {0.5, -1.0, 0.0};
  int64_t step = 6;
  launch::StepFunction loss = launch::energy_force_step(switching, {nullptr, [&] { return step; }});
  CHECK(loss(*model, batch).item<double>() == doctest::Approx(mse).epsilon(1e-6));
  step = 7;
  CHECK(loss(*model, batch).item<double>() ==
        doctest::Approx(expected(switching, {0.5, 3.0, 0.0})).epsilon(1e-4));
  CHECK(switching.weights_at(100).force == 3.0);

  // A batch without the targets a weight asks for: one error naming the field.
  data::Batch unlabeled = batch;
  unlabeled.fields.erase(std::find_if(unlabeled.fields.begin(), unlabeled.fields.end(),
                                      [](const auto& f) { return f.first == "stress"; }));
  CHECK(test::error_message([&] { launch::energy_force_step(options, {})(*model, unlabeled); }) ==
        "energy_force: the batch has no field 'stress' ([loss] stress_weight is set)");
}

TEST_CASE("N ranks take one rank's step on the same global batch, split unevenly") {
  auto manager = launch::DistributedManager::initialize();
  const int ranks = manager.world_size(), rank = manager.rank();
  const std::vector<Structure> all = structures(5, 9);
  // Rank r's share of the 5 structures: 3 and 2 on two ranks.
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < 5; ++i) {
    if ((ranks == 1) || (rank == 0 ? i < 3 : i >= 3)) mine.push_back(i);
  }
  launch::EnergyForceLossOptions options;
  options.weights = {1.0, 10.0, 2.0};

  // One process, the whole batch.
  auto reference = schnet();
  nn::SGD reference_sgd(reference->parameters(), nn::SGDOptions{.lr = 0.05});
  const double reference_loss = [&] {
    Tensor loss =
        launch::energy_force_step(options, {})(*reference, batch_of(all, {0, 1, 2, 3, 4}));
    loss.backward();
    return loss.item<double>();
  }();
  reference_sgd.step();

  // Every rank its share, through the strategy with DDP. (No clipping: it would hide a gradient
  // off by a factor.)
  auto model = schnet();
  nn::SGD sgd(model->parameters(), nn::SGDOptions{.lr = 0.05});
  launch::StepFunction step =
      launch::energy_force_step(options, {ranks > 1 ? &manager.world() : nullptr, nullptr});
  launch::TrainingStrategy strategy({model.get()}, {&sgd}, step, nullptr, manager,
                                    {std::make_shared<launch::DDPHook>()}, 1);
  strategy.begin();
  data::Batch batch = batch_of(all, mine);
  strategy.train_batch(batch);
  // The logged loss, averaged over ranks, is the global one.
  Tensor loss = Tensor::from_vector<double>({strategy.context().loss.item<double>()}, {1});
  if (ranks > 1) manager.world().all_reduce(loss, launch::ReduceOp::Sum);
  strategy.end();
  CHECK(loss.item<double>() / ranks == doctest::Approx(reference_loss).epsilon(1e-5));
  const auto expected = reference->named_parameters();
  const auto got = model->named_parameters();
  REQUIRE(expected.size() == got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(got[i].first);
    const std::vector<double> a = values(got[i].second), b = values(expected[i].second);
    double worst = 0;
    for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(a[k] - b[k]));
    CHECK(worst <= 1e-6 * std::max(1.0, largest(b)));
  }
}

TEST_CASE("validation: energy, force and stress errors exact over all atoms, across ranks") {
  auto manager = launch::DistributedManager::initialize();
  const std::vector<Structure> all = structures(7, 13);  // odd: two ranks pad one repeat
  auto dataset = std::make_shared<StructureDataset>(all);
  data::DataLoaderOptions options;
  options.batch_size = 2;
  options.num_replicas = manager.world_size();
  options.rank = manager.rank();
  data::DataLoader loader(dataset, options);
  auto model = schnet();
  nn::SGD sgd(model->parameters(), nn::SGDOptions{.lr = 0.05});
  launch::EnergyForceLossOptions loss;
  loss.weights = {1.0, 1.0, 1.0};
  launch::TrainingStrategy strategy({model.get()}, {&sgd}, launch::energy_force_step(loss, {}),
                                    launch::energy_force_metrics(loss), manager, {}, 1);
  strategy.context().metrics = strategy.validate(loader);
  launch::DerivedMetricsHook derived(launch::energy_force_derived_metrics(loss));
  derived.on(launch::HookStage::AfterValidation, strategy.context());
  const std::map<std::string, double>& metrics = strategy.context().metrics;

  // Directly, on this process, over every structure once.
  std::vector<int64_t> every = {0, 1, 2, 3, 4, 5, 6};
  const launch::EnergyForcePrediction p =
      launch::predict_energy_forces(*model, batch_of(all, every), true, true, false);
  const std::vector<double> energy = values(p.energy), forces = values(p.forces),
                            stress = values(p.stress);
  double energy_abs = 0, energy_sq = 0, force_abs = 0, force_sq = 0, stress_abs = 0;
  double components = 0, stress_components = 0;
  size_t atom = 0;
  for (size_t b = 0; b < all.size(); ++b) {
    const double n = double(all[b].numbers.size());
    const double e = (energy[b] - float(all[b].energy)) / n;
    energy_abs += std::abs(e);
    energy_sq += e * e;
    for (double f : all[b].forces) {
      const double r = forces[atom++] - float(f);
      force_abs += std::abs(r);
      force_sq += r * r;
      components += 1;
    }
    if (all[b].pbc[0]) {
      for (int k = 0; k < 9; ++k) {
        stress_abs += std::abs(stress[9 * b + size_t(k)] - float(all[b].stress[size_t(k)]));
      }
      stress_components += 9;
    }
  }
  CHECK(metrics.at("val_samples") == 7.0);
  CHECK(metrics.at("val_energy_mae_per_atom") == doctest::Approx(energy_abs / 7).epsilon(1e-5));
  CHECK(metrics.at("val_energy_rmse_per_atom") ==
        doctest::Approx(std::sqrt(energy_sq / 7)).epsilon(1e-5));
  CHECK(metrics.at("val_force_mae") == doctest::Approx(force_abs / components).epsilon(1e-5));
  CHECK(metrics.at("val_force_rmse") ==
        doctest::Approx(std::sqrt(force_sq / components)).epsilon(1e-5));
  CHECK(metrics.at("val_stress_mae") ==
        doctest::Approx(stress_abs / stress_components).epsilon(1e-5));
  CHECK(metrics.count("val_force_abs_error_sum") == 0);  // the parts are gone
  CHECK(metrics.count("val_loss") == 1);
}
