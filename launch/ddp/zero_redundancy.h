// ZeRO-1 ([distributed] zero = 1), after PyTorch's ZeroRedundancyOptimizer and llm.c's
// zero_stage 1: each rank keeps and updates the optimizer state of its shard of the parameters
// only, so the state per rank falls by the world size.
//
// Shards are cut in DDP's bucket space, not per parameter: rank r owns the contiguous range
// shard(b, r) of every bucket b's flat buffer, as the bucket transport defines it
// (launch/ddp/bucket_transport.h). Why: the gradients arrive there already (a reduce-scatter
// of a bucket leaves rank r's range averaged, at no extra cost), every rank owns 1/world of
// every bucket whatever the parameter sizes (per-parameter ownership leaves ranks idle when one
// layer dominates, as the 9.4M MLP's first layer does), and the parameter all-gather is the
// bucket transport's all-gather over the same ranges, started bucket by bucket. A parameter cut
// by a shard boundary is stepped in two pieces, by two ranks: the optimizers are elementwise.
//
// The pieces: where a parameter meets this rank's shard of a bucket, a flat 1-D tensor views
// that range of the parameter (a "slice of the flat parameter space"), and its gradient views
// the same range of the bucket. An optimizer of the user's kind (SGD, Adam, AdamW, built with the
// same options and groups) steps the pieces; its state is the rank's shard of the state. A
// master copy in another precision would replace the views by fp32 tensors of the same ranges
// (the same Piece list), with no change to the cutting.
//
// One step, step(): bucket by bucket, in DDP's order, the pieces of that bucket are stepped,
// this rank's range of every parameter is copied into the bucket buffer and the bucket's
// all-gather starts at once, so gathers overlap the remaining steps; then every parameter is
// copied back out of its bucket, and the gradients are reset.
//
// The user's optimizer stays the face of training: its param groups are what schedulers change
// (copied into the pieces' groups before every step), and what checkpoints see: state_dict()
// gathers the full state in the user's optimizer's own layout (state/<i>/... with each
// parameter's shape), so a ZeRO-1 checkpoint loads without ZeRO at any world size and a plain
// one loads into ZeRO-1 at any world size (load_state_dict takes each rank's ranges). Its own
// state stays empty.
//
// Gradient clipping must go through clip_grad_norm(): outside its shard a rank's gradients are
// not averaged. The global norm is one all-reduce of the shards' squared norms.
//
// fp16 loss scaling goes through unscale_() and skip_step(), for the same reason: the scaler
// (nn/optim/grad_scaler.h) must read and unscale the shards, not the parameters' gradients.
// Every rank reaches the same verdict without a collective of its own, because DDP built with
// DdpOptions::carry_found_inf poisons every rank's shard when any rank's gradients overflowed
// (launch/ddp/distributed_data_parallel.h). A skipped step changes nothing anywhere: no piece is
// stepped, no all-gather runs (every rank still holds the same parameters), and the gradients
// are reset as after a step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/optim/grad_scaler.h"
#include "mpigrad/nn/optim/optimizer.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::launch {

class DistributedDataParallel;

class ZeroRedundancyOptimizer {
 public:
  // `ddp` must have been built with DdpOptions::zero, and `optimizer` (an SGD, Adam or AdamW)
  // over parameters that DDP averages; both must outlive this. State already in `optimizer` (a
  // resumed checkpoint) is taken over, each rank its shard, and dropped there. Not collective.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, nn::Optimizer& optimizer);
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Collective: after a synced backward, steps this rank's shard, all-gathers the parameters
  // and resets the gradients of every parameter DDP averages (as zero_grad(set_to_none)).
  void step();
  // Collective: torch's clip_grad_norm_ (2-norm) over every gradient DDP averages; returns the
  // total norm.
  double clip_grad_norm(double max_norm);
  // Not collective: divides this rank's shard of every bucket by `scaler`'s scale (once per
  // step) and returns whether it overflowed; the same answer on every rank when DDP carries the
  // found-inf flag (DdpOptions::carry_found_inf).
  bool unscale_(nn::GradScaler& scaler);
  // Not collective: the step every rank skips after an overflow; resets the gradients as step()
  // does, and leaves the parameters and the optimizer state as they are.
  void skip_step();

  // Collective: the full state in the user's optimizer's layout; ranks other than those with
  // `keep` get an empty StateDict back (they still take part).
  nn::StateDict state_dict(bool keep = true);
  // Not collective: every rank passes the same full state (a checkpoint's /optimizer); errors
  // are the user's optimizer's own, naming the key.
  void load_state_dict(const nn::StateDict& state);

  // Bytes of optimizer state this rank holds (its shard).
  int64_t state_bytes() const;
  nn::Optimizer& optimizer() { return optimizer_; }

 private:
  // Where a parameter meets this rank's shard of its bucket.
  struct Segment {
    size_t parameter = 0;  // index into ddp.parameters()
    int64_t begin = 0;     // first element, in the flattened parameter
    int64_t length = 0;
    int64_t in_bucket = 0;  // first element in the bucket buffer
    int64_t piece = -1;     // index into pieces_, or -1 when the optimizer does not hold it
  };
  struct Piece {
    core::Tensor master;     // the range of the parameter, flat: what the inner optimizer steps
    core::Tensor gradient;   // the same range of the bucket buffer
    size_t state_index = 0;  // the parameter's index in the user's optimizer
    size_t group = 0;
    size_t inner_index = 0;  // its index in inner_
  };
  void copy_hyperparameters();
  // This rank's shard of every bucket with one: the averaged gradients after a synced backward.
  std::vector<core::Tensor> gradient_shards() const;
  void reset_gradients();

  DistributedDataParallel& ddp_;
  nn::Optimizer& optimizer_;
  std::vector<std::vector<Segment>> segments_;  // per bucket
  std::vector<Piece> pieces_;
  std::unique_ptr<nn::Optimizer> inner_;
  size_t optimizer_parameters_ = 0;
};

}  // namespace mpigrad::launch
