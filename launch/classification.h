// defines: classification_step, classification_metrics
//
// The step and evaluation functions of a classifier, for TrainingStrategy: the model maps the
// batch's input field to logits [batch, classes], and the label field holds one integer class
// per sample. The field names come from the caller (`mpigrad train` takes them from [data] x
// and y), so the same code trains on any file.
#pragma once

#include <string>

#include "mpigrad/launch/training_strategy.h"

namespace mpigrad::launch {

// loss = mean cross-entropy of model(batch[input]) against batch[label].
StepFunction classification_step(std::string input, std::string label);

// Per sample: "loss" (cross-entropy) and "accuracy" (1 where the argmax is the label, else 0).
EvalFunction classification_metrics(std::string input, std::string label);

}  // namespace mpigrad::launch
