// CommunicatorTransport: one async all-reduce per bucket, cast to and from the wire dtype.
#include "mpigrad/launch/ddp/transports/communicator_transport.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"

namespace mpigrad::launch {

CommunicatorTransport::CommunicatorTransport(Communicator& communicator,
                                             std::span<const BucketSpec> buckets,
                                             std::optional<core::DType> wire)
    : communicator_(communicator), wire_(wire) {
  for (const BucketSpec& spec : buckets) {
    slots_.push_back(
        {core::zeros({spec.numel}, core::TensorOptions(spec.dtype).device(spec.device)), {}, {}});
  }
}

void CommunicatorTransport::start(size_t index) {
  Slot& slot = slots_.at(index);
  MPIGRAD_CHECK(slot.work == nullptr, communicator_.world_label(),
                " CommunicatorTransport::start: bucket ", index, " is already in flight");
  core::NoGradGuard no_grad;
  slot.wire = wire_ && *wire_ != slot.buffer.dtype() ? slot.buffer.to(*wire_) : slot.buffer;
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
  if (!slot.wire.is_same(slot.buffer)) slot.buffer.copy_(slot.wire);
  slot.wire = core::Tensor();
}

}  // namespace mpigrad::launch
