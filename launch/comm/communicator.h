// defines: ReduceOp, Backend, Communicator, parse_backend, reduce_op_name
//
// The collective operations the rest of mpigrad (gradient buckets, SyncBatchNorm, metrics) needs,
// over one group of ranks. Implementations: MpiCommunicator (host tensors, MPI_I* nonblocking
// collectives) and, with the CUDA backend, NcclCommunicator (device tensors).
//
// Conventions shared by every implementation:
// - Tensors must be contiguous; the element count of each argument is checked against the
//   operation (for example all_gather's output holds size() x the input) and every rank must
//   pass the same dtype and counts. With MPIGRAD_DEBUG_COLLECTIVES=1 that agreement is verified
//   across ranks before every collective, which turns a mismatch into a clear error instead of
//   garbage or a hang.
// - "In-place" means input and output are the same tensor (or the one-tensor overloads).
// - Avg is sum followed by division by size(); it needs a floating dtype.
// - The blocking form of an operation behaves like its async form followed by wait().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "mpigrad/core/tensor.h"
#include "mpigrad/core/enum_names.h"
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

  // ---- all_reduce: output[i] = op over ranks of input[i] ---------------------------------------
  virtual WorkPtr all_reduce_async(const core::Tensor& input, const core::Tensor& output,
                                   ReduceOp op = ReduceOp::Sum) = 0;
  virtual void all_reduce(const core::Tensor& input, const core::Tensor& output,
                          ReduceOp op = ReduceOp::Sum) = 0;
  WorkPtr all_reduce_async(const core::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    return all_reduce_async(tensor, tensor, op);
  }
  void all_reduce(const core::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    all_reduce(tensor, tensor, op);
  }

  // ---- broadcast: every rank's tensor becomes root's -------------------------------------------
  virtual WorkPtr broadcast_async(const core::Tensor& tensor, int root) = 0;
  virtual void broadcast(const core::Tensor& tensor, int root) = 0;

  // ---- all_gather: output = concat over ranks of input (output numel = size() x input) --------
  virtual WorkPtr all_gather_async(const core::Tensor& input, const core::Tensor& output) = 0;
  virtual void all_gather(const core::Tensor& input, const core::Tensor& output) = 0;

  // ---- all_gather_v: rank r contributes counts[r] elements (zero allowed); output holds
  //      their concatenation in rank order. Every rank passes the same counts. ----------------
  virtual WorkPtr all_gather_v_async(const core::Tensor& input, const core::Tensor& output,
                                     std::span<const int64_t> counts) = 0;
  virtual void all_gather_v(const core::Tensor& input, const core::Tensor& output,
                            std::span<const int64_t> counts) = 0;

  // ---- reduce_scatter: rank r gets block r of the reduction (input numel = size() x output) --
  virtual WorkPtr reduce_scatter_async(const core::Tensor& input, const core::Tensor& output,
                                       ReduceOp op = ReduceOp::Sum) = 0;
  virtual void reduce_scatter(const core::Tensor& input, const core::Tensor& output,
                              ReduceOp op = ReduceOp::Sum) = 0;

  virtual WorkPtr barrier_async() = 0;
  virtual void barrier() = 0;

  // A new communicator over the ranks of this one that pass the same color, ordered by key
  // (then by rank). Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;
  // A new communicator over the ranks of this one that share a node (shared memory), or over
  // this rank's block when MPIGRAD_SIMULATE_NODES is set (see simulated_node_count; an error on
  // every rank when the size is not a multiple of K).
  virtual std::unique_ptr<Communicator> split_node_local(std::string name) = 0;
};

}  // namespace mpigrad::launch
