// defines: DistributedDataParallel, DdpOptions, GradCompression, NamedTensor
//
// Data-parallel gradient averaging that overlaps communication with backward, after PyTorch's
// DDP Reducer. At construction it checks that every rank holds the same parameters (names,
// shapes, dtypes), broadcasts rank 0's parameters and buffers, and lays the gradients out in
// buckets: each parameter's .grad becomes a view into one flat bucket buffer, so no copy is
// needed to communicate it. Buckets are cut by size in reverse registration order (the order in
// which backward produces gradients), the first one small so communication starts early.
//
// During backward each parameter's grad-ready hook marks it ready; when a bucket's last
// parameter is ready its averaging starts at once, in bucket order (every rank must issue
// collectives in the same order). On one node with host tensors the buckets live in shared
// memory and each rank averages its slice of every bucket as soon as all ranks have finished it,
// from the next gradient hook (SharedMemoryAllReduce); otherwise each bucket is an async
// all_reduce on the communicator (NCCL on the GPU, MPI across nodes), polled from the hooks.
// A callback queued on the autograd engine runs after the last gradient: it deals with
// parameters that got no gradient, then waits for the buckets, so when backward() returns
// every .grad holds the average over ranks.
//
// Invariants:
// - .grad of every parameter is a view into its bucket; zero_grad must zero in place (a grad
//   reset to undefined is re-attached, zeroed, before the next backward).
// - Collectives are issued in the same order on every rank: bucket 0, 1, 2, ...
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/communicator.h"
#include "mpigrad/launch/shared_memory_all_reduce.h"

namespace mpigrad::nn {
class Module;
}

namespace mpigrad::launch {

// Gradient compression: the bucket is cast to a 16-bit float for the all-reduce and back after.
enum class GradCompression : uint8_t { None, BFloat16, Float16 };
inline constexpr core::EnumName<GradCompression> kGradCompressionNames[] = {
    {GradCompression::None, "none"},
    {GradCompression::BFloat16, "bf16"},
    {GradCompression::Float16, "fp16"}};
// Parses "none", "bf16" or "fp16"; throws core::Error listing those otherwise.
GradCompression parse_grad_compression(std::string_view text);

struct DdpOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  // Parameters that got no gradient in a backward are reduced as zeros instead of an error.
  bool find_unused_parameters = false;
  // Rank 0's buffers (BatchNorm running stats, ...) are broadcast before every synced backward.
  bool broadcast_buffers = true;
  GradCompression compression = GradCompression::None;
  // Host buckets, every rank on one node, no compression: the buckets live in shared memory and
  // are averaged there in place (SharedMemoryAllReduce), several times cheaper than MPI's
  // all-reduce. Off, or when that is not possible, buckets go through the communicator.
  bool shared_memory = true;
  // How long a rank waits for the others in the shared-memory averaging before it fails naming
  // them (the communicator's own timeout covers the other path); <= 0: no bound. Defaults to
  // MPIGRAD_COLLECTIVE_TIMEOUT, else 300 s, like the communicators.
  double timeout_seconds = CollectiveConfig::from_environment().timeout_seconds;
};

struct NamedTensor {
  std::string name;
  core::Tensor tensor;
};

class DistributedDataParallel {
 public:
  // Collective over `communicator`: every rank must construct it with the same model. Throws
  // core::Error on every rank, naming the first difference and the ranks, when models differ.
  DistributedDataParallel(std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers,
                          Communicator& communicator, DdpOptions options = {});
  // Wraps a module: its parameters that require grad and all its buffers, by dotted name; frozen
  // parameters are checked and broadcast from rank 0 once, like PyTorch's state sync. Build it
  // after Module::to and convert_sync_batchnorm (DDP keeps the tensors, not the module's slots);
  // the module must outlive this object.
  DistributedDataParallel(nn::Module& module, Communicator& communicator, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Call before each forward/backward: re-attaches reset gradients and, in a synced step,
  // broadcasts buffers. forward() calls it.
  void prepare_for_backward();
  // With the module constructor: prepare_for_backward(), then the module's forward.
  core::Tensor forward(const core::Tensor& input);
  core::Tensor operator()(const core::Tensor& input) { return forward(input); }
  // The wrapped module; core::Error when built from tensors.
  nn::Module& module();

  // While a NoSync guard is alive, backward only accumulates locally (gradient accumulation);
  // the first backward after it ends all-reduces everything accumulated.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) {
      ddp.sync_enabled_ = false;
    }
    ~NoSync() { ddp_.sync_enabled_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Uneven inputs (join): every rank calls this once per step with whether it has a batch; it
  // returns how many ranks do. A rank without a batch then calls join_backward() instead of its
  // forward/backward, which all-reduces zero gradients in the same bucket order, so the ranks
  // that still have data never wait forever and every rank ends with the same averaged grads.
  int ranks_with_data(bool has_batch);
  void join_backward();

  int bucket_count() const { return int(buckets_.size()); }
  // Whether the buckets are averaged in shared memory; if not, why_not_shared_memory() says why.
  bool uses_shared_memory() const { return shared_ != nullptr; }
  const std::string& why_not_shared_memory() const { return why_not_shared_memory_; }
  // Buckets whose averaging started before the last synced backward reached its end callback.
  int buckets_started_during_backward() const { return started_during_backward_; }
  // Parameter names per bucket, in launch order (for tests and logs).
  std::vector<std::vector<std::string>> bucket_layout() const;
  const DdpOptions& options() const { return options_; }
  Communicator& communicator() { return communicator_; }

 private:
  struct Bucket;
  DistributedDataParallel(std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers,
                          const std::vector<NamedTensor>& frozen, Communicator& communicator,
                          DdpOptions options);
  void verify_same_model_across_ranks(const std::vector<NamedTensor>& frozen);
  void broadcast_from_rank0(const std::vector<NamedTensor>& tensors);
  void build_buckets();
  void create_shared_buckets(const std::vector<int64_t>& sizes);
  void attach_gradient(size_t index, bool zero);
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void finish_backward();
  void wait_for_buckets();

  nn::Module* module_ = nullptr;
  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  Communicator& communicator_;
  DdpOptions options_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unique_ptr<SharedMemoryAllReduce> shared_;  // the buckets' memory, when shared
  std::string why_not_shared_memory_;
  int started_during_backward_ = 0;
  std::vector<size_t> bucket_of_;      // parameter index -> bucket
  std::vector<bool> ready_;            // parameter index -> marked ready in this backward
  std::vector<int> hook_ids_;
  size_t next_bucket_to_launch_ = 0;
  bool sync_enabled_ = true;
  bool backward_in_progress_ = false;
};

}  // namespace mpigrad::launch
