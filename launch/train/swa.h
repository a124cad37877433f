// Stochastic weight averaging (Izmailov et al. 2018) for `mpigrad train` ([train] swa_start,
// swa_lr) and `mpigrad swa` (an average of saved checkpoints).
//
// In training, SWAHook (launch/train/hooks/swa_hook.h) works in 1-based epochs, as ckpt-epoch<N>.h5
// counts them: from epoch swa_start on, every optimizer step runs at the constant swa_lr (torch's
// SWALR with anneal_epochs = 0: no annealing; swa_lr = 0 keeps the schedule's lr), and the weights
// at the end of each of those epochs join an equal-weight running average (nn::SWAAverager). The
// average is hook state, so it is in every checkpoint (/hooks/swa/) and a resumed run continues
// it. An epoch cut short by max_steps does not join.
//
// The averaged weights' BatchNorm statistics belong to no model that was trained, so they are
// recomputed (recompute_bn_statistics): every rank runs nn::update_bn over its shard of the
// training data (a padded DistributedSampler, so every rank sees the same number of batches),
// then the ranks average their floating buffers, which gives the mean of the per-batch
// statistics over all batches of all ranks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/data/data_loader.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/weight_averaging.h"

namespace mpigrad::launch {

// update_bn over `loader` (batches' field `input`), then the ranks' floating buffers averaged
// over `manager`'s world. Every rank must call it, with loaders of equal length.
void recompute_bn_statistics(nn::Module& model, data::DataLoader& loader, const std::string& input,
                             DistributedManager& manager);

// Reads every checkpoint in `paths` (every rank reads them), checks each one's /model entries
// against `model` (a missing, extra or differently shaped tensor is a core::Error naming the
// file and the tensor), and loads their element-wise mean into `model`.
void load_averaged_checkpoints(const std::vector<std::string>& paths, nn::Module& model);

// Evaluates a classifier on `loader` across ranks, as `mpigrad train` validates: returns
// val_loss, val_accuracy and val_samples (padding repeats counted once).
std::map<std::string, double> evaluate_classifier(nn::Module& model, data::DataLoader& loader,
                                                  const std::string& input,
                                                  const std::string& label,
                                                  DistributedManager& manager);

}  // namespace mpigrad::launch
