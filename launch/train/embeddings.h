// Embeddings of a whole dataset computed in data parallel, BioEncoder's `_all_gather_cat`: every
// rank embeds its shard (a DistributedSampler without shuffle), the shards are gathered with
// all_gather_v (they are uneven: the sampler pads the last ranks' shards with repeats of the
// first samples), the repeats are dropped by global index and the rows are put in dataset order.
// Every rank ends with the same [N, D] table.
//
// Retrieval metrics (nn/retrieval_metrics.h) of such a table are computed distributed: rank r
// ranks the queries of its slice [N r / R, N (r + 1) / R) against all N, and the sums are
// all-reduced, so every rank gets the same numbers.
//
// RetrievalMetricsHook (launch/train/hooks/retrieval_metrics_hook.h) reports them as stage-1
// (SupCon) validation.
#pragma once

#include <functional>
#include <string>

#include "mpigrad/core/tensor.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/retrieval_metrics.h"

namespace mpigrad::launch {

struct Embeddings {
  core::Tensor embeddings;  // float32 [N, D], host, dataset order
  core::Tensor labels;      // int64 [N]
  core::Tensor indices;     // int64 [N]: 0, 1, ..., N - 1 once every sample is in
};

// The embedding of a batch of inputs: [batch, D].
using EmbedFunction = std::function<core::Tensor(const core::Tensor& input)>;

// Embeds every batch of `loader` (this rank's shard; collective: every rank calls it with a
// loader over the same dataset) and gathers. The loader's batches come to `manager`'s device;
// `input` and `label` name the fields. Autograd is off. core::Error when a sample is missing
// after the gather (a loader that does not cover the dataset) or the ranks' widths differ.
Embeddings gather_embeddings(const EmbedFunction& embed, data::DataLoader& loader,
                             const std::string& input, const std::string& label,
                             DistributedManager& manager);

// precision@1 and mAP@R of the table, each rank computing a slice of the queries.
nn::RetrievalMetrics distributed_retrieval_metrics(const Embeddings& table,
                                                   DistributedManager& manager);

}  // namespace mpigrad::launch
