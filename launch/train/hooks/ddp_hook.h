// DDPHook: data parallelism for TrainingStrategy. At setup it wraps the model in
// DistributedDataParallel on the given communicator (the manager's world when none is given),
// builds ZeRO-1's sharded optimizer under DdpOptions::zero, and gives the training loader a
// distributed sampler. Before each forward it readies DDP's buckets; a micro-batch that does
// not end an optimizer step keeps its gradients local (DDP's no_sync), so an accumulated step
// waits for one all-reduce. At world size 1 it does nothing: plain training.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "mpigrad/data/sampler.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

// Overrides of the distributed sampler DDPHook installs (PyTorch's sampler kwargs); unset fields
// keep the loader's own options.
struct DistributedSamplerSettings {
  std::optional<bool> shuffle;
  std::optional<uint64_t> seed;
  std::optional<bool> drop_last;
};

// Builds a custom distributed batch sampler for (loader, num_replicas, rank).
using BatchSamplerFactory = std::function<std::shared_ptr<data::BatchSamplerBase>(
    const data::DataLoader& loader, int64_t num_replicas, int64_t rank)>;

class DDPHook final : public Hook {
 public:
  static constexpr int kOrder = 300;
  // `communicator` carries the gradients; null means the manager's world (MPI).
  explicit DDPHook(DdpOptions options = {}, DistributedSamplerSettings sampler = {},
                   BatchSamplerFactory custom_sampler = nullptr,
                   Communicator* communicator = nullptr);
  ~DDPHook() override;
  std::string name() const override { return "ddp"; }
  HookStages stages() const override {
    return {HookStage::Setup, HookStage::BeforeForward, HookStage::AfterBackward,
            HookStage::AfterOptimizerStep};
  }
  // After a resume: ZeRO-1 takes over the optimizer state the checkpoint loaded.
  HookPlace place() const override { return {kOrder, {"checkpoint"}}; }
  void on(HookStage stage, TrainingContext& context) override;
  DistributedDataParallel* ddp() { return ddp_.get(); }
  ZeroRedundancyOptimizer* zero() { return zero_.get(); }

 private:
  void setup(TrainingContext& context);
  void install_sampler(data::DataLoader& loader, int64_t replicas, int64_t rank);
  void report_optimizer_state(TrainingContext& context) const;

  DdpOptions options_;
  DistributedSamplerSettings sampler_;
  BatchSamplerFactory custom_sampler_;
  Communicator* communicator_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;
  // Held from the forward to the end of backward of a micro-batch that keeps its gradients local.
  std::optional<DistributedDataParallel::NoSync> local_only_;
};

}  // namespace mpigrad::launch
