// The timeline: spans of what each rank did when (data wait, forward, backward, each gradient
// bucket's averaging, the optimizer step, checkpoint writes), merged from every rank into one
// Chrome trace-event JSON file that Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// Cost. Code that may record holds a `Timeline*` that is null when tracing is off; a Span on a
// null timeline is one predictable branch in its constructor and one in its destructor: no
// clock read, no allocation. On, a span is two steady_clock reads and one push_back of an
// 80-byte event into a vector reserved ahead; names and argument keys are string literals, kept
// as pointers. A rank keeps at most max_events events (the rest are counted as dropped and the
// file says how many), so a long run cannot exhaust memory: trace a short run, as with
// Horovod's timeline.
//
// Clocks. Every rank records steady_clock. start() (collective) leaves a barrier and takes that
// moment as the rank's origin, so ranks agree to within the barrier's exit skew (microseconds on
// one node, about a network latency across nodes). At the end write_merged_timeline() leaves a
// second barrier and rescales each rank's times by rank 0's elapsed time over its own, which
// removes a linear drift between the nodes' clocks (on one node the clocks are the same one and
// the factor is 1).
//
// Spans are host time. On a GPU, forward and backward time the host issuing the work, and a
// NCCL bucket's wait is stream-ordered, so its span ends when the averaging is ordered before
// the optimizer's kernels, not when the GPU has done it.
//
// Output: {"traceEvents": [...]} with one complete event (ph "X", ts and dur in microseconds)
// per span, pid = rank + 1, tid = lane + 1 (lane 0: the training loop; 1 + b: gradient bucket b,
// whose averaging overlaps backward; ids start at 1 because Perfetto reads pid 0 and tid 0 as
// the kernel's swapper), and process_name ("rank N") and thread_name metadata. With `mpigrad
// train --profile` the per-op spans (launch/observe/op_profile.h) join lane 0, nested under the
// loop's stages.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mpigrad/core/profiler.h"

namespace mpigrad::launch {

class Communicator;

struct TimelineEvent {
  const char* name;  // a string literal, or a name that outlives the timeline (an ONNX node's)
  int64_t begin_ns;  // steady_clock
  int64_t duration_ns;
  int32_t lane;       // the trace's tid
  int32_t arg_count;  // how many of the arguments below are set (0 to 2)
  const char* arg_names[2];
  int64_t arg_values[2];
  const char* category = nullptr;  // the trace's "cat" (a profiled span's kind); null: "mpigrad"
  const char* op_type = nullptr;   // an ONNX node's op type, written as the argument "op_type"
};

class Timeline {
 public:
  static constexpr size_t kDefaultMaxEvents = size_t(1) << 20;  // 80 MiB of events
  explicit Timeline(size_t max_events = kDefaultMaxEvents);

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // `name` and the argument names must outlive the timeline (string literals).
  void record(const char* name, int64_t begin_ns, int64_t end_ns, int32_t lane = 0) {
    record(TimelineEvent{name, begin_ns, end_ns - begin_ns, lane, 0, {}, {}});
  }
  void record(const TimelineEvent& event) {
    if (events_.size() < max_events_) [[likely]] {
      events_.push_back(event);
    } else {
      ++dropped_;
    }
  }

  // The lane's name in the trace ("bucket 3 averaging"); lanes without one are "lane N".
  void set_lane_name(int32_t lane, std::string name);

  // Collective over `world`: the common time origin (see the header prose).
  void start(Communicator& world);

  const std::vector<TimelineEvent>& events() const { return events_; }
  size_t dropped() const { return dropped_; }
  int64_t origin_ns() const { return origin_ns_; }

  // This rank's metadata and events as comma-separated JSON objects with pid `rank`, times
  // taken from the origin and multiplied by `scale`.
  std::string render(int rank, double scale = 1.0) const;

 private:
  size_t max_events_;
  size_t dropped_ = 0;
  int64_t origin_ns_;
  std::vector<TimelineEvent> events_;
  std::map<int32_t, std::string> lane_names_;
};

// Times a scope into a timeline, or does nothing when the timeline is null. It is also a stage
// ("phase") of the per-op profile when one records on this thread (core/profiler.h), so the
// loop's stages are rows of `--profile`'s table without a second span in the loop.
class Span {
 public:
  Span(Timeline* timeline, const char* name, int32_t lane = 0) noexcept
      : timeline_(timeline), name_(name), lane_(lane), profile_(name, core::ProfileKind::Phase) {
    if (timeline_ != nullptr) [[unlikely]]
      begin_ns_ = Timeline::now_ns();
  }
  ~Span() {
    if (timeline_ != nullptr) [[unlikely]]
      timeline_->record(name_, begin_ns_, Timeline::now_ns(), lane_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Timeline* timeline_;
  const char* name_;
  int32_t lane_;
  int64_t begin_ns_ = 0;
  core::ProfileSpan profile_;
};

// Collective over `world` (a communicator of host tensors, such as the manager's world): gathers
// every rank's events on rank 0 (Communicator::gather_v, so watched like any collective), which
// writes them as one Chrome trace file at `path` (through a temporary file and a rename).
// Returns the number of spans written on rank 0, 0 on the others. A rank that cannot render
// its events makes every rank throw core::Error (naming it) instead of leaving the others
// waiting; a failed write throws on rank 0, naming the file.
int64_t write_merged_timeline(const Timeline& timeline, Communicator& world,
                              const std::string& path);

}  // namespace mpigrad::launch
