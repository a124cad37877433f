// The model of two-stage training (BioEncoder, SupContrast): an encoder (nn/models.h's Encoder,
// any model without its output layer) followed by a head, registered as the children "encoder"
// and "head", so checkpoints hold "encoder.<name>" and "head.<name>" and a later stage loads the
// encoder's tensors by name.
//   stage 1 (SupCon):    head = the projection, Linear(f, f) ReLU Linear(f, p) (SupContrast's
//                        "mlp" head), and the output is L2-normalized per sample
//   stage 2 (classifier): head = Linear(f, classes), or the same MLP shape ending in the classes
// A frozen encoder (stage 2 with freeze_encoder) runs without autograd and always in eval mode
// (its BatchNorm uses and keeps its running statistics): forward puts it there, since
// Module::train sets the whole tree. Its parameters stop requiring grad, so optimizers built over
// the trainable parameters leave them out and DDP broadcasts them once instead of bucketing them.
#pragma once

#include <cstdint>
#include <memory>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

enum class HeadKind : uint8_t { Linear, Mlp };
inline constexpr core::EnumName<HeadKind> kHeadKindNames[] = {{HeadKind::Linear, "linear"},
                                                              {HeadKind::Mlp, "mlp"}};

// linear: Linear(features, outputs); mlp: Linear(features, features), ReLU, Linear(features,
// outputs). Initialized from `generator` (PyTorch's default Linear initialization).
std::shared_ptr<Sequential> make_head(HeadKind kind, int64_t features, int64_t outputs,
                                      core::Generator& generator);

// x / max(||x||_2, 1e-12) along dim 1 (torch.nn.functional.normalize), differentiable.
core::Tensor l2_normalize(const core::Tensor& x);

struct EncoderWithHeadOptions {
  bool normalize_output = false;  // L2-normalize the head's output (the SupCon projection)
  bool freeze_encoder = false;
};

class EncoderWithHead : public Module {
 public:
  EncoderWithHead(std::shared_ptr<Module> encoder, int64_t features, std::shared_ptr<Module> head,
                  EncoderWithHeadOptions options = {});
  // head(encode(x)), normalized with normalize_output.
  Tensor forward(const Tensor& input) override;
  // The encoder's features [batch, features] (the embedding), frozen or not as configured.
  Tensor encode(const Tensor& input);
  std::string type_name() const override { return "EncoderWithHead"; }
  std::string extra_repr() const override;

  Module& encoder() { return *encoder_; }
  Module& head() { return *head_; }
  int64_t features() const { return features_; }
  bool encoder_frozen() const { return options_.freeze_encoder; }

 private:
  std::shared_ptr<Module> encoder_, head_;
  int64_t features_;
  EncoderWithHeadOptions options_;
};

}  // namespace mpigrad::nn
