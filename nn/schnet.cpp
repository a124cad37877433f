#include "mpigrad/nn/schnet.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::nn {

Tensor shifted_softplus(const Tensor& x) {
  return core::softplus(x) - std::numbers::ln2;
}

namespace {
std::shared_ptr<Sequential> sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  return std::make_shared<Sequential>(modules);
}
}  // namespace

SchNetInteraction::SchNetInteraction(int64_t hidden, int64_t n_rbf, core::Generator& generator) {
  filter_ =
      register_module("filter", sequential({std::make_shared<Linear>(n_rbf, hidden, generator),
                                            std::make_shared<ShiftedSoftplus>(),
                                            std::make_shared<Linear>(hidden, hidden, generator)}));
  in2f_ = register_module("in2f", std::make_shared<Linear>(hidden, hidden, generator, false));
  f2out_ =
      register_module("f2out", sequential({std::make_shared<Linear>(hidden, hidden, generator),
                                           std::make_shared<ShiftedSoftplus>(),
                                           std::make_shared<Linear>(hidden, hidden, generator)}));
}

Tensor SchNetInteraction::update(const Tensor& features, const Tensor& basis,
                                 const Tensor& envelope, const Tensor& source, const Tensor& target,
                                 const Tensor& pair) {
  const Tensor filters = (*filter_)(basis)*envelope;  // [P, F]
  // The messages in2f(h)[source] * filters[pair], added onto their targets in one pass: [V, F].
  const Tensor aggregated =
      core::gather_mul_scatter((*in2f_)(features), source, filters, target, features.size(0), pair);
  return (*f2out_)(aggregated);
}

Tensor SchNetInteraction::forward(const Tensor&) {
  core::fail("SchNetInteraction: part of SchNet; it takes features and edges (update())");
}

SchNet::SchNet(SchNetOptions options, core::Generator& generator) : options_(options) {
  MPIGRAD_CHECK(options_.hidden >= 2, "SchNet: hidden must be at least 2, got ", options_.hidden);
  MPIGRAD_CHECK(options_.n_rbf >= 1, "SchNet: n_rbf must be at least 1, got ", options_.n_rbf);
  MPIGRAD_CHECK(options_.interactions >= 1, "SchNet: interactions must be at least 1, got ",
                options_.interactions);
  MPIGRAD_CHECK(std::isfinite(options_.cutoff) && options_.cutoff > 0,
                "SchNet: the cutoff must be positive, got ", options_.cutoff);
  MPIGRAD_CHECK(options_.max_atomic_number >= 1,
                "SchNet: max_atomic_number must be at least 1, got ", options_.max_atomic_number);
  const int64_t hidden = options_.hidden;
  embedding_ = register_module(
      "embedding", std::make_shared<Embedding>(options_.max_atomic_number + 1, hidden, generator));
  auto blocks = register_module("interactions", std::make_shared<Sequential>());
  for (int64_t i = 0; i < options_.interactions; ++i) {
    interactions_.push_back(
        blocks->push_back(std::make_shared<SchNetInteraction>(hidden, options_.n_rbf, generator)));
  }
  output_ =
      register_module("output", sequential({std::make_shared<Linear>(hidden, hidden / 2, generator),
                                            std::make_shared<ShiftedSoftplus>(),
                                            std::make_shared<Linear>(hidden / 2, 1, generator)}));
  std::vector<float> centers;
  for (int64_t k = 0; k < options_.n_rbf; ++k) {
    const double step = options_.n_rbf > 1 ? options_.cutoff / double(options_.n_rbf - 1) : 0.0;
    centers.push_back(float(step * double(k)));
  }
  centers_ = &register_buffer("centers", Tensor::from_vector<float>(centers, {1, options_.n_rbf}),
                              /*persistent=*/false);
}

Tensor SchNet::energy(const AtomicGraph& graph) {
  check_atomic_graph(graph, "SchNet");
  const double cutoff = options_.cutoff;
  const Tensor source = graph.edge_index.select(0, 0);
  const Tensor target = graph.edge_index.select(0, 1);
  // The filters depend on an edge's length alone, and a full neighbor list holds each pair of
  // atoms both ways, with lengths equal for any positions: the filters (most of the work) are
  // computed once per pair, and each edge reads its pair's. Not while the shifts are inputs to
  // differentiate: then the two directions' shifts are independent, and so are the lengths.
  Tensor vectors, pair;  // pair: each edge's row of the filters; undefined, its own
  if (options_.share_pair_filters && !graph.edge_shifts.requires_grad()) {
    const EdgePairs pairs = pair_reverse_edges(graph);
    vectors = edge_vectors(graph, pairs.first);
    pair = pairs.pair;
  } else {
    vectors = edge_vectors(graph);
  }
  // A tiny floor keeps the gradient of the length finite on a zero-length edge (a self loop).
  const Tensor length = core::sqrt(core::sum(vectors * vectors, {1}, true) + 1e-12);  // [P, 1]
  const double spacing = options_.n_rbf > 1 ? cutoff / double(options_.n_rbf - 1) : cutoff;
  const Tensor offset = length - *centers_;
  const Tensor basis = core::exp(offset * offset * (-0.5 / (spacing * spacing)));  // [P, n_rbf]
  // Zero from the cutoff on, where the clamp also stops the gradient.
  const Tensor envelope =
      (core::cos(core::clamp(length, 0.0, cutoff) * (std::numbers::pi / cutoff)) + 1.0) * 0.5;
  Tensor features = (*embedding_)(graph.atomic_numbers);  // [V, F]
  for (const auto& interaction : interactions_) {
    features = features + interaction->update(features, basis, envelope, source, target, pair);
  }
  return sum_over_structures((*output_)(features), graph);
}

std::string SchNet::extra_repr() const {
  std::ostringstream text;
  text << "hidden=" << options_.hidden << ", n_rbf=" << options_.n_rbf
       << ", interactions=" << options_.interactions << ", cutoff=" << options_.cutoff;
  return text.str();
}

}  // namespace mpigrad::nn
