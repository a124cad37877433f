// The per-op profile: collects the spans core/profiler.h records (core ops, backend kernels,
// autograd nodes, ONNX nodes, optimizer steps, the training loop's stages) into one row per name,
// and prints them as a table in the manner of PyTorch profiler's key_averages(): calls, self and
// total time, their shares of the profiled time, time per call and GFLOP/s. `mpigrad train
// --profile` prints it on rank 0 at the end (docs/observability.md, "Profiling").
//
// Rows. Spans with the same name, kind and detail (an ONNX node's op type) are one row, whatever
// the address of their name. A row's total time is the sum of its spans' durations; its self time
// leaves out the spans nested in them, so the self times of all rows add up to the time spent
// inside any span, and no time is counted twice. A row's FLOPs are those of its spans and of the
// spans nested in them (an ONNX Conv node holds its kernel's), and GFLOP/s is FLOPs over total
// time. A span nested in a span of its own row (a recursion) counts in that row's total twice, as
// in PyTorch's table.
//
// Trace. Given a Timeline, every span but the loop's stages (which the loop records itself) is
// also written to it, on the training-loop lane, so `--trace` with `--profile` shows each op
// nested under "forward", "backward" and "optimizer step"; its category is the span's kind and
// an ONNX node carries its op type as an argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "mpigrad/core/profiler.h"

namespace mpigrad::launch {

class Timeline;

struct OpProfileRow {
  std::string name;
  std::string detail;  // an ONNX node's op type; empty otherwise
  core::ProfileKind kind = core::ProfileKind::Op;
  int64_t calls = 0;
  int64_t self_ns = 0;
  int64_t total_ns = 0;
  double flops = 0;  // over every call, nested spans' included; 0: not counted

  // "onnx:Conv", "backward", "kernel", ...
  std::string type() const;
  double gflops_per_second() const;  // 0 when no FLOPs were counted
};

// What one profiled run gives: its rows and the time they are shares of.
struct OpProfileReport {
  std::vector<OpProfileRow> rows;  // in first-seen order
  int64_t wall_ns = 0;             // the profiled time: from start to end, less paused_ns
  int64_t paused_ns = 0;           // time not profiled (validation)
  int64_t steps = 0;               // optimizer steps in it, for the heading (0: not said)
  int64_t dropped = 0;             // spans the collector could not keep (out of memory)
};

struct OpProfileTableOptions {
  size_t max_rows = 30;  // the rows with the most self time; the total line counts every row
  int rank = 0;          // for the heading
};

class OpProfile final : public core::ProfileSink {
 public:
  // With a timeline, spans other than the loop's stages are written to it too (lane 0).
  explicit OpProfile(Timeline* timeline = nullptr) : timeline_(timeline) {}

  void record(const core::ProfileEvent& event) noexcept override;

  const std::vector<OpProfileRow>& rows() const { return rows_; }
  int64_t spans() const { return spans_; }
  int64_t dropped() const { return dropped_; }

 private:
  struct PointerKey {
    const char* name;
    const char* detail;
    core::ProfileKind kind;
    bool operator==(const PointerKey&) const = default;
  };
  struct PointerHash {
    size_t operator()(const PointerKey& key) const noexcept;
  };
  size_t row_for(const core::ProfileEvent& event);

  Timeline* timeline_;
  std::vector<OpProfileRow> rows_;
  // Names are compared by address first (one lookup per span); a new address is matched by text,
  // since the same literal may sit at two addresses (one per translation unit).
  std::unordered_map<PointerKey, size_t, PointerHash> by_address_;
  std::map<std::tuple<std::string, std::string, int>, size_t> by_text_;
  int64_t spans_ = 0;
  int64_t dropped_ = 0;
};

// Records this thread's spans into an OpProfile from construction to finish(): the session that
// `mpigrad train --profile` wraps around training.
class OpProfiler {
 public:
  explicit OpProfiler(Timeline* timeline = nullptr);
  // Ends recording (idempotent) and returns what was recorded.
  OpProfileReport finish(int64_t steps = 0);

 private:
  OpProfile profile_;
  std::unique_ptr<core::ProfileSession> session_;
  OpProfileReport report_;
};

// The table: a heading, one line per row (the max_rows with the most self time, most first), and
// a total line. Names longer than the column keep their end ("...layer1.0/conv1/Conv").
std::string format_op_profile(const OpProfileReport& report,
                              const OpProfileTableOptions& options = {});

// Every row as JSON: {"wall_s", "paused_s", "steps", "rows": [{"name", "type", "kind",
// "op_type", "calls", "self_s", "total_s", "self_share", "total_share", "flops", "gflops_per_s"}]}.
std::string op_profile_json(const OpProfileReport& report);

}  // namespace mpigrad::launch
