#include "mpigrad/launch/observe/timeline.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <set>
#include <vector>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/observe/json_text.h"

namespace mpigrad::launch {

namespace {

// The trace's ids start at 1: Perfetto takes pid 0 and tid 0 for the kernel's swapper (idle)
// process and thread, so rank 0 and the training loop would not be shown as our own.
int trace_pid(int rank) {
  return rank + 1;
}
int trace_tid(int32_t lane) {
  return int(lane) + 1;
}

void append_metadata(std::string& out, int rank, int32_t lane, const char* what, const char* key,
                     const std::string& value, bool quoted) {
  if (!out.empty()) out.append(",\n");
  out.append("{\"name\":\"").append(what).append("\",\"ph\":\"M\",\"pid\":");
  out.append(std::to_string(trace_pid(rank))).append(",\"tid\":");
  out.append(std::to_string(trace_tid(lane)));
  out.append(",\"args\":{\"").append(key).append("\":");
  if (quoted) {
    append_json_string(out, value);
  } else {
    out.append(value);
  }
  out.append("}}");
}

}  // namespace

Timeline::Timeline(size_t max_events) : max_events_(max_events), origin_ns_(now_ns()) {
  events_.reserve(std::min(max_events_, size_t(1) << 14));
  lane_names_[0] = "training loop";
}

void Timeline::set_lane_name(int32_t lane, std::string name) {
  lane_names_[lane] = std::move(name);
}

void Timeline::start(Communicator& world) {
  // The first barrier may set up connections; the second is the one whose exit ranks share.
  world.barrier();
  world.barrier();
  origin_ns_ = now_ns();
}

std::string Timeline::render(int rank, double scale) const {
  std::string out;
  out.reserve(events_.size() * 120 + 512);
  append_metadata(out, rank, 0, "process_name", "name", "rank " + std::to_string(rank), true);
  append_metadata(out, rank, 0, "process_sort_index", "sort_index", std::to_string(rank), false);
  std::set<int32_t> lanes;
  for (const TimelineEvent& event : events_) lanes.insert(event.lane);
  for (const auto& [lane, name] : lane_names_) lanes.insert(lane);
  for (int32_t lane : lanes) {
    auto named = lane_names_.find(lane);
    append_metadata(out, rank, lane, "thread_name", "name",
                    named != lane_names_.end() ? named->second : "lane " + std::to_string(lane),
                    true);
    append_metadata(out, rank, lane, "thread_sort_index", "sort_index", std::to_string(lane),
                    false);
  }
  const double microseconds_per_ns = scale / 1000.0;
  char number[96];
  for (const TimelineEvent& event : events_) {
    out.append(",\n{\"name\":");
    append_json_string(out, event.name);
    out.append(",\"cat\":");
    append_json_string(out, event.category != nullptr ? event.category : "mpigrad");
    std::snprintf(number, sizeof(number), ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d", trace_pid(rank),
                  trace_tid(event.lane));
    out.append(number);
    std::snprintf(number, sizeof(number), ",\"ts\":%.3f,\"dur\":%.3f",
                  double(event.begin_ns - origin_ns_) * microseconds_per_ns,
                  double(event.duration_ns) * microseconds_per_ns);
    out.append(number);
    if (event.arg_count > 0 || event.op_type != nullptr) {
      out.append(",\"args\":{");
      for (int32_t i = 0; i < event.arg_count && i < 2; ++i) {
        if (i > 0) out.push_back(',');
        append_json_string(out, event.arg_names[i]);
        out.push_back(':');
        out.append(std::to_string(event.arg_values[i]));
      }
      if (event.op_type != nullptr) {
        if (event.arg_count > 0) out.push_back(',');
        out.append("\"op_type\":");
        append_json_string(out, event.op_type);
      }
      out.push_back('}');
    }
    out.push_back('}');
  }
  return out;
}

int64_t write_merged_timeline(const Timeline& timeline, Communicator& world,
                              const std::string& path) {
  const int rank = world.rank(), ranks = world.size();
  // The end of the common time base: rank 0's elapsed time over this rank's is the drift factor.
  world.barrier();
  const int64_t elapsed = std::max<int64_t>(1, Timeline::now_ns() - timeline.origin_ns());
  core::Tensor reference = core::Tensor::from_vector<int64_t>({elapsed}, {1});
  world.broadcast(reference, 0);
  const double scale = double(reference.item<int64_t>()) / double(elapsed);

  std::string mine, error;
  try {
    mine = timeline.render(rank, scale);
  } catch (const std::exception& failure) {
    error = failure.what();
    mine.clear();
  }
  // Every rank learns every rank's size (-1: it failed) before anyone waits in the gather.
  core::Tensor local = core::Tensor::from_vector<int64_t>(
      {error.empty() ? int64_t(mine.size()) : -1, int64_t(timeline.events().size()),
       int64_t(timeline.dropped())},
      {3});
  core::Tensor all = core::zeros({3 * int64_t(ranks)}, core::TensorOptions(core::kInt64));
  world.all_gather(local, all);
  const std::vector<int64_t> info = all.to_vector<int64_t>();
  int64_t total = 0, spans = 0, dropped = 0;
  for (int r = 0; r < ranks; ++r) {
    MPIGRAD_CHECK(info[size_t(3 * r)] >= 0, "timeline: rank ", r, " could not render its events",
                  r == rank ? ": " + error : std::string(), "; no trace was written");
    total += info[size_t(3 * r)];
    spans += info[size_t(3 * r + 1)];
    dropped += info[size_t(3 * r + 2)];
  }
  MPIGRAD_CHECK(total <= INT_MAX, "timeline: the ranks' events take ", total,
                " bytes, more than one gather moves; trace a shorter run (fewer steps)");

  // Rank 0 gathers every rank's rendered events, as bytes, in rank order.
  std::vector<int64_t> counts(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) counts[size_t(r)] = info[size_t(3 * r)];
  core::Tensor bytes = core::empty({int64_t(mine.size())}, core::kUInt8);
  if (!mine.empty()) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  core::Tensor gathered;
  if (rank == 0) gathered = core::empty({total}, core::kUInt8);
  world.gather_v(bytes, gathered, counts, 0);
  if (rank != 0) return 0;

  core::write_file_atomically(path, [&](std::ostream& out) {
    out << "{\"traceEvents\":[\n";
    const char* text = static_cast<const char*>(gathered.data_ptr());
    for (int r = 0; r < ranks; ++r) {
      if (r > 0) out << ",\n";
      out.write(text, counts[size_t(r)]);
      text += counts[size_t(r)];
    }
    out << "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"ranks\":" << ranks
        << ",\"spans\":" << spans << ",\"dropped_events\":" << dropped
        << ",\"clock\":\"steady_clock per rank; origin at a barrier, drift rescaled to rank 0\"}}"
        << "\n";
  });
  return spans;
}

}  // namespace mpigrad::launch
