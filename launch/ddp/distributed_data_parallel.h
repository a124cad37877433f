// Data-parallel gradient averaging that overlaps communication with backward, after PyTorch's
// DDP Reducer. At construction it checks that every rank holds the same parameters (names,
// shapes, dtypes), broadcasts rank 0's parameters and buffers, and lays the gradients out in
// buckets: each parameter's .grad becomes a view into one flat bucket buffer, so no copy is
// needed to communicate it. Buckets are cut by size in reverse registration order (about the
// order in which backward produces gradients), the first one small so communication starts
// early. After the first synced backward they are rebuilt once in the order the gradients
// actually became ready there, rank 0's order for every rank, as PyTorch does (not with
// find_unused_parameters, whose order may change from step to step).
//
// During backward each parameter's grad-ready hook marks it ready; when a bucket's last
// parameter is ready its averaging starts at once, in bucket order (every rank must issue
// collectives in the same order). How a bucket is averaged is its transport's business
// (launch/ddp/bucket_transport.h), chosen once in launch/ddp/transport_choice.h: in shared
// memory on one node, hierarchically across nodes (shared memory in the node, a communication
// thread between nodes), or through the communicator's async all-reduce (NCCL on GPUs). A
// callback queued on the autograd engine runs after the last gradient: it deals with parameters
// that got no gradient, then waits for the buckets, so when backward() returns every .grad holds
// the average over ranks.
//
// The found-inf flag under ZeRO-1 (DdpOptions::carry_found_inf). fp16 loss scaling skips a step
// whose gradients overflowed, and every rank must skip the same steps. Plain averaging carries
// the overflow by itself (inf and NaN survive a sum), but a reduce-scatter leaves each rank its
// shard only: an inf that rank 0 contributes to rank 1's shard is invisible to rank 0, which
// would step while rank 1 skips. So before each bucket starts, each rank folds it into a running
// local flag, sum(bucket * ranks * 0): 0, or NaN once any element so far was inf or NaN, or so
// large that a sum over the ranks could overflow in the reduce-scatter (which no rank but the
// owner would see either). Under compression the elements are taken as the wire carries them, so
// a gradient beyond fp16's 65504 (or a sum over the ranks beyond it) counts: a little stricter
// than plain DDP, which skips only when the sum it gets did overflow. Before the last
// bucket starts, the flag is added to the first element of every rank's shard of it (adding 0
// changes nothing; NaN poisons a step that is lost anyway). The reduce-scatter sums those
// elements over the ranks, so every rank's shard holds a NaN exactly when some rank's gradients
// were not finite, and its own shard's check (ZeroRedundancyOptimizer::unscale_) agrees with
// every other rank's. No collective is added and nothing waits on the host: the flag is a
// device scalar, and the shards' sums are read after the wait that ZeRO-1 has anyway. The last
// bucket is padded (a zero tail no parameter uses) so that every rank's shard of it is
// non-empty on every transport. Rejected: one extra element per shard in every bucket (it would
// split the parameters' contiguous gradient views at shard boundaries that only the transport
// knows), and a separate flag bucket (one more collective per step, with its latency).
//
// Invariants:
// - .grad of every parameter is a view into its bucket, kept by DDP across steps; zero_grad may
//   zero it in place or reset it (set_to_none): prepare_for_backward then zeroes each bucket
//   whose gradients were all reset with one fill and hands the same views back.
// - Collectives are issued in the same order on every rank: bucket 0, 1, 2, ...
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/ddp/bucket_transport.h"
#include "mpigrad/launch/ddp/transport_choice.h"

namespace mpigrad::nn {
class Module;
}

namespace mpigrad::launch {

class Timeline;

// Gradient compression: what crosses the network is rounded to a 16-bit float. The communicator
// transport casts the whole bucket for its all-reduce and back after; across nodes the
// hierarchical transport rounds only its inter-node step (launch/ddp/transport_choice.h).
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
  // Host buckets may be averaged in shared memory (on one node, or inside each node of a
  // hierarchical averaging); false sends every bucket through the communicator.
  bool shared_memory = true;
  // Auto chooses by the gradients' device and the node layout (launch/ddp/transport_choice.h);
  // a named transport is required, and an error on every rank when it cannot be had.
  TransportKind transport = TransportKind::Auto;
  // How long a rank waits for the other ranks of its node in the shared-memory steps before it
  // fails naming them (the communicators' watchdogs time everything that goes through MPI);
  // <= 0: no bound. Defaults to MPIGRAD_COLLECTIVE_TIMEOUT, else 300 s, like the communicators.
  double timeout_seconds = CollectiveConfig::from_environment().timeout_seconds;
  // ZeRO-1 (launch/ddp/zero_redundancy.h): buckets are reduce-scattered instead of averaged, so
  // after backward each rank holds the average only in its shard of each bucket; the buckets
  // keep their first layout (no rebuild: the shards, and the optimizer state cut by them, stay).
  bool zero = false;
  // ZeRO-1 with fp16 loss scaling: a non-finite gradient on any rank reaches every rank's shard
  // (see "The found-inf flag under ZeRO-1" above), so every rank's ZeroRedundancyOptimizer sees
  // the same overflow after the reduce-scatter. Costs one bucket-sized temporary and three passes
  // over each bucket per synced step (four under compression: the cast first).
  bool carry_found_inf = false;
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
  // Which transport averages the buckets, and one line for the log saying how and why.
  TransportKind transport_kind() const { return transport_kind_; }
  const std::string& transport_description() const { return transport_description_; }
  // Buckets whose averaging started before the last synced backward reached its end callback.
  int buckets_started_during_backward() const { return started_during_backward_; }
  // Whether the buckets were rebuilt in the order the gradients became ready.
  bool buckets_rebuilt() const { return buckets_rebuilt_; }
  // Parameter names per bucket, in launch order (for tests and logs).
  std::vector<std::vector<std::string>> bucket_layout() const;
  const DdpOptions& options() const { return options_; }
  // The layout ZeRO-1 steps and gathers by: the parameters DDP averages, and per bucket the
  // indices of its parameters into parameters(), their element offsets in its buffer, and the
  // buffer (the gradients, back to back).
  const std::vector<NamedTensor>& parameters() const { return parameters_; }
  const std::vector<size_t>& bucket_parameters(size_t bucket) const;
  const std::vector<int64_t>& bucket_offsets(size_t bucket) const;
  const core::Tensor& bucket_buffer(size_t bucket) const;
  BucketTransport& transport() { return *transport_; }
  Communicator& communicator() { return communicator_; }
  // Records each bucket's averaging, from its start to the return of its wait, on lane 1 + its
  // index (launch/observe/timeline.h); null stops recording. The timeline must outlive this.
  void set_timeline(Timeline* timeline);

 private:
  struct Bucket;
  // Where a parameter's gradient lives: bucket, and its index inside the bucket.
  struct Slot {
    uint32_t bucket = 0;
    uint32_t index = 0;
  };
  DistributedDataParallel(std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers,
                          const std::vector<NamedTensor>& frozen, Communicator& communicator,
                          DdpOptions options);
  void verify_same_model_across_ranks(const std::vector<NamedTensor>& frozen);
  void broadcast_from_rank0(const std::vector<NamedTensor>& tensors);
  std::vector<std::unique_ptr<Bucket>> plan_buckets(const std::vector<size_t>& order) const;
  void install_buckets(std::vector<std::unique_ptr<Bucket>> buckets);
  void rebuild_buckets_once();
  const core::Tensor& view_of(size_t index) const;
  void attach_gradient(size_t index);
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void carry_found_inf(size_t bucket);
  void finish_backward();
  void wait_for_buckets();
  void name_timeline_lanes();
  void record_bucket_span(size_t bucket);

  nn::Module* module_ = nullptr;
  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  Communicator& communicator_;
  DdpOptions options_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unique_ptr<BucketTransport> transport_;  // owns the buckets' memory
  TransportKind transport_kind_ = TransportKind::Communicator;
  std::string transport_description_;
  int started_during_backward_ = 0;
  std::vector<Slot> slot_of_;        // parameter index -> its place in the buckets
  std::vector<bool> ready_;          // parameter index -> marked ready in this backward
  std::vector<size_t> ready_order_;  // this synced backward's ready order, until the rebuild
  bool buckets_rebuilt_ = false;
  std::vector<int> hook_ids_;
  size_t next_bucket_to_launch_ = 0;
  bool sync_enabled_ = true;
  bool backward_in_progress_ = false;
  Timeline* timeline_ = nullptr;
  std::vector<int64_t> bucket_started_ns_;  // with a timeline: when each bucket started, or -1
  core::Tensor found_inf_;  // carry_found_inf: this synced backward's running flag (0 or NaN)
};

}  // namespace mpigrad::launch
