// The CUDA-graph step of an embedded model (launch/train/captured_step.h).
#include "mpigrad/launch/train/captured_step.h"

namespace mpigrad::launch {

CapturedStep::CapturedStep(core::Device device, int64_t warmup)
    : stream_(device), warmup_(warmup) {}

CapturedStep::Scope::Scope(CapturedStep& step)
    : step_(step), caller_(core::current_stream(step.stream_.device())) {
  step_.before_.record(caller_);
  step_.stream_.wait(step_.before_);
  guard_.emplace(step_.stream_.view());
}

void CapturedStep::Scope::finish() {
  guard_.reset();
  step_.after_.record(step_.stream_);
  caller_.wait(step_.after_);
  finished_ = true;
}

CapturedStep::Scope::~Scope() {
  if (finished_) return;
  guard_.reset();
  // Leaving on an error: the caller's later work must still come after the step's.
  try {
    step_.after_.record(step_.stream_);
    caller_.wait(step_.after_);
  } catch (...) {
    try {
      step_.stream_.synchronize();
    } catch (...) {  // the runtime is failing; the error being thrown says more than this would
    }
  }
}

std::vector<CapturedStep::ArrayPlace> CapturedStep::places(
    const std::vector<core::Tensor>& arrays) {
  std::vector<ArrayPlace> result;
  result.reserve(arrays.size());
  for (const core::Tensor& array : arrays) {
    result.push_back({array.data_ptr(), array.shape(), array.dtype()});
  }
  return result;
}

core::Tensor CapturedStep::run(const std::vector<core::Tensor>& arrays, bool arrays_in_place,
                               const std::function<core::Tensor()>& compute,
                               const std::function<void(GradientReset)>& reset_gradients) {
  const std::vector<ArrayPlace> now = places(arrays);
  if (graph_.captured()) {
    if (arrays_in_place && now == captured_places_) {
      graph_.replay(stream_);
      ++replays_;
      return loss_;
    }
    // The graph reads the captured addresses: this step runs as it is, into the graph's
    // gradients, which hold the last replay's values until zeroed.
    reset_gradients(GradientReset::Zero);
    ++eager_steps_;
    return compute();
  }
  if (failure_.empty() && arrays_in_place && eager_steps_ >= warmup_) {
    // Gradients made during the capture come from the graph's pool, and stay the graph's.
    reset_gradients(GradientReset::Drop);
    core::Tensor loss;
    std::string why;
    if (graph_.capture(
            stream_, [&] { loss = compute(); }, &why)) {
      loss_ = loss;
      captured_places_ = now;
      graph_.replay(stream_);  // the capture itself ran nothing
      ++replays_;
      return loss_;
    }
    failure_ = why.empty() ? "the capture failed" : why;
    reset_gradients(GradientReset::Drop);  // whatever the failed capture left was never computed
  }
  ++eager_steps_;
  return compute();
}

}  // namespace mpigrad::launch
