// The step and evaluation functions of supervised models, for TrainingStrategy (and the C API,
// which trains through the same step). The field names come from the caller (`mpigrad train`
// takes them from [data] x and y), so the same code trains on any file.
//   classification: the model maps batch[input] to logits [batch, classes]; batch[label] holds
//                   one integer class per sample. Dense predictions, logits [batch, classes,
//                   d1, ...], take labels [batch, d1, ...], as torch's cross_entropy does; their
//                   metrics are each sample's means over its positions.
//   regression:     the model maps batch[input] to a prediction with as many values per sample
//                   as batch[target] holds (the shapes may differ, [batch, 1024] against
//                   [batch, 1, 32, 32] say: both are compared flattened per sample).
//   supcon:         batch[input] holds V augmented views of each sample, view-major
//                   [V * batch, ...] (data/augment.h's augment_views_transform); the model maps
//                   them to L2-normalized projections [V * batch, P]; batch[label] holds one
//                   class per sample.
#pragma once

#include <functional>
#include <string>

#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/mixed_precision.h"
#include "mpigrad/nn/supcon_loss.h"

namespace mpigrad::launch {

// loss = mean cross-entropy of model(batch[input]) against batch[label].
StepFunction classification_step(std::string input, std::string label);

// Per sample: "loss" (cross-entropy) and "accuracy" (1 where the argmax is the label, else 0).
EvalFunction classification_metrics(std::string input, std::string label);

// A regression loss of torch's form: nn::mse_loss or nn::l1_loss.
using RegressionLoss = std::function<core::Tensor(
    const core::Tensor& prediction, const core::Tensor& target, nn::Reduction reduction)>;

// loss = loss(model(batch[input]), batch[target]), both [batch, values per sample].
StepFunction regression_step(std::string input, std::string target, RegressionLoss loss);

// Per sample: "loss", the loss averaged over the sample's values.
EvalFunction regression_metrics(std::string input, std::string target, RegressionLoss loss);

// loss = SupConLoss(features [batch, V, P], labels): the model's projections of the V views
// regrouped per sample (SupContrast's torch.cat([f1.unsqueeze(1), f2.unsqueeze(1)], 1)).
StepFunction supcon_step(std::string input, std::string label, nn::SupConOptions options);

// The same functions with each forward under autocast in `precision` (nn/mixed_precision.h);
// backward needs no guard, the nodes remember their dtype. fp32 returns them unchanged.
StepFunction with_precision(StepFunction step, nn::Precision precision);
EvalFunction with_precision(EvalFunction evaluate, nn::Precision precision);

}  // namespace mpigrad::launch
