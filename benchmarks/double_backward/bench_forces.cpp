// What training on forces costs: a force-training step (energy and forces in the loss, so the
// backward runs through the gradient, a double backward) against an energy-only step, on the same
// SchNet-like graph network, timed alternately in one run. PyTorch's ratio for such a pair is
// about 2.5x (issue 34); benchmarks/double_backward/bench_forces_torch.py times the same model.
//
//   build/benchmarks/double_backward/mpigrad-bench-forces [--atoms 64] [--hidden 64]
//                                                         [--steps 50] [--json FILE]
//
// The model: edge vectors by index_select of the positions, their lengths, a Gaussian radial
// basis (16), a Linear + tanh message per edge, index_add onto the receiving atoms, a Linear,
// SiLU, Linear atom energy, summed. The atoms sit in a cube at liquid-like density, and every
// pair closer than the cutoff is an edge (both directions). Each step: zero_grad, forward, loss,
// backward and an SGD update; one thread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/mpigrad.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

struct Options {
  int64_t atoms = 64, hidden = 64, steps = 50;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--atoms")
      o.atoms = std::stoll(value);
    else if (key == "--hidden")
      o.hidden = std::stoll(value);
    else if (key == "--steps")
      o.steps = std::stoll(value);
    else if (key == "--json")
      o.json = value;
    else
      core::fail("mpigrad-bench-forces: unknown option ", key);
  }
  MPIGRAD_CHECK(o.atoms >= 2 && o.hidden >= 1 && o.steps >= 1,
                "mpigrad-bench-forces: --atoms >= 2, --hidden >= 1, --steps >= 1");
  return o;
}

constexpr double kCutoff = 2.5;
constexpr int64_t kBasis = 16;

struct Graph {
  Tensor positions;  // [V, 3]
  Tensor src, dst;   // [E] int64
};

// Atoms on a jittered grid at about 0.1 atoms per unit volume, and the pairs within the cutoff.
Graph cluster(int64_t atoms) {
  core::Generator generator(3);
  const int64_t side = int64_t(std::ceil(std::cbrt(double(atoms))));
  const double spacing = 1.25;  // about 30 neighbours within the cutoff, as in a liquid
  std::vector<float> p;
  Tensor jitter = core::rand({atoms, 3}, generator) * 0.6 - 0.3;
  const std::vector<float> j = jitter.to_vector<float>();
  for (int64_t a = 0; a < atoms; ++a) {
    const int64_t x = a % side, y = (a / side) % side, z = a / (side * side);
    p.insert(p.end(),
             {float(x * spacing) + j[size_t(3 * a)], float(y * spacing) + j[size_t(3 * a + 1)],
              float(z * spacing) + j[size_t(3 * a + 2)]});
  }
  std::vector<int64_t> src, dst;
  for (int64_t a = 0; a < atoms; ++a) {
    for (int64_t b = 0; b < atoms; ++b) {
      double d2 = 0;
      for (int k = 0; k < 3; ++k) {
        const double d = double(p[size_t(3 * a + k)]) - double(p[size_t(3 * b + k)]);
        d2 += d * d;
      }
      if (a != b && d2 < kCutoff * kCutoff) {
        src.push_back(a);
        dst.push_back(b);
      }
    }
  }
  return {Tensor::from_vector(p, {atoms, 3}), Tensor::from_vector(src, {int64_t(src.size())}),
          Tensor::from_vector(dst, {int64_t(dst.size())})};
}

struct Potential {
  std::shared_ptr<nn::Linear> embed, update, out;
  Tensor centers;
  explicit Potential(int64_t hidden) {
    core::Generator generator(5);
    embed = std::make_shared<nn::Linear>(kBasis, hidden, generator);
    update = std::make_shared<nn::Linear>(hidden, hidden, generator);
    out = std::make_shared<nn::Linear>(hidden, 1, generator);
    std::vector<float> c;
    for (int64_t k = 0; k < kBasis; ++k)
      c.push_back(float(0.5 + 2.0 * double(k) / double(kBasis - 1)));
    centers = Tensor::from_vector(c, {1, kBasis});
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all;
    for (const auto& layer : {embed, update, out}) {
      for (const Tensor& t : layer->parameters()) all.push_back(t);
    }
    return all;
  }
  Tensor energy(const Tensor& positions, const Graph& g) const {
    const Tensor vec =
        core::index_select(positions, 0, g.src) - core::index_select(positions, 0, g.dst);
    const Tensor dist = core::sqrt(core::sum(vec * vec, {1}, true) + 1e-6);  // [E, 1]
    const Tensor shifted = dist - centers;
    const Tensor rbf = core::exp(-4.0 * shifted * shifted);  // [E, K]
    const Tensor message = core::tanh((*embed)(rbf));        // [E, H]
    const Tensor atoms = core::zeros({positions.size(0), message.size(1)});
    const Tensor aggregated = core::index_add(atoms, 0, g.dst, message);  // [V, H]
    return core::sum((*out)(core::silu((*update)(aggregated))));
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    core::initialize_cpu_runtime();  // first: it applies the default count, which would win
    core::set_num_threads(1);
    const Graph graph = cluster(options.atoms);
    Potential potential(options.hidden);
    nn::SGD sgd(potential.parameters(), nn::SGDOptions{.lr = 1e-4});
    const Tensor target = Tensor::scalar(1.0f);

    auto energy_step = [&] {
      sgd.zero_grad();
      const Tensor e = potential.energy(graph.positions, graph);
      const Tensor error = e - target;
      (error * error).backward();
      sgd.step();
    };
    auto force_step = [&] {
      sgd.zero_grad();
      Tensor positions = graph.positions.detach();
      positions.set_requires_grad(true);
      const Tensor e = potential.energy(positions, graph);
      const Tensor forces = -core::grad({e}, {positions}, {}, {.create_graph = true})[0];
      const Tensor error = e - target;
      (error * error + 10.0 * core::mean(forces * forces)).backward();
      sgd.step();
    };
    // Alternating rounds: both arms see the same load and caches.
    std::vector<double> energy_times, force_times;
    for (int round = 0; round < 7; ++round) {
      energy_times.push_back(bench::seconds_per_call(energy_step, int(options.steps), 1));
      force_times.push_back(bench::seconds_per_call(force_step, int(options.steps), 1));
    }
    std::sort(energy_times.begin(), energy_times.end());
    std::sort(force_times.begin(), force_times.end());
    const double energy_ms = energy_times[3] * 1e3, force_ms = force_times[3] * 1e3;
    bench::Results results;
    results.add_text("graph", std::to_string(options.atoms) + " atoms, " +
                                  std::to_string(graph.src.numel()) + " edges, hidden " +
                                  std::to_string(options.hidden));
    results.add("energy_step_ms", energy_ms, "ms", "median of 7 rounds");
    results.add("force_step_ms", force_ms, "ms", "energy + forces in the loss");
    results.add("force_over_energy", force_ms / energy_ms, "x", "PyTorch's pair: about 2.5x");
    return results.report(options.json, "mpigrad-bench-forces");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpigrad-bench-forces: %s\n", error.what());
    return 1;
  }
}
