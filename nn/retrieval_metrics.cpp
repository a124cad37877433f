#include "mpigrad/nn/retrieval_metrics.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/nn/encoder_with_head.h"

namespace mpigrad::nn {

RetrievalMetrics RetrievalMetrics::from_sums(const RetrievalSums& sums) {
  RetrievalMetrics metrics;
  metrics.queries = sums.queries;
  if (sums.queries > 0) {
    metrics.precision_at_1 = sums.precision_at_1 / double(sums.queries);
    metrics.map_at_r = sums.average_precision_at_r / double(sums.queries);
  }
  return metrics;
}

RetrievalSums retrieval_sums(const core::Tensor& embeddings, const core::Tensor& labels,
                             int64_t begin, int64_t end) {
  MPIGRAD_CHECK(embeddings.defined() && embeddings.dim() == 2,
                "retrieval_sums: embeddings must "
                "be [N, D], got ",
                embeddings.defined() ? embeddings.shape() : core::Shape{});
  const int64_t n = embeddings.size(0);
  MPIGRAD_CHECK(labels.defined() && labels.numel() == n && !core::is_floating(labels.dtype()),
                "retrieval_sums: expected ", n, " integer labels, got ",
                labels.defined() ? labels.shape() : core::Shape{});
  MPIGRAD_CHECK(0 <= begin && begin <= end && end <= n, "retrieval_sums: queries [", begin, ", ",
                end, ") outside [0, ", n, ")");
  core::NoGradGuard no_grad;
  const core::Tensor unit = l2_normalize(embeddings.to(core::kCPU).to(core::kFloat32)).contiguous();
  const std::vector<int64_t> label = labels.to(core::kCPU).to(core::kInt64).to_vector<int64_t>();
  std::unordered_map<int64_t, int64_t> class_size;
  for (int64_t l : label) ++class_size[l];

  RetrievalSums sums;
  // Similarities of a block of queries against everything: [block, N] floats at a time.
  constexpr int64_t kBlock = 256;
  std::vector<std::pair<float, int64_t>> ranked;
  ranked.reserve(size_t(n));
  for (int64_t first = begin; first < end; first += kBlock) {
    const int64_t rows = std::min(kBlock, end - first);
    const core::Tensor similarity =
        core::matmul(unit.narrow(0, first, rows), unit.t()).contiguous();
    const float* values = similarity.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t query = first + r;
      const int64_t relevant = class_size[label[size_t(query)]] - 1;  // R
      if (relevant == 0) continue;  // a lone query: left out, as PML does
      ranked.clear();
      for (int64_t j = 0; j < n; ++j) {
        if (j != query) ranked.emplace_back(values[r * n + j], j);
      }
      // Most similar first; equal similarities by the lower index.
      auto closer = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      };
      auto top = ranked.begin() + relevant;
      std::nth_element(ranked.begin(), top - 1, ranked.end(), closer);
      std::sort(ranked.begin(), top, closer);
      const int64_t wanted = label[size_t(query)];
      double hits = 0, precision_sum = 0;
      for (int64_t k = 0; k < relevant; ++k) {
        if (label[size_t(ranked[size_t(k)].second)] != wanted) continue;
        hits += 1;
        precision_sum += hits / double(k + 1);
      }
      sums.precision_at_1 += label[size_t(ranked[0].second)] == wanted ? 1.0 : 0.0;
      sums.average_precision_at_r += precision_sum / double(relevant);
      ++sums.queries;
    }
  }
  return sums;
}

RetrievalMetrics retrieval_metrics(const core::Tensor& embeddings, const core::Tensor& labels) {
  const int64_t n = embeddings.defined() && embeddings.dim() >= 1 ? embeddings.size(0) : 0;
  return RetrievalMetrics::from_sums(retrieval_sums(embeddings, labels, 0, n));
}

}  // namespace mpigrad::nn
