#include "mpigrad/launch/train/swa.h"

#include <optional>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/nn/checkpoint.h"

namespace mpigrad::launch {

void recompute_bn_statistics(nn::Module& model, data::DataLoader& loader, const std::string& input,
                             DistributedManager& manager) {
  loader.set_epoch(0);
  loader.start();
  nn::update_bn(model, [&]() -> core::Tensor {
    std::optional<data::Batch> batch = loader.next();
    if (!batch) return core::Tensor();
    return (*batch)[input].to(manager.device());
  });
  const int64_t ranks = manager.world_size();
  if (ranks == 1) return;
  core::NoGradGuard no_grad;
  for (auto& [name, buffer] : model.named_buffers()) {
    if (!core::is_floating(buffer.dtype())) continue;  // num_batches_tracked: equal everywhere
    core::Tensor host = buffer.to(core::kCPU, core::kFloat64).contiguous().clone();
    manager.world().all_reduce(host, ReduceOp::Sum);
    host.div_(double(ranks));
    core::Tensor slot = buffer;
    slot.copy_(host.to(slot.device(), slot.dtype()));
  }
}

void load_averaged_checkpoints(const std::vector<std::string>& paths, nn::Module& model) {
  MPIGRAD_CHECK(!paths.empty(), "--checkpoints: no checkpoint given");
  const nn::StateDict expected = model.state_dict();
  std::vector<nn::StateDict> states;
  for (const std::string& path : paths) {
    nn::CheckpointData data = nn::load_checkpoint(path);
    for (const auto& [key, tensor] : expected.tensors()) {
      const core::Tensor* found = data.model.find(key);
      MPIGRAD_CHECK(found != nullptr, "--checkpoints: ", path, " has no tensor '", key,
                    "' of the configured [model]; was it written by another model?");
      MPIGRAD_CHECK(found->shape() == tensor.shape(), "--checkpoints: ", path, ": tensor '", key,
                    "' has shape ", found->shape(), " but the configured [model] has ",
                    tensor.shape());
      MPIGRAD_CHECK(core::is_floating(found->dtype()) == core::is_floating(tensor.dtype()),
                    "--checkpoints: ", path, ": tensor '", key, "' is ", found->dtype(),
                    " but the configured [model] has ", tensor.dtype());
    }
    for (const auto& [key, tensor] : data.model.tensors()) {
      MPIGRAD_CHECK(expected.contains(key), "--checkpoints: ", path, " has tensor '", key,
                    "', which the configured [model] lacks; was it written by another model?");
    }
    states.push_back(std::move(data.model));
  }
  model.load_state_dict(nn::average_state_dicts(states), true);
}

std::map<std::string, double> evaluate_classifier(nn::Module& model, data::DataLoader& loader,
                                                  const std::string& input,
                                                  const std::string& label,
                                                  DistributedManager& manager) {
  TrainingStrategy evaluation({&model}, {}, classification_step(input, label),
                              classification_metrics(input, label), manager, {}, 1);
  return evaluation.validate(loader);
}

}  // namespace mpigrad::launch
