// torch.nn.Embedding: a lookup table weight [num_embeddings, embedding_dim] initialized N(0, 1);
// forward takes Int64 (or Int32) indices of any shape and returns indices.shape + [dim].
#pragma once

#include "mpigrad/core/rng.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, core::Generator& generator);
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  std::string extra_repr() const override {
    return std::to_string(num_embeddings_) + ", " + std::to_string(embedding_dim_);
  }
  Tensor& weight() { return *weight_; }

 private:
  int64_t num_embeddings_, embedding_dim_;
  Tensor* weight_ = nullptr;
};

}  // namespace mpigrad::nn
