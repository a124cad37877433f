// CUDA graphs: the kernels and copies a piece of code queues on one stream, recorded once and
// replayed with one launch, which removes the per-kernel launch cost of a small model's step.
//
// capture() runs the code with the stream in capture mode: nothing executes, every op queued on
// the stream becomes a node of the graph, and every allocation made on it comes from a memory pool
// that belongs to the graph (core/cuda_allocator.h), so a replay writes to the same addresses the
// capture saw. The tensors the code leaves behind (a loss, the gradients) therefore keep their
// meaning: each replay refills them. What a replay reads must stay where it was at capture time,
// inputs included, and host values baked into kernel arguments (a learning rate, a random seed)
// are the capture's forever; that is why callers keep the optimizer step and anything random out
// of the graph.
//
// Code that cannot be captured (it waits for the device, reads a value back, or makes a host
// decision from device data) fails the capture instead of running: capture() then returns false
// with the reason, having executed nothing, and the caller runs the code the ordinary way. The
// device-side checks (core/device_checks.h) are not queued during a capture, so replays do not
// report them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mpigrad/core/stream.h"

namespace mpigrad::core {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();  // waits for the graph's last replay, then returns its memory
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records what `work` queues on `stream` (which must be a Stream of mpigrad's, not the legacy
  // default stream, and current for this thread while `work` runs). Returns true when the graph
  // is ready to replay. Returns false, with `why` set, when `work` threw or did something a
  // graph cannot hold; nothing of it ran then, and the graph stays empty. Replaces an earlier
  // capture.
  bool capture(StreamView stream, const std::function<void()>& work, std::string* why);
  // Queues the recorded work on `stream` (the capture's or another of the same device).
  void replay(StreamView stream) const;
  bool captured() const { return exec_ != nullptr; }

 private:
  void reset() noexcept;

  Device device_ = cuda(0);
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  uint64_t pool_ = 0;      // the caching allocator's pool of this graph; 0: none
};

}  // namespace mpigrad::core
