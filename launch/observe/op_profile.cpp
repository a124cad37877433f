#include "mpigrad/launch/observe/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>

#include "mpigrad/launch/observe/json_text.h"
#include "mpigrad/launch/observe/timeline.h"

namespace mpigrad::launch {

std::string OpProfileRow::type() const {
  if (kind == core::ProfileKind::OnnxNode && !detail.empty()) return "onnx:" + detail;
  return core::profile_kind_name(kind);
}

double OpProfileRow::gflops_per_second() const {
  return flops > 0 && total_ns > 0 ? flops / double(total_ns) : 0.0;  // FLOP per ns is GFLOP/s
}

size_t OpProfile::PointerHash::operator()(const PointerKey& key) const noexcept {
  const size_t a = std::hash<const void*>()(key.name);
  const size_t b = std::hash<const void*>()(key.detail);
  return a ^ (b * 0x9e3779b97f4a7c15ull) ^ (size_t(key.kind) << 7);
}

size_t OpProfile::row_for(const core::ProfileEvent& event) {
  const PointerKey key{event.name, event.detail, event.kind};
  auto found = by_address_.find(key);
  if (found != by_address_.end()) return found->second;
  std::string name = event.name != nullptr ? event.name : "";
  std::string detail = event.detail != nullptr ? event.detail : "";
  auto [text, inserted] =
      by_text_.try_emplace(std::make_tuple(name, detail, int(event.kind)), rows_.size());
  if (inserted) {
    OpProfileRow row;
    row.name = std::move(name);
    row.detail = std::move(detail);
    row.kind = event.kind;
    rows_.push_back(std::move(row));
  }
  by_address_.emplace(key, text->second);
  return text->second;
}

void OpProfile::record(const core::ProfileEvent& event) noexcept {
  try {
    OpProfileRow& row = rows_[row_for(event)];
    ++row.calls;
    row.self_ns += event.self_ns;
    row.total_ns += event.end_ns - event.begin_ns;
    row.flops += event.flops;
    ++spans_;
    // The loop's stages are the loop's own spans in the trace (launch/observe/timeline.h).
    if (timeline_ != nullptr && event.kind != core::ProfileKind::Phase) {
      TimelineEvent span{event.name, event.begin_ns, event.end_ns - event.begin_ns, 0, 0, {}, {}};
      span.category = core::profile_kind_name(event.kind);
      span.op_type = event.detail;
      if (event.flops > 0) {
        span.arg_count = 1;
        span.arg_names[0] = "flops";
        span.arg_values[0] = int64_t(event.flops);
      }
      timeline_->record(span);
    }
  } catch (...) {
    ++dropped_;
  }
}

OpProfiler::OpProfiler(Timeline* timeline)
    : profile_(timeline), session_(std::make_unique<core::ProfileSession>(profile_)) {}

OpProfileReport OpProfiler::finish(int64_t steps) {
  if (session_) {
    const int64_t end = core::profile_clock_ns();
    report_.paused_ns = session_->paused_ns();
    report_.wall_ns = std::max<int64_t>(0, end - session_->started_ns() - report_.paused_ns);
    session_.reset();
    report_.rows = profile_.rows();
    report_.dropped = profile_.dropped();
  }
  report_.steps = steps;
  return report_;
}

namespace {

constexpr size_t kNameWidth = 44;
constexpr size_t kTypeWidth = 26;  // "onnx:SoftmaxCrossEntropyLoss" loses its start

// The end of a long name says most (an ONNX node's ".../conv1/Conv"), so the start is cut.
std::string fit_name(const std::string& name, size_t width) {
  if (name.size() <= width) return name;
  return "..." + name.substr(name.size() - (width - 3));
}

std::string format_seconds(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f s", double(ns) * 1e-9);
  return text;
}

double share(int64_t part, int64_t whole) {
  return whole > 0 ? double(part) / double(whole) : 0.0;
}

}  // namespace

std::string format_op_profile(const OpProfileReport& report, const OpProfileTableOptions& options) {
  std::vector<const OpProfileRow*> order;
  for (const OpProfileRow& row : report.rows) order.push_back(&row);
  std::stable_sort(order.begin(), order.end(), [](const OpProfileRow* a, const OpProfileRow* b) {
    return a->self_ns > b->self_ns;
  });
  const size_t shown = std::min(order.size(), options.max_rows);
  const int64_t self_total =
      std::accumulate(report.rows.begin(), report.rows.end(), int64_t(0),
                      [](int64_t sum, const OpProfileRow& row) { return sum + row.self_ns; });

  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "mpigrad profile (rank %d): %s profiled", options.rank,
                format_seconds(report.wall_ns).c_str());
  out += line;
  if (report.steps > 0) {
    std::snprintf(line, sizeof(line), ", %lld optimizer steps (%.2f ms a step)",
                  static_cast<long long>(report.steps),
                  double(report.wall_ns) * 1e-6 / double(report.steps));
    out += line;
  }
  if (report.paused_ns > 0) out += "; " + format_seconds(report.paused_ns) + " paused (validation)";
  std::snprintf(line, sizeof(line), "; %zu of %zu rows, by self time\n", shown, report.rows.size());
  out += line;
  const std::string rule(kNameWidth + kTypeWidth + 73, '-');
  std::snprintf(line, sizeof(line), "%-*s %-*s %8s %11s %7s %11s %7s %11s %9s\n", int(kNameWidth),
                "name", int(kTypeWidth), "type", "calls", "self ms", "self %", "total ms",
                "total %", "us/call", "GFLOP/s");
  out += line;
  out += rule + "\n";
  for (size_t i = 0; i < shown; ++i) {
    const OpProfileRow& row = *order[i];
    char gflops[32] = "";
    if (row.flops > 0) std::snprintf(gflops, sizeof(gflops), "%.2f", row.gflops_per_second());
    std::snprintf(line, sizeof(line), "%-*s %-*s %8lld %11.3f %6.2f%% %11.3f %6.2f%% %11.2f %9s\n",
                  int(kNameWidth), fit_name(row.name, kNameWidth).c_str(), int(kTypeWidth),
                  fit_name(row.type(), kTypeWidth).c_str(), static_cast<long long>(row.calls),
                  double(row.self_ns) * 1e-6, 100.0 * share(row.self_ns, report.wall_ns),
                  double(row.total_ns) * 1e-6, 100.0 * share(row.total_ns, report.wall_ns),
                  row.calls > 0 ? double(row.total_ns) * 1e-3 / double(row.calls) : 0.0, gflops);
    out += line;
  }
  out += rule + "\n";
  std::snprintf(line, sizeof(line),
                "self time total: %s of %s profiled (%.2f%%); the rest ran outside every span\n",
                format_seconds(self_total).c_str(), format_seconds(report.wall_ns).c_str(),
                100.0 * share(self_total, report.wall_ns));
  out += line;
  if (report.dropped > 0) {
    std::snprintf(line, sizeof(line), "(%lld spans were dropped: out of memory)\n",
                  static_cast<long long>(report.dropped));
    out += line;
  }
  return out;
}

std::string op_profile_json(const OpProfileReport& report) {
  std::string out;
  char number[160];
  std::snprintf(number, sizeof(number), "{\"wall_s\":%.9f,\"paused_s\":%.9f,\"steps\":%lld,",
                double(report.wall_ns) * 1e-9, double(report.paused_ns) * 1e-9,
                static_cast<long long>(report.steps));
  out += number;
  out += "\"rows\":[";
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const OpProfileRow& row = report.rows[i];
    out += i > 0 ? ",\n{" : "\n{";
    out += "\"name\":";
    append_json_string(out, row.name);
    out += ",\"type\":";
    append_json_string(out, row.type());
    out += ",\"kind\":";
    append_json_string(out, core::profile_kind_name(row.kind));
    if (!row.detail.empty()) {
      out += ",\"op_type\":";
      append_json_string(out, row.detail);
    }
    std::snprintf(number, sizeof(number),
                  ",\"calls\":%lld,\"self_s\":%.9f,\"total_s\":%.9f,\"self_share\":%.6f,"
                  "\"total_share\":%.6f,\"flops\":%.17g,\"gflops_per_s\":%.6g}",
                  static_cast<long long>(row.calls), double(row.self_ns) * 1e-9,
                  double(row.total_ns) * 1e-9, share(row.self_ns, report.wall_ns),
                  share(row.total_ns, report.wall_ns), row.flops, row.gflops_per_second());
    out += number;
  }
  out += "\n]}\n";
  return out;
}

}  // namespace mpigrad::launch
