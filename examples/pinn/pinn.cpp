// A physics-informed network for the 2-D Poisson problem, trained on N ranks with mpigrad's
// TrainingStrategy and DDP, its loss built from the network's own second derivatives:
//
//   -(u_xx + u_yy) = f  on (0, 1)^2,   u = 0 on the boundary,
//   f = 2 pi^2 sin(pi x) sin(pi y),     exact solution u* = sin(pi x) sin(pi y).
//
// The network u(x, y) is an MLP with tanh (ReLU's second derivative is zero almost everywhere).
// Each step takes interior and boundary collocation points, computes du/dx with create_graph
// and differentiates it again for the Laplacian (core::grad, a double backward), and trains on
//   loss = mean(residual^2) + boundary_weight * mean(u^2 on the boundary).
// Each rank draws its own points (an R2 low-discrepancy sequence, rank-interleaved, so any rank
// count covers the same sequence), and DDP averages the gradients.
//
//   mpirun -np 2 build/examples/pinn [--steps 5000] [--points 256] [--lr 2e-3]
//                                    [--save-init weights.h5] [--csv loss.csv]
//
// Rank 0 prints the loss and, at the end, the relative L2 and max errors against u* on a
// 101 x 101 grid. --save-init writes the initial weights as a checkpoint (/model/<name>, PyTorch's
// names and layouts), from which benchmarks/pinn/pinn_torch.py starts the same network in
// PyTorch on the same points; --csv writes the loss (the mean over ranks) of every step.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "mpigrad/mpigrad.h"

namespace {

using namespace mpigrad;  // NOLINT: an example reads best without prefixes
using core::Tensor;

constexpr double kPi = 3.14159265358979323846;

struct Options {
  int64_t steps = 5000;
  int64_t points = 256;  // interior points per rank and step; a quarter as many on the boundary
  double lr = 2e-3;
  double boundary_weight = 10.0;
  std::string save_init, csv;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--steps")
      options.steps = std::stoll(value);
    else if (key == "--points")
      options.points = std::stoll(value);
    else if (key == "--lr")
      options.lr = std::stod(value);
    else if (key == "--save-init")
      options.save_init = value;
    else if (key == "--csv")
      options.csv = value;
    else
      core::fail("pinn: unknown option ", key, " (see the top of examples/pinn/pinn.cpp)");
  }
  MPIGRAD_CHECK(options.steps >= 1 && options.points >= 4, "pinn: --steps >= 1, --points >= 4");
  return options;
}

// Point k of the R2 sequence in the unit square (Roberts 2018): well spread for any count.
std::pair<double, double> r2_point(int64_t k) {
  constexpr double kA1 = 0.7548776662466927, kA2 = 0.5698402909980532;  // 1/g, 1/g^2
  const double x = std::fmod(0.5 + kA1 * double(k + 1), 1.0);
  const double y = std::fmod(0.5 + kA2 * double(k + 1), 1.0);
  return {x, y};
}

// This rank's points of `step`: interior [n, 2] and boundary [n / 4, 2] (each boundary point on
// one of the four sides, in turn), from the sequence's block for the step.
data::Batch collocation(int64_t step, int64_t n, int rank, int ranks) {
  std::vector<float> interior, boundary;
  const int64_t per_step = n * ranks;
  for (int64_t i = 0; i < n; ++i) {
    const auto [x, y] = r2_point(step * per_step + i * ranks + rank);
    interior.insert(interior.end(), {float(x), float(y)});
  }
  for (int64_t i = 0; i < n / 4; ++i) {
    const int64_t k = step * per_step + i * ranks + rank;
    const double t = r2_point(k).first;
    const float side[4][2] = {{float(t), 0.f}, {float(t), 1.f}, {0.f, float(t)}, {1.f, float(t)}};
    boundary.insert(boundary.end(), {side[k % 4][0], side[k % 4][1]});
  }
  data::Batch batch;
  batch.set("interior", Tensor::from_vector(interior, {n, 2}));
  batch.set("boundary", Tensor::from_vector(boundary, {n / 4, 2}));
  batch.indices.resize(size_t(n));
  std::iota(batch.indices.begin(), batch.indices.end(), int64_t(0));
  return batch;
}

std::shared_ptr<nn::Sequential> make_network(uint64_t seed) {
  core::Generator generator(seed);
  auto model = std::make_shared<nn::Sequential>();
  int64_t width = 2;
  for (int layer = 0; layer < 3; ++layer) {
    model->push_back(std::make_shared<nn::Linear>(width, 32, generator));
    model->push_back(std::make_shared<nn::Tanh>());
    width = 32;
  }
  model->push_back(std::make_shared<nn::Linear>(width, 1, generator));
  return model;
}

// f(x, y) = 2 pi^2 sin(pi x) sin(pi y), the source term, for the points [n, 2].
Tensor source(const Tensor& points) {
  core::NoGradGuard no_grad;
  const Tensor x = points.select(1, 0), y = points.select(1, 1);
  return 2 * kPi * kPi * core::sin(kPi * x) * core::sin(kPi * y);
}

// The PINN loss of `model` on one batch of collocation points: the Laplacian is the trace of
// the Hessian of u, each diagonal entry a derivative of du/dx computed with create_graph.
Tensor pinn_loss(nn::Module& model, const data::Batch& batch, double boundary_weight) {
  Tensor points = batch["interior"].detach();
  points.set_requires_grad(true);
  const Tensor u = model(points);
  const Tensor du = core::grad({core::sum(u)}, {points}, {}, {.create_graph = true})[0];
  const Tensor u_xx =
      core::grad({core::sum(du.select(1, 0))}, {points}, {}, {.create_graph = true})[0].select(1,
                                                                                               0);
  const Tensor u_yy =
      core::grad({core::sum(du.select(1, 1))}, {points}, {}, {.create_graph = true})[0].select(1,
                                                                                               1);
  const Tensor residual = u_xx + u_yy + source(batch["interior"]);
  const Tensor on_boundary = model(batch["boundary"]);
  return core::mean(residual * residual) + boundary_weight * core::mean(on_boundary * on_boundary);
}

// Relative L2 and max errors against u* on a 101 x 101 grid (every rank the same).
std::pair<double, double> errors(nn::Module& model) {
  core::NoGradGuard no_grad;
  std::vector<float> grid;
  std::vector<double> exact;
  for (int i = 0; i <= 100; ++i) {
    for (int j = 0; j <= 100; ++j) {
      const double x = i / 100.0, y = j / 100.0;
      grid.insert(grid.end(), {float(x), float(y)});
      exact.push_back(std::sin(kPi * x) * std::sin(kPi * y));
    }
  }
  const std::vector<float> u =
      model(Tensor::from_vector(grid, {int64_t(exact.size()), 2})).to_vector<float>();
  double squared = 0, norm = 0, worst = 0;
  for (size_t k = 0; k < exact.size(); ++k) {
    const double d = double(u[k]) - exact[k];
    squared += d * d;
    norm += exact[k] * exact[k];
    worst = std::max(worst, std::abs(d));
  }
  return {std::sqrt(squared / norm), worst};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    launch::DistributedManager manager = launch::DistributedManager::initialize(&argc, &argv);
    const Options options = parse(argc, argv);
    const int rank = manager.rank(), ranks = manager.world_size();
    auto model = make_network(7);  // the same weights on every rank (DDP checks they agree)
    if (rank == 0 && !options.save_init.empty()) {
      nn::save_checkpoint(options.save_init, *model, nullptr, nullptr, 0, 0, ranks);
    }
    nn::Adam adam(model->parameters(), nn::AdamOptions{.lr = options.lr});
    auto ddp = std::make_shared<launch::DDPHook>();
    launch::TrainingStrategy strategy(
        {model.get()}, {&adam},
        [&](nn::Module& m, const data::Batch& batch) {
          return pinn_loss(m, batch, options.boundary_weight);
        },
        nullptr, manager, {ddp}, 1);
    std::ofstream csv;
    if (rank == 0 && !options.csv.empty()) {
      csv.open(options.csv);
      csv << "step,loss\n";
    }
    // Stepped one batch at a time: the points are drawn here, not read from a loader.
    strategy.begin();
    for (int64_t step = 0; step < options.steps; ++step) {
      data::Batch batch = collocation(step, options.points, rank, ranks);
      strategy.train_batch(batch);
      Tensor loss = strategy.context().loss.detach().reshape({1}).to(core::kFloat64);
      manager.world().all_reduce(loss, launch::ReduceOp::Avg);
      if (rank != 0) continue;
      const double value = loss.item<double>();
      if (csv.is_open()) csv << step + 1 << ',' << value << '\n';
      if ((step + 1) % 500 == 0 || step == 0) {
        std::printf("step %lld  loss %.6g\n", static_cast<long long>(step + 1), value);
        std::fflush(stdout);
      }
    }
    strategy.end();
    const auto [l2, worst] = errors(*model);
    if (rank == 0) {
      std::printf(
          "pinn: %d rank(s), %lld steps of %lld interior points per rank: relative L2 error "
          "%.3e, max error %.3e against sin(pi x) sin(pi y)\n",
          ranks, static_cast<long long>(options.steps), static_cast<long long>(options.points), l2,
          worst);
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pinn: %s\n", error.what());
    return 1;
  }
}
