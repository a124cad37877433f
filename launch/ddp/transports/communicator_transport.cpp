// CommunicatorTransport: one async all-reduce per bucket, cast to and from the wire dtype.
#include "mpigrad/launch/ddp/transports/communicator_transport.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"

namespace mpigrad::launch {

CommunicatorTransport::CommunicatorTransport(Communicator& communicator,
                                             std::span<const BucketSpec> buckets,
                                             std::optional<core::DType> wire)
    : communicator_(communicator), wire_(wire) {
  const int64_t ranks = communicator.size();
  for (const BucketSpec& spec : buckets) {
    const int64_t padded = (spec.numel + ranks - 1) / ranks * ranks;
    Slot slot;
    slot.buffer = core::zeros({padded}, core::TensorOptions(spec.dtype).device(spec.device));
    slots_.push_back(std::move(slot));
  }
}

std::pair<int64_t, int64_t> CommunicatorTransport::shard(size_t index, int rank) const {
  const int64_t length = slots_.at(index).buffer.numel() / communicator_.size();
  return {length * rank, length * (rank + 1)};
}

void CommunicatorTransport::start(size_t index, BucketCollective collective) {
  Slot& slot = slots_.at(index);
  MPIGRAD_CHECK(slot.work == nullptr, communicator_.world_label(),
                " CommunicatorTransport::start: bucket ", index, " is already in flight");
  core::NoGradGuard no_grad;
  slot.collective = collective;
  const auto [begin, end] = shard(index, communicator_.rank());
  if (collective == BucketCollective::AllGather) {
    slot.wire = slot.buffer;
    slot.block = slot.buffer.narrow(0, begin, end - begin).clone();
    slot.work = communicator_.all_gather_async(slot.block, slot.buffer);
    return;
  }
  slot.wire = wire_ && *wire_ != slot.buffer.dtype() ? slot.buffer.to(*wire_) : slot.buffer;
  if (collective == BucketCollective::ReduceScatter) {
    slot.block = core::zeros({end - begin},
                             core::TensorOptions(slot.wire.dtype()).device(slot.buffer.device()));
    slot.work = communicator_.reduce_scatter_async(slot.wire, slot.block, ReduceOp::Avg);
    return;
  }
  slot.work = communicator_.all_reduce_async(slot.wire, ReduceOp::Avg);
}

void CommunicatorTransport::progress() {
  for (Slot& slot : slots_) {
    if (slot.work && !slot.work->test()) break;  // the later ones are behind it
  }
}

void CommunicatorTransport::wait(size_t index) {
  Slot& slot = slots_.at(index);
  if (!slot.work) return;
  slot.work->wait();
  slot.work.reset();
  core::NoGradGuard no_grad;
  if (slot.collective == BucketCollective::ReduceScatter) {
    const auto [begin, end] = shard(index, communicator_.rank());
    slot.buffer.narrow(0, begin, end - begin).copy_(slot.block);
  } else if (!slot.wire.is_same(slot.buffer)) {
    slot.buffer.copy_(slot.wire);
  }
  slot.wire = core::Tensor();
  slot.block = core::Tensor();
}

}  // namespace mpigrad::launch
