// How the DataLoader's `device` option (data/data_loader.h) moves a batch from the host to a GPU
// without making either side wait.
// - start(), in the thread that loaded the batch: each field is staged in pinned host memory (a
//   field that is pinned already is used as it is) and copied to the device with a non_blocking
//   copy on the copier's own copy stream; an event is recorded after the copies. The pinned
//   staging buffers are freed at once: the pinned allocator keeps a buffer out of reuse until
//   the copy that reads it has finished (core/pinned.h), so the next batch cannot overwrite it.
// - finish(), in the thread that takes the batch: that thread's current stream of the device
//   waits for the event (on the GPU; the host goes on), and each field is recorded as used on that
//   stream (core::record_stream), so the caching allocator, which gave the field its memory on
//   the copy stream, reuses that memory only after the consuming stream is done with it.
// Ops queued on the consuming stream after finish() see the copied data. The batch's indices and
// dataset_index stay on the host (bookkeeping, not model input). Destroying the copier destroys
// its stream, which waits for the copies in flight (core/stream.h).
#pragma once

#include <memory>

#include "mpigrad/core/device.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/data/batch.h"

namespace mpigrad::data {

// A batch whose fields are being copied to a device; `copied` marks the end of the copies (null
// when nothing was copied).
struct StagedBatch {
  Batch batch;
  std::unique_ptr<core::Event> copied;
};

class DeviceBatchCopier {
 public:
  // Creates the copy stream on `device`, a visible CUDA device (core::Error otherwise).
  explicit DeviceBatchCopier(core::Device device);

  core::Device device() const { return device_; }
  core::StreamView copy_stream() const { return stream_.view(); }

  // Stages and queues the copies of `host_batch`'s fields; thread-safe.
  StagedBatch start(Batch host_batch) const;
  // Orders the calling thread's current stream of the device after the copies; returns the batch.
  Batch finish(StagedBatch staged) const;

 private:
  core::Device device_;
  core::Stream stream_;
};

}  // namespace mpigrad::data
