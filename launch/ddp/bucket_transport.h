// How DistributedDataParallel averages its gradient buckets: one interface, with one
// implementation per way of moving the bytes, picked once per run by choose_bucket_transport
// (launch/ddp/transport_choice.h), so the bucket logic never asks which one it has:
//   SharedMemoryAllReduce   host buckets, every rank on one node
//                           (launch/ddp/transports/shared_memory_all_reduce.h)
//   HierarchicalAllReduce   host buckets on several nodes
//   (launch/ddp/transports/hierarchical_all_reduce.h) CommunicatorTransport   the communicator's
//   async all-reduce: NCCL on GPUs, flat MPI otherwise
//                           (launch/ddp/transports/communicator_transport.h)
// A transport owns the buckets' memory: DDP's gradients are views of buffer(b), so nothing is
// copied between the gradients and what gets averaged.
//
// Contract, for every implementation:
// - every rank starts the buckets in the same order, and starts a bucket again only after wait()
//   on it returned (DDP keeps this);
// - between start(b) and the return of wait(b) the caller leaves buffer(b) alone;
// - wait(b) returns at once for a bucket that is not in flight; otherwise it returns once the
//   collective it was started with is done:
//     Average        buffer(b) holds the average over the ranks, bitwise the same on every rank;
//     ReduceScatter  this rank's shard(b, rank) of buffer(b) holds that average (ZeRO-1's
//                    gradients); the rest of buffer(b) holds anything;
//     AllGather      every rank's shard of buffer(b), as its owner had it at start(b), in every
//                    rank's buffer(b) (ZeRO-1's parameters);
// - shards are contiguous element ranges, one per rank, that together cover the bucket's numel
//   elements; which rank owns which range is the transport's business (the hierarchical one
//   cuts each node's shard again per node), so callers ask shard() and never compute it;
// - a failure is a core::Error that names the ranks and what to do. The shared-memory transports
//   stay failed: every later call repeats the error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::launch {

// What start() asks of the ranks for one bucket (see the contract above).
enum class BucketCollective : uint8_t { Average, ReduceScatter, AllGather };

// A bucket as DDP lays it out: numel elements of one dtype on one device.
struct BucketSpec {
  core::DType dtype = core::kFloat32;
  core::Device device = core::kCPU;
  int64_t numel = 0;
};

class BucketTransport {
 public:
  virtual ~BucketTransport() = default;
  BucketTransport() = default;
  BucketTransport(const BucketTransport&) = delete;
  BucketTransport& operator=(const BucketTransport&) = delete;

  virtual size_t buffer_count() const = 0;
  // Bucket `index`'s memory: a flat contiguous tensor of at least the bucket's numel elements
  // (a transport may pad it; the padding stays zero), zero at creation.
  virtual const core::Tensor& buffer(size_t index) const = 0;
  // This rank's bucket `index` holds its contribution: the collective may begin.
  virtual void start(size_t index, BucketCollective collective) = 0;
  void start(size_t index) { start(index, BucketCollective::Average); }
  // The element range [first, second) of bucket `index` that `rank` owns under ReduceScatter
  // and AllGather; it may reach into the padding, and may be empty.
  virtual std::pair<int64_t, int64_t> shard(size_t index, int rank) const = 0;
  // Gives the transport a chance to move started buckets along; DDP calls it from every
  // gradient hook. Never blocks. A transport that progresses on its own does nothing here.
  virtual void progress() = 0;
  // Returns once bucket `index` holds the average (at once if it is not in flight).
  virtual void wait(size_t index) = 0;
  virtual bool in_flight(size_t index) const = 0;
};

}  // namespace mpigrad::launch
