#include "mpigrad/data/device_batch_copier.h"

#include <utility>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda_allocator.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/pinned.h"

namespace mpigrad::data {

namespace {

core::Device checked(core::Device device) {
  MPIGRAD_CHECK(device.is_cuda(), "DeviceBatchCopier: ", device, " is not a CUDA device");
  const core::CudaVisibility& visibility = core::cuda_visibility();
  MPIGRAD_CHECK(!visibility.broken && device.index < visibility.device_count,
                "DeviceBatchCopier: ", device, " is not available: ", visibility.describe());
  return device;
}

}  // namespace

DeviceBatchCopier::DeviceBatchCopier(core::Device device)
    : device_(checked(device)), stream_(device_) {}

StagedBatch DeviceBatchCopier::start(Batch host_batch) const {
  core::NoGradGuard no_grad;
  core::StreamGuard on_copy_stream(stream_.view());
  for (auto& [name, tensor] : host_batch.fields) {
    MPIGRAD_CHECK(tensor.device().is_cpu(), "DataLoader: field '", name, "' is already on ",
                  tensor.device(), "; the dataset and the transform must yield host tensors");
    core::Tensor host = tensor.contiguous();
    if (!core::is_pinned(host)) host = core::pin_memory(host);
    tensor = core::to_async(host, device_);  // allocated on the copy stream, queued there
  }
  StagedBatch staged{std::move(host_batch), std::make_unique<core::Event>()};
  staged.copied->record(stream_.view());
  return staged;
}

Batch DeviceBatchCopier::finish(StagedBatch staged) const {
  const core::StreamView consumer = core::current_stream(device_);
  if (staged.copied) consumer.wait(*staged.copied);
  for (auto& [name, tensor] : staged.batch.fields) core::record_stream(tensor, consumer);
  return std::move(staged.batch);
}

}  // namespace mpigrad::data
