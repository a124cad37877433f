// The collective operations the rest of mpigrad (gradient buckets, SyncBatchNorm, metrics, the
// timeline) needs, over one group of ranks. Implementations: MpiCommunicator (host tensors,
// MPI_I* nonblocking collectives) and, with the CUDA backend, NcclCommunicator (device tensors).
//
// Conventions shared by every implementation (Communicator's public calls check them, once, for
// every backend):
// - Tensors must be contiguous and on device(); the element count of each argument is checked
//   against the operation (for example all_gather's output holds size() x the input) and every
//   rank must pass the same dtype and counts. With MPIGRAD_DEBUG_COLLECTIVES=1 that agreement is
//   verified across ranks before every collective, which turns a mismatch into a clear error
//   instead of garbage or a hang.
// - "In-place" means input and output are the same tensor (or the one-tensor overloads).
// - Avg is sum followed by division by size(); it needs a floating dtype.
// - The blocking form of an operation behaves like its async form followed by wait().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/collective.h"
#include "mpigrad/launch/comm/work.h"

namespace mpigrad::launch {

// Which library moves the bytes. Auto picks NCCL for CUDA tensors and MPI for host tensors.
enum class Backend : uint8_t { Auto, Mpi, Nccl };
inline constexpr core::EnumName<Backend> kBackendNames[] = {
    {Backend::Auto, "auto"}, {Backend::Mpi, "mpi"}, {Backend::Nccl, "nccl"}};
// Parses "auto", "mpi" or "nccl"; throws core::Error listing those on anything else.
Backend parse_backend(std::string_view text);
std::string_view backend_name(Backend backend);

// How collectives guard against hangs and mismatches. from_environment() reads
// MPIGRAD_COLLECTIVE_TIMEOUT (seconds, default 300) and MPIGRAD_DEBUG_COLLECTIVES (1 = on).
struct CollectiveConfig {
  // A rank that waits longer than this in one collective reports which ranks have not arrived
  // and aborts the job. Zero or less disables the watchdog.
  double timeout_seconds = 300.0;
  // Before every collective, check across ranks that all called the same operation with the
  // same dtype and counts (one small extra all-gather per call).
  bool debug_collectives = false;

  static CollectiveConfig from_environment();
};

// MPIGRAD_SIMULATE_NODES=K, for tests and benchmarks of multi-node paths on one machine: every
// split_node_local() then cuts its communicator's ranks into K equal blocks, in rank order, as if
// they were K nodes, instead of asking MPI which ranks share memory (so the node count, local
// ranks, DDP's transport choice and the logs all follow). Returns 0 when unset; throws
// core::Error naming the variable on anything but a positive integer.
int simulated_node_count();

// Where the ranks of one communicator are in mpigrad's world: the communicator the
// DistributedManager was built over (a duplicate of MPI_COMM_WORLD, or of the communicator a
// host code handed over). Every message names ranks by these numbers (rank_label.h), never by
// their rank in a sub-communicator, so that ranks 1 and 3 of an inter-node group read as 1 and
// 3, not as 0 and 1. Computed once when a communicator is created (MPI_Group_translate_ranks
// against its parent, whose own numbers are already the world's), so no message costs a call.
struct WorldRanks {
  int size = 1;                // the world's size
  std::vector<int> of_member;  // of_member[r]: the world rank of rank r of the communicator
  // Each world rank's host name, gathered once by the world and shared by every communicator
  // split from it; null when unknown (a test double).
  std::shared_ptr<const std::vector<std::string>> hosts;

  // The world itself: rank r is world rank r.
  static WorldRanks identity(int size);
  // World rank `world_rank`'s host, or "" when unknown.
  std::string host(int world_rank) const;
};

// The collectives, as the non-virtual interface of tiny-cuda-nn: each public call checks its
// arguments here, once, with the same message whichever backend runs it, describes the call
// (Collective, collective.h), and hands that description to the backend's protected
// run_collective (blocking) or start_collective (async). A backend checks only what is its own
// (the MPI count limit, the dtypes NCCL moves). Where a tensor must live is device(); a tensor
// elsewhere is refused here.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A label used in error messages and timeout reports ("world", "node-local", "group 1 of 2").
  virtual const std::string& name() const = 0;
  virtual Backend backend() const = 0;
  // Where this communicator's tensors must live: the host for MPI, the GPU for NCCL. Code that
  // builds its own small tensors for a collective (DDP's model check, SyncBatchNorm's counts)
  // puts them here.
  virtual core::Device device() const { return core::kCPU; }

  // ---- Ranks in mpigrad's world (WorldRanks above) -------------------------------------------
  // A communicator that was never placed (a test double) is its own world.
  int world_rank() const { return world_rank_of(rank()); }
  int world_size() const { return world_ ? world_->size : size(); }
  // The world rank of rank `member` of this communicator.
  int world_rank_of(int member) const {
    return world_ ? world_->of_member[size_t(member)] : member;
  }
  // "[rank r/w]" in world numbers (launch::rank_label).
  std::string world_label() const;
  // Null until placed; shared with the communicators split from this one.
  const std::shared_ptr<const WorldRanks>& world_ranks() const { return world_; }

  // ---- all_reduce: output[i] = op over ranks of input[i] ---------------------------------------
  WorkPtr all_reduce_async(const core::Tensor& input, const core::Tensor& output,
                           ReduceOp op = ReduceOp::Sum);
  void all_reduce(const core::Tensor& input, const core::Tensor& output,
                  ReduceOp op = ReduceOp::Sum);
  WorkPtr all_reduce_async(const core::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    return all_reduce_async(tensor, tensor, op);
  }
  void all_reduce(const core::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    all_reduce(tensor, tensor, op);
  }

  // ---- broadcast: every rank's tensor becomes root's -------------------------------------------
  WorkPtr broadcast_async(const core::Tensor& tensor, int root);
  void broadcast(const core::Tensor& tensor, int root);

  // ---- all_gather: output = concat over ranks of input (output numel = size() x input) --------
  WorkPtr all_gather_async(const core::Tensor& input, const core::Tensor& output);
  void all_gather(const core::Tensor& input, const core::Tensor& output);

  // ---- all_gather_v: rank r contributes counts[r] elements (zero allowed); output holds
  //      their concatenation in rank order. Every rank passes the same counts. ----------------
  WorkPtr all_gather_v_async(const core::Tensor& input, const core::Tensor& output,
                             std::span<const int64_t> counts);
  void all_gather_v(const core::Tensor& input, const core::Tensor& output,
                    std::span<const int64_t> counts);

  // ---- reduce_scatter: rank r gets block r of the reduction (input numel = size() x output) --
  WorkPtr reduce_scatter_async(const core::Tensor& input, const core::Tensor& output,
                               ReduceOp op = ReduceOp::Sum);
  void reduce_scatter(const core::Tensor& input, const core::Tensor& output,
                      ReduceOp op = ReduceOp::Sum);

  // ---- gather: root's output = concat over ranks of input (output numel = size() x input) ----
  // Only the root receives: on the other ranks `output` is neither checked nor touched, and may
  // be undefined. In place on the root when its input is its block of the output.
  WorkPtr gather_async(const core::Tensor& input, const core::Tensor& output, int root);
  void gather(const core::Tensor& input, const core::Tensor& output, int root);

  // ---- gather_v: rank r sends counts[r] elements (zero allowed); root's output holds their
  //      concatenation in rank order. Every rank passes the same counts; only the root's
  //      output is used, as for gather. -----------------------------------------------------
  WorkPtr gather_v_async(const core::Tensor& input, const core::Tensor& output,
                         std::span<const int64_t> counts, int root);
  void gather_v(const core::Tensor& input, const core::Tensor& output,
                std::span<const int64_t> counts, int root);

  WorkPtr barrier_async();
  void barrier();

  // Runs a collective described elsewhere (by another communicator's public call) through this
  // one's public calls, checked again here: how a communicator that wraps another (a test's
  // recorder, a benchmark's simulated network) forwards what it was asked.
  void run(const Collective& collective);
  WorkPtr start(const Collective& collective);

  // A new communicator over the ranks of this one that pass the same color, ordered by key
  // (then by rank). Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;
  // A new communicator over the ranks of this one that share a node (shared memory), or over
  // this rank's block when MPIGRAD_SIMULATE_NODES is set (see simulated_node_count; an error on
  // every rank when the size is not a multiple of K).
  virtual std::unique_ptr<Communicator> split_node_local(std::string name) = 0;

 protected:
  // What a backend implements: the collective `collective` describes, whose arguments have
  // passed the checks of the public call (collective.h lists them). run_collective returns once
  // it has completed (stream-ordered for NCCL, nccl_communicator.h); start_collective returns a
  // Work while it runs. The description borrows the caller's tensors and counts for the call.
  virtual void run_collective(const Collective& collective) = 0;
  virtual WorkPtr start_collective(const Collective& collective) = 0;

  // Backends call this once, at construction.
  void place_in_world(std::shared_ptr<const WorldRanks> world) { world_ = std::move(world); }

 private:
  // Each public call's checks and description, shared by its blocking and async forms; the
  // messages are built only on failure (communicator.cpp).
  Collective describe_reduce(CollectiveKind kind, const core::Tensor& input,
                             const core::Tensor& output, ReduceOp op) const;
  Collective describe_broadcast(const core::Tensor& tensor, int root) const;
  Collective describe_all_gather(const core::Tensor& input, const core::Tensor& output,
                                 std::span<const int64_t> counts, bool v) const;
  Collective describe_gather(const core::Tensor& input, const core::Tensor& output,
                             std::span<const int64_t> counts, bool v, int root) const;
  // A description from elsewhere (run, start), checked and described again here.
  Collective describe_again(const Collective& collective) const;

  std::shared_ptr<const WorldRanks> world_;
};

}  // namespace mpigrad::launch
