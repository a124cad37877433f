// SchNet (Schütt et al., 2017), the built-in interatomic potential of `[model] name = schnet`:
// a model for users without PyTorch. Per structure:
//   h = embedding(atomic number)                                   [V, F]
//   `interactions` times, a continuous-filter convolution and a residual update:
//     W = filter(rbf(|r_ts|)) * cosine_cutoff(|r_ts|)              [E, F], one filter per edge
//                                  (computed once for the two directions of a pair of atoms)
//     m = in2f(h)[source] * W                                      messages [E, F]
//     h = h + f2out(sum of m over each atom's incoming edges)      aggregated onto the targets
// (the messages and their sum are one pass, core::gather_mul_scatter, which never holds m)
//   E = sum over the structure's atoms of output(h)                one number per structure
// with rbf the `n_rbf` Gaussians centred from 0 to the cutoff (width the spacing), the cosine
// cutoff 0.5 (cos(pi d / cutoff) + 1) (zero from the cutoff on), filter = Linear(n_rbf, F), ssp,
// Linear(F, F); in2f = Linear(F, F) without bias; f2out = Linear(F, F), ssp, Linear(F, F); output
// = Linear(F, F/2), ssp, Linear(F/2, 1); ssp(x) = softplus(x) - log 2, the shifted softplus.
// Everything is made of differentiable core ops, so forces and stress (and the double backward
// of training on them) need nothing more.
//
// Parameter names, as in a PyTorch twin of the same layout: embedding.weight,
// interactions.<i>.filter.{0,2}.{weight,bias}, interactions.<i>.in2f.weight,
// interactions.<i>.f2out.{0,2}.{weight,bias}, output.{0,2}.{weight,bias}.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/nn/atomistic.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/embedding.h"
#include "mpigrad/nn/layers/linear.h"

namespace mpigrad::nn {

struct SchNetOptions {
  int64_t hidden = 64;              // F: features per atom, and filters per edge
  int64_t n_rbf = 20;               // Gaussians of the radial basis
  int64_t interactions = 3;         // continuous-filter convolutions
  double cutoff = 5.0;              // where the filters reach zero (the neighbor list's cutoff)
  int64_t max_atomic_number = 100;  // the embedding's rows are 0 .. this
  // Compute each filter once for the two directions of a pair of atoms (nn::pair_reverse_edges):
  // the same energy and derivatives in exact arithmetic, about half the work. Off: one filter
  // per edge (for tests that compare the two).
  bool share_pair_filters = true;
};

// x -> log(1 + e^x) - log 2, in the form that never overflows; differentiable to any order.
Tensor shifted_softplus(const Tensor& x);

// The parameter-free Module of shifted_softplus, for Sequential.
class ShiftedSoftplus : public Module {
 public:
  Tensor forward(const Tensor& input) override { return shifted_softplus(input); }
  std::string type_name() const override { return "ShiftedSoftplus"; }
};

// One interaction block (its children give the names above).
class SchNetInteraction : public Module {
 public:
  SchNetInteraction(int64_t hidden, int64_t n_rbf, core::Generator& generator);
  // The update to add to `features`, from the radial basis [P, n_rbf] and cutoff [P, 1] of the
  // edges' lengths; edge e reads row pair[e] of them (row e where pair is undefined).
  Tensor update(const Tensor& features, const Tensor& basis, const Tensor& envelope,
                const Tensor& source, const Tensor& target, const Tensor& pair = Tensor());
  Tensor forward(const Tensor& input) override;  // an error: call update()
  std::string type_name() const override { return "SchNetInteraction"; }

 private:
  std::shared_ptr<Sequential> filter_, f2out_;
  std::shared_ptr<Linear> in2f_;
};

class SchNet : public AtomisticModel {
 public:
  // Initialized from `generator`: the same seed gives the same weights on every rank.
  SchNet(SchNetOptions options, core::Generator& generator);
  Tensor energy(const AtomicGraph& graph) override;
  std::string type_name() const override { return "SchNet"; }
  std::string extra_repr() const override;
  const SchNetOptions& options() const { return options_; }

 private:
  SchNetOptions options_;
  std::shared_ptr<Embedding> embedding_;
  std::vector<std::shared_ptr<SchNetInteraction>> interactions_;
  std::shared_ptr<Sequential> output_;
  Tensor* centers_ = nullptr;  // the radial basis' centres, a non-persistent buffer [1, n_rbf]
};

}  // namespace mpigrad::nn
