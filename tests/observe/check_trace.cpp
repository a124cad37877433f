// Checks a merged timeline, for observability_checks.sh:
//   mpigrad-check-trace TRACE.json RANKS NAME[@0]...
// The file must be well-formed JSON ({"traceEvents": [...]}) in which: every event has a pid in
// [1, RANKS] (rank + 1: Perfetto takes pid 0 and tid 0 for the kernel's swapper); every rank has
// its process_name "rank N"; every complete event (ph "X") has a name, a tid >= 1 and numbers
// ts >= 0 and dur >= 0; every NAME appears on every rank (NAME@0: on rank 0); "average bucket"
// events lie on tid 2 + their bucket argument and carry the bucket's bytes; and on each rank's
// training-loop lane (tid 1) spans never partly overlap and come in the order of a step:
// forward, backward, then (when the step syncs) optimizer step.
// Exits 1 with one line saying what is wrong.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "json_reader.h"

using mpigrad::test::JsonValue;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "check-trace: %s\n", what.c_str());
  std::exit(1);
}

const JsonValue& member(const JsonValue& object, const char* key) {
  const JsonValue* found = object.find(key);
  if (found == nullptr) fail(std::string("an event has no ") + key);
  return *found;
}

double number(const JsonValue& object, const char* key) {
  const JsonValue& value = member(object, key);
  if (!value.is(JsonValue::Kind::Number)) fail(std::string(key) + " is not a number");
  return value.number;
}

struct Span {
  double ts, end;
  std::string name;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) fail("usage: mpigrad-check-trace TRACE.json RANKS NAME[@0]...");
  const int ranks = std::atoi(argv[2]);
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) fail(std::string("cannot read ") + argv[1]);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  JsonValue document;
  try {
    document = mpigrad::test::parse_json(text);
  } catch (const std::exception& error) {
    fail(error.what());
  }
  const JsonValue* events = document.find("traceEvents");
  if (events == nullptr || !events->is(JsonValue::Kind::Array)) fail("no traceEvents array");

  std::map<int, std::set<std::string>> names_by_rank;
  std::map<int, std::string> process_names;
  std::map<int, std::vector<Span>> loop_spans;
  size_t complete = 0;
  for (const JsonValue& event : events->items) {
    const int pid = int(number(event, "pid"));
    if (pid < 1 || pid > ranks) fail("pid " + std::to_string(pid) + " is not a rank + 1");
    const int rank = pid - 1;
    const std::string ph = member(event, "ph").text;
    const std::string name = member(event, "name").text;
    if (ph == "M") {
      if (name == "process_name") {
        process_names[rank] = member(member(event, "args"), "name").text;
      }
      continue;
    }
    if (ph != "X") fail("event of phase '" + ph + "'; expected X or M");
    ++complete;
    const double ts = number(event, "ts"), dur = number(event, "dur");
    const int tid = int(number(event, "tid"));
    if (ts < 0 || dur < 0 || tid < 1) fail(name + ": negative ts or dur, or a tid below 1");
    names_by_rank[rank].insert(name);
    if (name == "average bucket") {
      const JsonValue& args = member(event, "args");
      const int bucket = int(number(args, "bucket"));
      if (tid != 2 + bucket)
        fail("bucket " + std::to_string(bucket) + " on lane " + std::to_string(tid));
      if (number(args, "bytes") <= 0) fail("a bucket without bytes");
    }
    if (tid == 1) loop_spans[rank].push_back({ts, ts + dur, name});
  }
  for (int r = 0; r < ranks; ++r) {
    if (process_names[r] != "rank " + std::to_string(r)) {
      fail("rank " + std::to_string(r) + " has no process_name 'rank " + std::to_string(r) + "'");
    }
    for (int i = 3; i < argc; ++i) {
      std::string wanted = argv[i];
      const bool rank0_only = wanted.ends_with("@0");
      if (rank0_only) wanted.resize(wanted.size() - 2);
      if ((r == 0 || !rank0_only) && !names_by_rank[r].count(wanted)) {
        fail("rank " + std::to_string(r) + " has no '" + wanted + "' span");
      }
    }
    // Spans of one lane are nested or disjoint (complete events must be, to draw as a stack).
    auto& spans = loop_spans[r];
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.ts < b.ts || (a.ts == b.ts && a.end > b.end);
    });
    std::vector<const Span*> open;
    std::string order;
    for (const Span& span : spans) {
      while (!open.empty() && open.back()->end <= span.ts) open.pop_back();
      if (!open.empty() && span.end > open.back()->end + 1e-3) {
        fail("rank " + std::to_string(r) + ": '" + span.name + "' partly overlaps '" +
             open.back()->name + "'");
      }
      open.push_back(&span);
      if (span.name == "forward") order += 'f';
      if (span.name == "backward") order += 'b';
      if (span.name == "optimizer step") order += 'o';
    }
    // Each step: f b, then o when it synced; never b or o without the f before it.
    for (size_t i = 0; i < order.size(); ++i) {
      const char previous = i == 0 ? 'o' : order[i - 1];
      const bool fine = (order[i] == 'f' && (previous == 'o' || previous == 'b')) ||
                        (order[i] == 'b' && previous == 'f') ||
                        (order[i] == 'o' && previous == 'b');
      if (!fine)
        fail("rank " + std::to_string(r) + ": the step spans are out of order near '" +
             order.substr(i > 3 ? i - 3 : 0, 8) + "'");
    }
  }
  std::printf("check-trace: %zu spans from %d rank(s), every expected name on every rank\n",
              complete, ranks);
  return 0;
}
