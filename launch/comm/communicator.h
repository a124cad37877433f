// The collective operations the rest of mpigrad (gradient buckets, SyncBatchNorm, metrics) needs,
// over one group of ranks. Implementations: MpiCommunicator (host tensors, MPI_I* nonblocking
// collectives) and, with the CUDA backend, NcclCommunicator (device tensors).
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
#include "mpigrad/launch/comm/work.h"

namespace mpigrad::launch {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

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
// arguments here, once, with the same message whichever backend runs it, then calls the
// backend's protected *_impl. A backend checks only what is its own (the MPI count limit, the
// dtypes NCCL moves). Where a tensor must live is device(); a tensor elsewhere is refused here.
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

  WorkPtr barrier_async() { return barrier_async_impl(); }
  void barrier() { barrier_impl(); }

  // A new communicator over the ranks of this one that pass the same color, ordered by key
  // (then by rank). Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;
  // A new communicator over the ranks of this one that share a node (shared memory), or over
  // this rank's block when MPIGRAD_SIMULATE_NODES is set (see simulated_node_count; an error on
  // every rank when the size is not a multiple of K).
  virtual std::unique_ptr<Communicator> split_node_local(std::string name) = 0;

 protected:
  // What a backend implements. The arguments have passed the checks of the public call: defined,
  // contiguous tensors on device(), matching dtypes, counts that fit the operation, a root in
  // range, avg only on floating dtypes, reduce_scatter's buffers not aliased.
  virtual WorkPtr all_reduce_async_impl(const core::Tensor& input, const core::Tensor& output,
                                        ReduceOp op) = 0;
  virtual void all_reduce_impl(const core::Tensor& input, const core::Tensor& output,
                               ReduceOp op) = 0;
  virtual WorkPtr broadcast_async_impl(const core::Tensor& tensor, int root) = 0;
  virtual void broadcast_impl(const core::Tensor& tensor, int root) = 0;
  virtual WorkPtr all_gather_async_impl(const core::Tensor& input, const core::Tensor& output) = 0;
  virtual void all_gather_impl(const core::Tensor& input, const core::Tensor& output) = 0;
  virtual WorkPtr all_gather_v_async_impl(const core::Tensor& input, const core::Tensor& output,
                                          std::span<const int64_t> counts) = 0;
  virtual void all_gather_v_impl(const core::Tensor& input, const core::Tensor& output,
                                 std::span<const int64_t> counts) = 0;
  virtual WorkPtr reduce_scatter_async_impl(const core::Tensor& input, const core::Tensor& output,
                                            ReduceOp op) = 0;
  virtual void reduce_scatter_impl(const core::Tensor& input, const core::Tensor& output,
                                   ReduceOp op) = 0;
  virtual WorkPtr barrier_async_impl() = 0;
  virtual void barrier_impl() = 0;

  // Backends call this once, at construction.
  void place_in_world(std::shared_ptr<const WorldRanks> world) { world_ = std::move(world); }

 private:
  // The checks of the public calls; the messages are built only on failure (communicator.cpp).
  void check_reduce(bool scatter, const core::Tensor& input, const core::Tensor& output,
                    ReduceOp op) const;
  void check_broadcast(const core::Tensor& tensor, int root) const;
  void check_all_gather(const core::Tensor& input, const core::Tensor& output) const;
  void check_all_gather_v(const core::Tensor& input, const core::Tensor& output,
                          std::span<const int64_t> counts) const;

  std::shared_ptr<const WorldRanks> world_;
};

}  // namespace mpigrad::launch
