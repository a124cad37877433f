// An embedded model's forward, loss and backward as one CUDA graph ([train] cuda_graphs = true),
// as TorchFort's enable_cuda_graphs does: after `warmup` ordinary steps, the next step is captured
// (core/cuda_graph.h) and later steps replay it with one launch, when their arrays lie where the
// captured ones lay. The optimizer step, clipping and the schedule stay outside the graph, so a
// changing learning rate is honoured.
//
// Every step of such a model runs on a stream of its own, ordered after the caller's stream and
// before the caller's later work with events: the legacy default stream cannot be captured, and
// nothing waits on the host.
//
// The gradients the capture allocates belong to the graph, and each replay rewrites them, so
// once captured they are zeroed in place, never dropped (CudaGraphHook's optimizer step). A step
// whose arrays moved runs eagerly into the same gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/cuda_graph.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::launch {

class CapturedStep {
 public:
  // What run() asks of the gradients: undefined (a capture allocates its own) or zero in place
  // (an eager step after the capture adds into the graph's).
  enum class GradientReset : uint8_t { Drop, Zero };

  CapturedStep(core::Device device, int64_t warmup);

  // Makes the step's stream current, after the caller's work; on destruction the caller's
  // stream waits for the step and becomes current again.
  class Scope {
   public:
    explicit Scope(CapturedStep& step);
    // Orders the caller's stream after the step; throws on a CUDA error.
    void finish();
    ~Scope();  // without finish() (on an error): orders it as well as it can, never throws
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CapturedStep& step_;
    core::StreamView caller_;
    std::optional<core::StreamGuard> guard_;
    bool finished_ = false;
  };

  // What `compute` (forward, loss and backward; it returns the detached loss) gives for this
  // step: a replay of the graph when `arrays` (the step's inputs, all used in place, not copies)
  // lie where the captured ones lay; a capture once `warmup` steps have run; else `compute`
  // itself. Inside a Scope.
  core::Tensor run(const std::vector<core::Tensor>& arrays, bool arrays_in_place,
                   const std::function<core::Tensor()>& compute,
                   const std::function<void(GradientReset)>& reset_gradients);

  // Whether the gradients belong to the graph (zero them in place, never drop them).
  bool captured() const { return graph_.captured(); }
  int64_t replays() const { return replays_; }
  // Why a capture failed (and graphs are off for this model from then on); "" if none did.
  const std::string& failure() const { return failure_; }

 private:
  struct ArrayPlace {
    const void* data;
    core::Shape shape;
    core::DType dtype;
    bool operator==(const ArrayPlace&) const = default;
  };
  static std::vector<ArrayPlace> places(const std::vector<core::Tensor>& arrays);

  core::Stream stream_;
  core::Event before_, after_;
  int64_t warmup_;
  int64_t eager_steps_ = 0;
  int64_t replays_ = 0;
  core::CudaGraph graph_;
  core::Tensor loss_;  // the captured loss, rewritten by each replay
  std::vector<ArrayPlace> captured_places_;
  std::string failure_;
};

}  // namespace mpigrad::launch
