#include "mpigrad/nn/encoder_with_head.h"

#include <limits>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/linear.h"

namespace mpigrad::nn {

std::shared_ptr<Sequential> make_head(HeadKind kind, int64_t features, int64_t outputs,
                                      core::Generator& generator) {
  MPIGRAD_CHECK(features >= 1 && outputs >= 1,
                "make_head: features and outputs must be at least "
                "1, got ",
                features, " and ", outputs);
  auto head = std::make_shared<Sequential>();
  if (kind == HeadKind::Mlp) {
    head->push_back(std::make_shared<Linear>(features, features, generator));
    head->push_back(std::make_shared<ReLU>());
  }
  head->push_back(std::make_shared<Linear>(features, outputs, generator));
  return head;
}

core::Tensor l2_normalize(const core::Tensor& x) {
  MPIGRAD_CHECK(x.dim() == 2, "l2_normalize: expected [batch, features], got ", x.shape());
  // max(||x||, eps) as sqrt(max(sum x^2, eps^2)): the same value, one op fewer.
  core::Tensor squares = core::sum(x * x, {1}, true);
  return x * core::rsqrt(core::clamp(squares, 1e-24, std::numeric_limits<double>::infinity()));
}

EncoderWithHead::EncoderWithHead(std::shared_ptr<Module> encoder, int64_t features,
                                 std::shared_ptr<Module> head, EncoderWithHeadOptions options)
    : encoder_(std::move(encoder)), head_(std::move(head)), features_(features), options_(options) {
  MPIGRAD_CHECK(encoder_ != nullptr && head_ != nullptr, "EncoderWithHead: null encoder or head");
  register_module("encoder", encoder_);
  register_module("head", head_);
  if (options_.freeze_encoder) {
    for (Tensor parameter : encoder_->parameters()) parameter.set_requires_grad(false);
  }
}

Tensor EncoderWithHead::encode(const Tensor& input) {
  if (!options_.freeze_encoder) return encoder_->forward(input);
  encoder_->eval();
  core::NoGradGuard no_grad;
  return encoder_->forward(input);
}

Tensor EncoderWithHead::forward(const Tensor& input) {
  Tensor output = head_->forward(encode(input));
  return options_.normalize_output ? l2_normalize(output) : output;
}

std::string EncoderWithHead::extra_repr() const {
  std::string text = "features=" + std::to_string(features_);
  if (options_.normalize_output) text += ", normalize_output=true";
  if (options_.freeze_encoder) text += ", freeze_encoder=true";
  return text;
}

}  // namespace mpigrad::nn
