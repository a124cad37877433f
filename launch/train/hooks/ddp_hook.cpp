#include "mpigrad/launch/train/hooks/ddp_hook.h"

#include <cstdio>

#include "mpigrad/core/error.h"
#include "mpigrad/data/multi_dataset.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"

namespace mpigrad::launch {

DDPHook::DDPHook(DdpOptions options, DistributedSamplerSettings sampler,
                 BatchSamplerFactory custom_sampler, Communicator* communicator)
    : options_(options),
      sampler_(sampler),
      custom_sampler_(std::move(custom_sampler)),
      communicator_(communicator) {}

DDPHook::~DDPHook() = default;

void DDPHook::on(HookStage stage, TrainingContext& context) {
  if (context.world_size() == 1) return;  // one process: plain training
  switch (stage) {
    case HookStage::Setup:
      setup(context);
      break;
    case HookStage::BeforeForward:
      local_only_.reset();
      ddp_->prepare_for_backward();
      if (!context.sync_step) local_only_.emplace(*ddp_);
      break;
    case HookStage::AfterBackward:
      local_only_.reset();
      break;
    case HookStage::AfterOptimizerStep:
      if (context.step == 1) report_optimizer_state(context);
      break;
    default:
      break;
  }
}

void DDPHook::setup(TrainingContext& context) {
  DistributedManager& manager = *context.manager;
  nn::Module& model = context.model();
  for (auto& [name, tensor] : model.named_parameters()) {
    MPIGRAD_CHECK(tensor.device() == context.device, "DDPHook: parameter '", name, "' is on ",
                  tensor.device(), " but this rank's device is ", context.device,
                  "; move the model with to() before building the optimizer");
  }
  // The module form: frozen parameters are checked and broadcast from rank 0 too.
  Communicator& communicator = communicator_ ? *communicator_ : manager.world();
  ddp_ = std::make_unique<DistributedDataParallel>(model, communicator, options_);
  ddp_->set_timeline(context.timeline);
  context.ddp = ddp_.get();
  if (options_.zero) {
    MPIGRAD_CHECK(context.optimizers.size() == 1,
                  "[distributed] zero = 1 needs exactly one optimizer, got ",
                  context.optimizers.size());
    // A checkpoint resumed before this point left its state in the optimizer: taken over here.
    zero_ = std::make_unique<ZeroRedundancyOptimizer>(*ddp_, context.optimizer());
    context.zero = zero_.get();
  }
  if (context.reports()) {
    std::printf("gradients: %d bucket(s) %s%s\n", ddp_->bucket_count(),
                ddp_->transport_description().c_str(),
                options_.zero ? "; ZeRO-1: reduce-scattered, optimizer state sharded" : "");
  }
  if (context.train_loader != nullptr) {
    install_sampler(*context.train_loader, manager.world_size(), manager.rank());
  }
}

// What ZeRO-1 saves, measured where it lives (docs/mixed-precision-and-zero.md's figures come
// from this line).
void DDPHook::report_optimizer_state(TrainingContext& context) const {
  if (!context.reports() || context.optimizers.empty()) return;
  int64_t bytes = 0;
  if (zero_) {
    bytes = zero_->state_bytes();
  } else {
    for (const auto& entry : context.optimizer().state_dict().tensors()) {
      bytes += entry.second.numel() * int64_t(entry.second.element_size());
    }
  }
  std::printf("optimizer state: %.2f MiB on rank 0%s\n", double(bytes) / double(1 << 20),
              zero_ ? " (its ZeRO-1 shard)" : "");
}

void DDPHook::install_sampler(data::DataLoader& loader, int64_t replicas, int64_t rank) {
  if (loader.batch_sampler().is_distributed()) return;  // the user's own: kept
  const data::DataLoaderOptions& options = loader.options();
  if (custom_sampler_) {
    loader.set_batch_sampler(custom_sampler_(loader, replicas, rank));
    return;
  }
  bool shuffle = sampler_.shuffle.value_or(options.shuffle);
  uint64_t seed = sampler_.seed.value_or(options.seed);
  bool drop_last = sampler_.drop_last.value_or(options.drop_last);
  if (const auto* multi = dynamic_cast<const data::MultiDataset*>(&loader.dataset())) {
    data::MultiDatasetBatchSamplerOptions multi_options;
    multi_options.batch_size = options.batch_size;
    multi_options.num_replicas = replicas;
    multi_options.rank = rank;
    multi_options.seed = seed;
    multi_options.drop_last = drop_last;
    loader.set_batch_sampler(
        std::make_shared<data::MultiDatasetBatchSampler>(*multi, multi_options));
    return;
  }
  auto sampler = std::make_shared<data::DistributedSampler>(loader.dataset().size(), replicas, rank,
                                                            shuffle, seed, drop_last);
  loader.set_batch_sampler(
      std::make_shared<data::BatchSampler>(sampler, options.batch_size, drop_last));
}

}  // namespace mpigrad::launch
