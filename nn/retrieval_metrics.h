// Retrieval metrics of an embedding, with pytorch-metric-learning's AccuracyCalculator
// definitions for queries and references from the same source
// (embeddings_come_from_same_source=True, the default LpDistance on normalized embeddings):
//   each sample is a query against every other sample (never itself); neighbours are ranked by
//   cosine similarity of the L2-normalized embeddings (the same order as PML's L2 distance);
//   precision@1  the nearest neighbour has the query's label (1) or not (0);
//   mAP@R        R = the number of other samples with the query's label; over the R nearest,
//                AP@R = (1/R) * sum over k <= R of rel(k) * precision@k, rel(k) = 1 when the
//                k-th neighbour has the query's label;
//   both are means over the queries. A query whose class has no other sample (R = 0, a class of
//   size 1) is left out of both means, as PML leaves out its "lone" queries; with no query left
//   both are 0.
// Ties in similarity are ranked by the lower dataset index first (PML leaves their order to
// faiss; a test with ties pins ours).
//
// retrieval_sums computes the sums for a range of queries against all N samples, so ranks can
// split the queries and add their sums (launch/train/embeddings.h does).
#pragma once

#include <cstdint>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

struct RetrievalSums {
  double precision_at_1 = 0;          // sum over the counted queries
  double average_precision_at_r = 0;  // sum over the counted queries
  int64_t queries = 0;                // queries counted (not lone)
};

struct RetrievalMetrics {
  double precision_at_1 = 0;
  double map_at_r = 0;
  int64_t queries = 0;
  static RetrievalMetrics from_sums(const RetrievalSums& sums);
};

// embeddings: float [N, D] (normalized here); labels: integer [N]. Queries [begin, end).
RetrievalSums retrieval_sums(const core::Tensor& embeddings, const core::Tensor& labels,
                             int64_t begin, int64_t end);

// Every sample as a query.
RetrievalMetrics retrieval_metrics(const core::Tensor& embeddings, const core::Tensor& labels);

}  // namespace mpigrad::nn
