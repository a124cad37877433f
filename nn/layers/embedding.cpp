#include "mpigrad/nn/layers/embedding.h"

#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/nn/init.h"

namespace mpigrad::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, core::Generator& generator)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  MPIGRAD_CHECK(num_embeddings >= 1 && embedding_dim >= 1, "Embedding: sizes must be >= 1, got ",
                num_embeddings, " x ", embedding_dim);
  weight_ = &register_parameter("weight", core::empty({num_embeddings, embedding_dim}));
  init::normal_(*weight_, 0.0, 1.0, generator);
}

Tensor Embedding::forward(const Tensor& indices) {
  return core::embedding(*weight_, indices);
}

}  // namespace mpigrad::nn
