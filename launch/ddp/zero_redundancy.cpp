// ZeroRedundancyOptimizer: cutting the buckets into this rank's pieces, the sharded step with its
// overlapped all-gathers, clipping, and the state gathered to (and taken from) the user's
// optimizer's layout. See the header.
#include "mpigrad/launch/ddp/zero_redundancy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/sgd.h"

namespace mpigrad::launch {

namespace {

// The state tensors the supported optimizers keep, in a fixed order every rank agrees on.
constexpr const char* kStateNames[] = {"momentum_buffer", "exp_avg", "exp_avg_sq"};

// An optimizer of `like`'s kind and options over `groups`.
std::unique_ptr<nn::Optimizer> same_kind(const nn::Optimizer& like,
                                         std::vector<nn::ParamGroupSpec> groups) {
  if (const auto* sgd = dynamic_cast<const nn::SGD*>(&like)) {
    return std::make_unique<nn::SGD>(std::move(groups), sgd->options());
  }
  if (const auto* adam = dynamic_cast<const nn::Adam*>(&like)) {
    return std::make_unique<nn::Adam>(std::move(groups), adam->options(),
                                      adam->type_name() == "AdamW");
  }
  core::fail("[distributed] zero = 1 shards the state of SGD, Adam and AdamW; the optimizer is ",
             like.type_name());
}

// `state` without its per-parameter entries: the group hyperparameters only.
nn::StateDict groups_only(const nn::StateDict& state) {
  nn::StateDict out;
  for (const auto& [key, value] : state.scalars()) {
    if (!key.starts_with("state/")) out.set_scalar(key, value);
  }
  return out;
}

bool has_parameter_state(const nn::StateDict& state) {
  for (const auto& entry : state.tensors()) {
    if (entry.first.starts_with("state/")) return true;
  }
  for (const auto& entry : state.scalars()) {
    if (entry.first.starts_with("state/")) return true;
  }
  return false;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp,
                                                 nn::Optimizer& optimizer)
    : ddp_(ddp), optimizer_(optimizer) {
  MPIGRAD_CHECK(ddp.options().zero, ddp.communicator().world_label(),
                " ZeroRedundancyOptimizer: DDP was built without DdpOptions::zero, so its "
                "buckets are averaged, not reduce-scattered");
  // Where each of the optimizer's parameters sits: its state index and group.
  std::unordered_map<const void*, std::pair<size_t, size_t>> place;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    for (const core::Tensor& p : optimizer.param_groups()[g].params) {
      place.emplace(p.impl_ptr(), std::make_pair(optimizer_parameters_++, g));
    }
  }
  const std::vector<NamedTensor>& parameters = ddp.parameters();
  size_t matched = 0;
  for (const NamedTensor& p : parameters) matched += place.count(p.tensor.impl_ptr());
  MPIGRAD_CHECK(matched == optimizer_parameters_, ddp.communicator().world_label(),
                " [distributed] zero = 1: ", optimizer_parameters_ - matched,
                " of the optimizer's parameters are not ones DDP averages (frozen, or of "
                "another model); ZeRO-1 steps only what DDP reduce-scatters");

  core::NoGradGuard no_grad;
  const int rank = ddp.communicator().rank();
  const size_t groups = optimizer.param_groups().size();
  std::vector<std::vector<size_t>> by_group(groups);
  segments_.resize(size_t(ddp.bucket_count()));
  for (size_t b = 0; b < segments_.size(); ++b) {
    const core::Tensor& flat = ddp.bucket_buffer(b);
    auto [first, last] = ddp.transport().shard(b, rank);
    first = std::min(first, flat.numel());
    last = std::min(last, flat.numel());
    const std::vector<size_t>& members = ddp.bucket_parameters(b);
    const std::vector<int64_t>& offsets = ddp.bucket_offsets(b);
    for (size_t k = 0; k < members.size(); ++k) {
      const core::Tensor& param = parameters[members[k]].tensor;
      const int64_t lo = std::max(first, offsets[k]);
      const int64_t hi = std::min(last, offsets[k] + param.numel());
      if (lo >= hi) continue;
      Segment segment{members[k], lo - offsets[k], hi - lo, lo, -1};
      auto found = place.find(param.impl_ptr());
      if (found != place.end()) {
        Piece piece;
        piece.master = param.detach().view({param.numel()}).narrow(0, segment.begin, hi - lo);
        piece.master.set_requires_grad(true);
        piece.gradient = flat.narrow(0, lo, hi - lo);
        piece.state_index = found->second.first;
        piece.group = found->second.second;
        segment.piece = int64_t(pieces_.size());
        by_group[piece.group].push_back(pieces_.size());
        pieces_.push_back(std::move(piece));
      }
      segments_[b].push_back(segment);
    }
  }
  std::vector<nn::ParamGroupSpec> specs;
  size_t inner_index = 0;
  for (size_t g = 0; g < groups; ++g) {
    const nn::ParamGroup& group = optimizer.param_groups()[g];
    nn::ParamGroupSpec spec;
    spec.lr = group.lr;
    spec.weight_decay = group.weight_decay;
    spec.momentum = group.momentum;
    for (size_t piece : by_group[g]) {
      pieces_[piece].inner_index = inner_index++;
      spec.params.push_back(pieces_[piece].master);
    }
    specs.push_back(std::move(spec));
  }
  inner_ = same_kind(optimizer, std::move(specs));
  nn::StateDict current = optimizer.state_dict();
  if (has_parameter_state(current)) load_state_dict(current);
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::copy_hyperparameters() {
  for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
    const nn::ParamGroup& from = optimizer_.param_groups()[g];
    nn::ParamGroup& to = inner_->param_groups()[g];
    to.lr = from.lr;
    to.weight_decay = from.weight_decay;
    to.momentum = from.momentum;
    to.initial_lr = from.initial_lr;
  }
}

void ZeroRedundancyOptimizer::step() {
  copy_hyperparameters();
  core::NoGradGuard no_grad;
  BucketTransport& transport = ddp_.transport();
  const std::vector<NamedTensor>& parameters = ddp_.parameters();
  for (size_t b = 0; b < segments_.size(); ++b) {
    // The inner optimizer steps exactly the pieces that have a gradient: this bucket's.
    for (const Segment& s : segments_[b]) {
      if (s.piece >= 0) pieces_[size_t(s.piece)].master.set_grad(pieces_[size_t(s.piece)].gradient);
    }
    inner_->step();
    const core::Tensor& flat = ddp_.bucket_buffer(b);
    for (const Segment& s : segments_[b]) {
      if (s.piece >= 0) pieces_[size_t(s.piece)].master.set_grad(core::Tensor());
      const core::Tensor& param = parameters[s.parameter].tensor;
      flat.narrow(0, s.in_bucket, s.length)
          .copy_(param.detach().view({param.numel()}).narrow(0, s.begin, s.length));
    }
    transport.start(b, BucketCollective::AllGather);
    transport.progress();
  }
  for (size_t b = 0; b < segments_.size(); ++b) {
    transport.wait(b);
    const core::Tensor& flat = ddp_.bucket_buffer(b);
    const std::vector<size_t>& members = ddp_.bucket_parameters(b);
    const std::vector<int64_t>& offsets = ddp_.bucket_offsets(b);
    for (size_t k = 0; k < members.size(); ++k) {
      const core::Tensor& param = parameters[members[k]].tensor;
      core::Tensor target = param.detach().view({param.numel()});
      target.copy_(flat.narrow(0, offsets[k], param.numel()));
      param.storage()->bump_version();
    }
  }
  // The buckets hold parameters now, not gradients.
  reset_gradients();
}

void ZeroRedundancyOptimizer::reset_gradients() {
  // Every gradient DDP keeps is reset (also of a parameter the optimizer does not hold), and the
  // next backward starts from zeroed buckets.
  for (NamedTensor p : ddp_.parameters()) p.tensor.set_grad(core::Tensor());
}

void ZeroRedundancyOptimizer::skip_step() {
  reset_gradients();
}

std::vector<core::Tensor> ZeroRedundancyOptimizer::gradient_shards() const {
  const int rank = ddp_.communicator().rank();
  std::vector<core::Tensor> shards;
  for (size_t b = 0; b < segments_.size(); ++b) {
    const core::Tensor& flat = ddp_.bucket_buffer(b);
    auto [first, last] = ddp_.transport().shard(b, rank);
    first = std::min(first, flat.numel());
    last = std::min(last, flat.numel());
    if (first < last) shards.push_back(flat.narrow(0, first, last - first));
  }
  return shards;
}

bool ZeroRedundancyOptimizer::unscale_(nn::GradScaler& scaler) {
  MPIGRAD_CHECK(ddp_.options().carry_found_inf, ddp_.communicator().world_label(),
                " ZeroRedundancyOptimizer::unscale_: DDP was built without "
                "DdpOptions::carry_found_inf, so an overflow in another rank's shard would not "
                "reach this one and the ranks could disagree on skipping the step");
  // Whole shards, with the last bucket's padding: that is where the other ranks' flag lands.
  return scaler.unscale_gradients_(gradient_shards());
}

double ZeroRedundancyOptimizer::clip_grad_norm(double max_norm) {
  core::NoGradGuard no_grad;
  std::vector<core::Tensor> shards = gradient_shards();
  double local = 0.0;
  for (const core::Tensor& shard : shards) {
    // In float64, as clip_grad_norm_ does, so many small terms are not lost.
    core::Tensor g = shard.to(core::kFloat64);
    local += core::sum(g * g).item<double>();
  }
  core::Tensor total =
      core::Tensor::from_vector<double>({local}, {1}).to(ddp_.communicator().device());
  ddp_.communicator().all_reduce(total, ReduceOp::Sum);
  const double norm = std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (core::Tensor& shard : shards) shard.mul_(coefficient);
  }
  return norm;
}

nn::StateDict ZeroRedundancyOptimizer::state_dict(bool keep) {
  Communicator& communicator = ddp_.communicator();
  const core::Device device = communicator.device();
  const nn::StateDict inner = inner_->state_dict();
  // The step of every parameter and, in the last entry, which state tensors exist (a bit per
  // kStateNames entry), agreed by every rank in one all-reduce.
  std::vector<double> steps(optimizer_parameters_ + 1, 0.0);
  int present = 0;
  for (const Piece& piece : pieces_) {
    const std::string key = "state/" + std::to_string(piece.inner_index) + "/";
    if (const double* step = inner.find_scalar(key + "step")) {
      steps[piece.state_index] = std::max(steps[piece.state_index], *step);
    }
    for (size_t n = 0; n < std::size(kStateNames); ++n) {
      if (inner.contains(key + kStateNames[n])) present |= 1 << n;
    }
  }
  steps.back() = double(present);
  core::Tensor agreed =
      core::Tensor::from_vector<double>(steps, {int64_t(steps.size())}).to(device);
  communicator.all_reduce(agreed, ReduceOp::Max);
  steps = agreed.to_vector<double>();
  present = int(steps.back());

  nn::StateDict out = keep ? optimizer_.state_dict() : nn::StateDict();
  std::unordered_map<const void*, size_t> state_index;
  for (const nn::ParamGroup& group : optimizer_.param_groups()) {
    for (const core::Tensor& p : group.params)
      state_index.emplace(p.impl_ptr(), state_index.size());
  }
  const std::vector<NamedTensor>& parameters = ddp_.parameters();
  core::NoGradGuard no_grad;
  for (size_t b = 0; b < segments_.size(); ++b) {
    const core::Tensor& flat = ddp_.bucket_buffer(b);
    for (size_t n = 0; n < std::size(kStateNames); ++n) {
      if ((present & (1 << n)) == 0) continue;
      // Each element is non-zero on its owner alone: the sum is the owner's value, exactly.
      core::Tensor full =
          core::zeros({flat.numel()}, core::TensorOptions(flat.dtype()).device(flat.device()));
      for (const Segment& s : segments_[b]) {
        if (s.piece < 0) continue;
        const Piece& piece = pieces_[size_t(s.piece)];
        const core::Tensor* value =
            inner.find("state/" + std::to_string(piece.inner_index) + "/" + kStateNames[n]);
        if (value != nullptr) full.narrow(0, s.in_bucket, s.length).copy_(*value);
      }
      communicator.all_reduce(full, ReduceOp::Sum);
      if (!keep) continue;
      const std::vector<size_t>& members = ddp_.bucket_parameters(b);
      const std::vector<int64_t>& offsets = ddp_.bucket_offsets(b);
      for (size_t k = 0; k < members.size(); ++k) {
        const core::Tensor& param = parameters[members[k]].tensor;
        auto found = state_index.find(param.impl_ptr());
        if (found == state_index.end() || steps[found->second] <= 0) continue;
        out.set("state/" + std::to_string(found->second) + "/" + kStateNames[n],
                full.narrow(0, offsets[k], param.numel()).view(param.shape()).clone());
      }
    }
  }
  if (!keep) return out;
  for (size_t i = 0; i < optimizer_parameters_; ++i) {
    if (steps[i] > 0) out.set_scalar("state/" + std::to_string(i) + "/step", steps[i]);
  }
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const nn::StateDict& state) {
  // The user's optimizer checks the state against its parameters (errors name the key) and
  // takes the group hyperparameters; its copy of the per-parameter state is dropped below.
  optimizer_.load_state_dict(state);
  nn::StateDict inner;
  for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
    const nn::ParamGroup& group = optimizer_.param_groups()[g];
    const std::string prefix = "param_groups/" + std::to_string(g) + "/";
    inner.set_scalar(prefix + "lr", group.lr);
    inner.set_scalar(prefix + "weight_decay", group.weight_decay);
    inner.set_scalar(prefix + "momentum", group.momentum);
    inner.set_scalar(prefix + "initial_lr", group.initial_lr);
    inner.set_scalar(prefix + "num_params", double(inner_->param_groups()[g].params.size()));
  }
  core::NoGradGuard no_grad;
  for (const std::vector<Segment>& bucket : segments_) {
    for (const Segment& s : bucket) {
      if (s.piece < 0) continue;
      const Piece& piece = pieces_[size_t(s.piece)];
      const std::string from = "state/" + std::to_string(piece.state_index) + "/";
      const std::string to = "state/" + std::to_string(piece.inner_index) + "/";
      if (const double* step = state.find_scalar(from + "step"))
        inner.set_scalar(to + "step", *step);
      for (const char* name : kStateNames) {
        if (const core::Tensor* value = state.find(from + name)) {
          inner.set(to + name, value->reshape({value->numel()}).narrow(0, s.begin, s.length));
        }
      }
    }
  }
  inner_->load_state_dict(inner);
  optimizer_.load_state_dict(groups_only(optimizer_.state_dict()));
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : inner_->state_dict().tensors()) {
    bytes += tensor.numel() * int64_t(tensor.element_size());
  }
  return bytes;
}

}  // namespace mpigrad::launch
