// The bucket transport (launch/ddp/bucket_transport.h) that hands each bucket to the
// communicator's asynchronous all-reduce (average): NCCL's on GPUs, MPI_Iallreduce on the host
// when neither shared-memory transport applies. With a 16-bit wire dtype (DDP's gradient
// compression) a bucket is cast for the all-reduce and cast back when it completes.
//
// ZeRO-1's collectives map onto the communicator's own: ReduceScatter on its reduce-scatter
// (average) into a shard-sized tensor copied into the shard on wait, AllGather on its all-gather
// from a copy of the shard (the communicators take no aliased buffers). Buckets are padded to a
// multiple of the rank count so every shard has one length, as reduce-scatter wants; shard r is
// the r-th of those equal ranges. Parameters are never gathered in the wire dtype: compression
// applies to gradients only.
//
// Progress is the communicator's: NCCL runs on its own stream; MPI's nonblocking schedules
// advance only inside MPI calls, so progress() tests the buckets in flight, in order, and DDP
// calls it from every gradient hook (launch/comm/mpi_communicator.h has the measurements).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/ddp/bucket_transport.h"

namespace mpigrad::launch {

class CommunicatorTransport final : public BucketTransport {
 public:
  // Zeroed buckets on each spec's device; `wire` is the dtype to communicate in, if not the
  // bucket's own. Not collective.
  CommunicatorTransport(Communicator& communicator, std::span<const BucketSpec> buckets,
                        std::optional<core::DType> wire = std::nullopt);
  // A bucket still in flight is waited for by its Work's destructor (a collective cannot be
  // cancelled, and its buffers must outlive it).
  ~CommunicatorTransport() override = default;

  size_t buffer_count() const override { return slots_.size(); }
  const core::Tensor& buffer(size_t index) const override { return slots_.at(index).buffer; }
  using BucketTransport::start;
  void start(size_t index, BucketCollective collective) override;
  std::pair<int64_t, int64_t> shard(size_t index, int rank) const override;
  void progress() override;
  void wait(size_t index) override;
  bool in_flight(size_t index) const override { return slots_.at(index).work != nullptr; }

 private:
  struct Slot {
    core::Tensor buffer;
    core::Tensor wire;   // what goes over the network: the buffer itself, or its 16-bit copy
    core::Tensor block;  // ReduceScatter's result, AllGather's input: one shard
    BucketCollective collective = BucketCollective::Average;
    WorkPtr work;  // until wait() has succeeded
  };
  Communicator& communicator_;
  std::optional<core::DType> wire_;
  std::vector<Slot> slots_;
};

}  // namespace mpigrad::launch
