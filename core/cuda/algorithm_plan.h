// The order in which one cuDNN operation of one shape tries its algorithms, and the fall-back
// from one to the next when a call fails.
//
// Written without cuDNN types (an algorithm and a math type are their enum values as ints), so
// the rules are tested on machines without a GPU (tests/core/test_algorithm_plan.cpp). The cuDNN
// convolution (core/cuda/cudnn_conv.cpp) builds one plan per shape, direction and device from
// cuDNN's heuristics, once, and keeps it: later calls of that shape run plan.current() without
// asking cuDNN again. A call that fails moves the plan on for good, so a broken algorithm costs
// one failed call, not one per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpigrad/core/error.h"

namespace mpigrad::core::cuda_detail {

struct AlgorithmChoice {
  int algorithm = 0;
  int math_type = 0;  // the math type the algorithm needs, set on the descriptor first
  size_t workspace_bytes = 0;
};

class AlgorithmPlan {
 public:
  AlgorithmPlan() = default;
  // `candidates` in order of preference. Repeats (same algorithm and math type) are dropped, and
  // so are candidates whose workspace exceeds `workspace_cap`; describe() names those.
  AlgorithmPlan(const std::vector<AlgorithmChoice>& candidates, size_t workspace_cap) {
    for (const AlgorithmChoice& candidate : candidates) {
      bool repeat = false;
      for (const AlgorithmChoice& kept : choices_) {
        repeat = repeat ||
                 (kept.algorithm == candidate.algorithm && kept.math_type == candidate.math_type);
      }
      if (repeat) continue;
      if (candidate.workspace_bytes > workspace_cap) {
        notes_.push_back(name(candidate) + " needs " + std::to_string(candidate.workspace_bytes) +
                         " bytes of workspace, over the cap of " + std::to_string(workspace_cap));
        continue;
      }
      choices_.push_back(candidate);
    }
  }

  bool exhausted() const { return next_ >= choices_.size(); }
  const AlgorithmChoice& current() const { return choices_.at(next_); }
  size_t remaining() const { return exhausted() ? 0 : choices_.size() - next_; }

  // current() failed with `why`: records it and moves on. False when none is left.
  bool fall_back(const std::string& why) {
    if (exhausted()) return false;
    notes_.push_back(name(current()) + " failed: " + why);
    ++next_;
    return !exhausted();
  }

  // Calls attempt(choice), which returns "" on success or the error, from current() on until one
  // succeeds, and returns the one that did. When every one fails, throws core::Error starting
  // with `what` (text, or a callable that makes it, so a hot caller builds it only then) and
  // listing each failure.
  template <typename What, typename Attempt>
  const AlgorithmChoice& run(const What& what, Attempt&& attempt) {
    if (const AlgorithmChoice* ran = try_run(attempt)) return *ran;
    if constexpr (std::is_invocable_v<const What&>) {
      core::fail(what(), ": no algorithm could run (", describe(), ")");
    } else {
      core::fail(what, ": no algorithm could run (", describe(), ")");
    }
  }

  // As run(), but when every one fails returns null instead of throwing (describe() says why):
  // for a caller that has another way to compute, as the 16-bit convolutions do.
  template <typename Attempt>
  const AlgorithmChoice* try_run(Attempt&& attempt) {
    while (!exhausted()) {
      const std::string error = attempt(current());
      if (error.empty()) return &current();
      fall_back(error);
    }
    return nullptr;
  }

  // What was dropped or failed so far, "; "-separated; "no algorithm suggested" when empty.
  std::string describe() const {
    if (notes_.empty() && choices_.empty()) return "no algorithm suggested";
    std::string text;
    for (const std::string& note : notes_) text += (text.empty() ? "" : "; ") + note;
    return text.empty() ? std::to_string(choices_.size()) + " algorithms usable" : text;
  }

 private:
  static std::string name(const AlgorithmChoice& choice) {
    return "algorithm " + std::to_string(choice.algorithm) + " (math type " +
           std::to_string(choice.math_type) + ")";
  }

  std::vector<AlgorithmChoice> choices_;
  size_t next_ = 0;
  std::vector<std::string> notes_;
};

// How the cuDNN convolutions chose their algorithms so far, over all devices
// (core/cuda/cudnn_conv.cpp): one plan, and one cuDNN heuristics query, per shape and direction,
// never one per call; `fallbacks` counts algorithms left behind after a failed call. Defined only
// in a build with cuDNN.
struct ConvAlgorithmStats {
  int64_t plans = 0;
  int64_t heuristic_queries = 0;
  int64_t fallbacks = 0;
  // The 16-bit (autocast) convolutions: calls cuDNN ran, how many of those on an algorithm whose
  // math type lets it use the tensor cores, and calls widened to fp32 because cuDNN could not.
  int64_t mixed_calls = 0;
  int64_t mixed_tensor_op_calls = 0;
  int64_t mixed_widened_calls = 0;
};
ConvAlgorithmStats cudnn_conv_algorithm_stats();

}  // namespace mpigrad::core::cuda_detail
