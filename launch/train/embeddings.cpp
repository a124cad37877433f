#include "mpigrad/launch/train/embeddings.h"

#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/nn/encoder_with_head.h"

namespace mpigrad::launch {

namespace {
// Every rank's count, in rank order.
std::vector<int64_t> gather_counts(int64_t count, Communicator& world) {
  core::Tensor mine = core::Tensor::from_vector<int64_t>({count}, {1});
  core::Tensor all = core::zeros({int64_t(world.size())}, core::kInt64);
  world.all_gather(mine, all);
  return all.to_vector<int64_t>();
}
}  // namespace

Embeddings gather_embeddings(const EmbedFunction& embed, data::DataLoader& loader,
                             const std::string& input, const std::string& label,
                             DistributedManager& manager) {
  core::NoGradGuard no_grad;
  const int64_t dataset_size = loader.dataset().size();
  std::vector<core::Tensor> pieces;
  std::vector<int64_t> labels, indices;
  loader.set_epoch(0);
  for (data::Batch& batch : loader) {
    core::Tensor x = batch[input];
    if (x.device() != manager.device()) x = x.to(manager.device());
    core::Tensor rows = embed(x).detach();
    MPIGRAD_CHECK(rows.dim() == 2 && rows.size(0) == batch.size(),
                  "gather_embeddings: the "
                  "embedding of a batch of ",
                  batch.size(), " has shape ", rows.shape(), "; expected [", batch.size(), ", D]");
    pieces.push_back(rows.to(core::kCPU).to(core::kFloat32).contiguous());
    std::vector<int64_t> y = batch[label].to(core::kCPU).to(core::kInt64).to_vector<int64_t>();
    MPIGRAD_CHECK(int64_t(y.size()) == batch.size(), "gather_embeddings: label field '", label,
                  "' must hold one label per sample");
    labels.insert(labels.end(), y.begin(), y.end());
    indices.insert(indices.end(), batch.indices.begin(), batch.indices.end());
  }
  const int64_t local = int64_t(indices.size());
  const int64_t width = pieces.empty() ? 0 : pieces.front().size(1);
  Communicator& world = manager.world();
  const std::vector<int64_t> counts = gather_counts(local, world);
  const std::vector<int64_t> widths = gather_counts(width, world);
  for (size_t r = 0; r < widths.size(); ++r) {
    MPIGRAD_CHECK(widths[r] == width || counts[r] == 0, "gather_embeddings: rank ", r,
                  " embeds into ", widths[r], " values, this rank into ", width);
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<float> flat;
  flat.reserve(size_t(local * width));
  for (const core::Tensor& piece : pieces) {
    const float* values = piece.data<float>();
    flat.insert(flat.end(), values, values + piece.numel());
  }
  core::Tensor mine = core::Tensor::from_vector<float>(flat, {local * width});
  core::Tensor all = core::zeros({total * width}, core::kFloat32);
  std::vector<int64_t> element_counts;
  for (int64_t c : counts) element_counts.push_back(c * width);
  world.all_gather_v(mine, all, element_counts);
  core::Tensor all_labels = core::zeros({total}, core::kInt64);
  core::Tensor all_indices = core::zeros({total}, core::kInt64);
  world.all_gather_v(core::Tensor::from_vector<int64_t>(labels, {local}), all_labels, counts);
  world.all_gather_v(core::Tensor::from_vector<int64_t>(indices, {local}), all_indices, counts);

  // Rows in dataset order; a padded repeat finds its index taken and is dropped.
  std::vector<int64_t> row_of(size_t(dataset_size), -1);
  const int64_t* gathered_index = all_indices.data<int64_t>();
  for (int64_t row = 0; row < total; ++row) {
    const int64_t index = gathered_index[row];
    MPIGRAD_CHECK(index >= 0 && index < dataset_size, "gather_embeddings: sample index ", index,
                  " outside the dataset's ", dataset_size);
    if (row_of[size_t(index)] < 0) row_of[size_t(index)] = row;
  }
  Embeddings table;
  table.embeddings = core::zeros({dataset_size, width}, core::kFloat32);
  table.labels = core::zeros({dataset_size}, core::kInt64);
  table.indices = core::zeros({dataset_size}, core::kInt64);
  const float* source = all.data<float>();
  float* target = table.embeddings.data<float>();
  const int64_t* gathered_label = all_labels.data<int64_t>();
  int64_t* out_label = table.labels.data<int64_t>();
  int64_t* out_index = table.indices.data<int64_t>();
  for (int64_t index = 0; index < dataset_size; ++index) {
    const int64_t row = row_of[size_t(index)];
    MPIGRAD_CHECK(row >= 0, "gather_embeddings: sample ", index, " of ",
                  loader.dataset().describe(), " was embedded by no rank");
    std::copy(source + row * width, source + (row + 1) * width, target + index * width);
    out_label[index] = gathered_label[row];
    out_index[index] = index;
  }
  return table;
}

nn::RetrievalMetrics distributed_retrieval_metrics(const Embeddings& table,
                                                   DistributedManager& manager) {
  const int64_t n = table.embeddings.size(0);
  const int64_t ranks = manager.world_size(), rank = manager.rank();
  nn::RetrievalSums mine =
      nn::retrieval_sums(table.embeddings, table.labels, n * rank / ranks, n * (rank + 1) / ranks);
  core::Tensor sums = core::Tensor::from_vector<double>(
      {mine.precision_at_1, mine.average_precision_at_r, double(mine.queries)}, {3});
  manager.world().all_reduce(sums, ReduceOp::Sum);
  std::vector<double> total = sums.to_vector<double>();
  return nn::RetrievalMetrics::from_sums({.precision_at_1 = total[0],
                                          .average_precision_at_r = total[1],
                                          .queries = int64_t(total[2] + 0.5)});
}

}  // namespace mpigrad::launch
