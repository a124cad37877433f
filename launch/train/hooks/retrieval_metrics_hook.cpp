#include "mpigrad/launch/train/hooks/retrieval_metrics_hook.h"

#include "mpigrad/core/error.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/embeddings.h"
#include "mpigrad/nn/encoder_with_head.h"

namespace mpigrad::launch {

namespace {
// DDP broadcasts rank 0's buffers before each synced forward, so after the epoch's last forward
// every rank has updated its BatchNorm statistics with its own batch. Rank 0's are the ones the
// checkpoint keeps: every rank embeds with them, so these metrics are the checkpoint's (the ones
// `mpigrad embed --metrics` gives).
void use_rank0_buffers(nn::Module& model, DistributedManager& manager) {
  if (manager.world_size() == 1) return;
  for (auto& [name, buffer] : model.named_buffers()) {
    core::Tensor host = buffer.to(core::kCPU).contiguous();
    manager.world().broadcast(host, 0);
    buffer.copy_(host.to(buffer.device()));
  }
}
}  // namespace

void RetrievalMetricsHook::on(HookStage stage, TrainingContext& context) {
  if (stage != HookStage::AfterValidation || context.val_loader == nullptr) return;
  auto* model = dynamic_cast<nn::EncoderWithHead*>(&context.model());
  MPIGRAD_CHECK(model != nullptr, "RetrievalMetricsHook: the model is a ",
                context.model().type_name(), "; retrieval metrics need an EncoderWithHead");
  use_rank0_buffers(*model, *context.manager);
  const bool was_training = model->is_training();
  model->eval();
  Embeddings table = gather_embeddings([model](const core::Tensor& x) { return model->encode(x); },
                                       *context.val_loader, input_, label_, *context.manager);
  model->train(was_training);
  nn::RetrievalMetrics metrics = distributed_retrieval_metrics(table, *context.manager);
  context.metrics["val_precision_at_1"] = metrics.precision_at_1;
  context.metrics["val_map_at_r"] = metrics.map_at_r;
  context.metrics["val_samples"] = double(table.embeddings.size(0));
}

}  // namespace mpigrad::launch
