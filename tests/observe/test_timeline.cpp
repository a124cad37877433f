// The timeline, under mpirun -np 1 and 2: a Span on a null timeline records nothing; spans nest
// (an inner span lies inside its outer one and is recorded first); the cap counts what it drops;
// one rank's JSON is well-formed, with its pid, names, lanes and arguments; and the merged file
// holds every rank's events and process names, written through a temporary file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "json_reader.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/timeline.h"

using namespace mpigrad;
using test::JsonValue;
namespace fs = std::filesystem;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
// The events of a "traceEvents" document, or of one rank's rendered part.
std::vector<JsonValue> events_of(const std::string& rendered) {
  return test::parse_json("[" + rendered + "]").items;
}
const JsonValue& member(const JsonValue& object, const char* key) {
  const JsonValue* found = object.find(key);
  REQUIRE_MESSAGE(found != nullptr, "missing member ", key);
  return *found;
}
}  // namespace

TEST_CASE("a Span on a null timeline does nothing; on a timeline it records its scope") {
  { launch::Span nothing(nullptr, "forward"); }
  launch::Timeline timeline;
  {
    launch::Span outer(&timeline, "outer");
    { launch::Span inner(&timeline, "inner", 3); }
  }
  const auto& events = timeline.events();
  REQUIRE(events.size() == 2);
  // The inner span ends first, so it is recorded first, and it lies inside the outer one.
  CHECK(std::string(events[0].name) == "inner");
  CHECK(events[0].lane == 3);
  CHECK(std::string(events[1].name) == "outer");
  CHECK(events[1].begin_ns <= events[0].begin_ns);
  CHECK(events[0].begin_ns + events[0].duration_ns <= events[1].begin_ns + events[1].duration_ns);
  CHECK(events[0].duration_ns >= 0);
}

TEST_CASE("a full timeline counts the events it drops instead of growing") {
  launch::Timeline timeline(2);
  for (int i = 0; i < 5; ++i) timeline.record("x", i, i + 1);
  CHECK(timeline.events().size() == 2);
  CHECK(timeline.dropped() == 3);
}

TEST_CASE("one rank's events render as well-formed trace events with its pid, lanes and args") {
  // Perfetto takes pid 0 and tid 0 for the kernel's swapper: ids are rank + 1 and lane + 1.
  launch::Timeline timeline;
  const int64_t origin = timeline.origin_ns();
  timeline.set_lane_name(1, "bucket 0 \"averaging\"");  // quotes must be escaped
  timeline.record("forward", origin + 1000, origin + 3500);
  timeline.record(launch::TimelineEvent{
      "average bucket", origin + 2000, 4000, 1, 2, {"bucket", "bytes"}, {0, 4096}});
  const auto events = events_of(timeline.render(7, 2.0));
  std::set<std::string> metadata;
  int complete = 0;
  for (const JsonValue& event : events) {
    CHECK(member(event, "pid").number == 8);
    const std::string ph = member(event, "ph").text;
    if (ph == "M") {
      const JsonValue& args = member(event, "args");
      const JsonValue* value = args.find("name");
      if (value == nullptr) value = &member(args, "sort_index");  // *_sort_index
      metadata.insert(
          member(event, "name").text + "=" +
          (value->is(JsonValue::Kind::String) ? value->text : std::to_string(int(value->number))));
      continue;
    }
    REQUIRE(ph == "X");
    ++complete;
    const std::string name = member(event, "name").text;
    if (name == "forward") {
      CHECK(member(event, "tid").number == 1);
      CHECK(member(event, "ts").number == doctest::Approx(2.0));  // 1 µs, scaled by 2
      CHECK(member(event, "dur").number == doctest::Approx(5.0));
      CHECK(event.find("args") == nullptr);
    } else {
      CHECK(name == "average bucket");
      CHECK(member(event, "tid").number == 2);
      CHECK(member(event, "dur").number == doctest::Approx(8.0));
      CHECK(member(member(event, "args"), "bucket").number == 0);
      CHECK(member(member(event, "args"), "bytes").number == 4096);
    }
  }
  CHECK(complete == 2);
  CHECK(metadata.count("process_name=rank 7") == 1);
  CHECK(metadata.count("thread_name=training loop") == 1);
  CHECK(metadata.count("thread_name=bucket 0 \"averaging\"") == 1);
  CHECK(metadata.count("process_sort_index=7") == 1);
  CHECK(metadata.count("thread_sort_index=1") == 1);
}

TEST_CASE("the merged timeline holds every rank's events, each rank its own pid") {
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  const int rank = manager.rank(), ranks = manager.world_size();
  // Every rank writes into the same folder name; rank 0's file is the one checked.
  const fs::path dir = fs::temp_directory_path() / "mpigrad-timeline-test";
  if (rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  manager.world().barrier();
  const std::string path = (dir / "trace.json").string();

  launch::Timeline timeline;
  timeline.start(manager.world());
  for (int i = 0; i <= rank; ++i) {  // rank r records r + 1 steps
    launch::Span step(&timeline, "step");
    launch::Span inner(&timeline, "forward");
  }
  const int64_t spans = launch::write_merged_timeline(timeline, manager.world(), path);
  if (rank == 0) {
    CHECK(spans == int64_t(ranks) * (ranks + 1));  // sum over r of 2 (r + 1)
    CHECK_FALSE(fs::exists(path + ".tmp"));
    const JsonValue document = test::parse_json(read_all(path));
    const JsonValue& events = member(document, "traceEvents");
    REQUIRE(events.is(JsonValue::Kind::Array));
    std::vector<int> steps(size_t(ranks), 0);
    std::set<std::string> process_names;
    for (const JsonValue& event : events.items) {
      const int pid = int(member(event, "pid").number);
      REQUIRE(pid >= 1);  // rank + 1
      REQUIRE(pid <= ranks);
      if (member(event, "ph").text == "M" && member(event, "name").text == "process_name") {
        process_names.insert(member(member(event, "args"), "name").text);
      }
      if (member(event, "ph").text == "X" && member(event, "name").text == "step") {
        ++steps[size_t(pid - 1)];
        CHECK(member(event, "ts").number >= 0);  // after the common origin
      }
    }
    for (int r = 0; r < ranks; ++r) {
      CHECK(steps[size_t(r)] == r + 1);
      CHECK(process_names.count("rank " + std::to_string(r)) == 1);
    }
    CHECK(member(member(document, "otherData"), "ranks").number == ranks);
  } else {
    CHECK(spans == 0);
  }
  manager.world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

TEST_CASE("a merged timeline that cannot be written is an error on rank 0 naming the file") {
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  launch::Timeline timeline;
  timeline.start(manager.world());
  const std::string path = "/proc/mpigrad-no-such-folder/trace.json";
  if (manager.rank() == 0) {
    CHECK_THROWS_WITH_AS(launch::write_merged_timeline(timeline, manager.world(), path),
                         doctest::Contains(path.c_str()), core::Error);
  } else {
    CHECK(launch::write_merged_timeline(timeline, manager.world(), path) == 0);
  }
  manager.world().barrier();  // the other ranks were not left waiting
}
