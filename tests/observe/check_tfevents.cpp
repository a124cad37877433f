// Checks TensorBoard event files against metrics.jsonl, for observability_checks.sh:
//   mpigrad-check-tfevents TB_DIR METRICS_JSONL
// Every event file of TB_DIR is read frame by frame with both CRCs checked (the library's
// reader) and its Events decoded by the tests' own protobuf reader. Then every scalar of
// metrics.jsonl must be in the files, and nothing else: a step line's scalars as train/<name> at
// its step, the k-th evaluation's test_<name> as the k-th test/<name> event, at a step no earlier
// than the last step logged in its epoch and earlier than any step logged in a later epoch.
// Values agree to float32 rounding. Exits 1 with one line saying what differs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "event_decoder.h"
#include "json_reader.h"
#include "mpigrad/launch/observe/event_file_writer.h"

using namespace mpigrad;
namespace fs = std::filesystem;

namespace {

struct Scalar {
  int64_t step;
  float value;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "check-tfevents: %s\n", what.c_str());
  std::exit(1);
}

// A metrics.jsonl number (null stands for a non-finite value) against the stored float32.
bool same(const test::JsonValue& logged, float stored) {
  if (logged.is(test::JsonValue::Kind::Null)) return !std::isfinite(stored);
  const double expected = double(float(logged.number));
  return std::fabs(expected - double(stored)) <= 3e-7 * std::fabs(expected) + 1e-30;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) fail("usage: mpigrad-check-tfevents TB_DIR METRICS_JSONL");
  try {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(argv[1])) {
      if (entry.path().filename().string().starts_with("events.out.tfevents.")) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) fail(std::string("no events.out.tfevents.* in ") + argv[1]);
    std::map<std::string, std::vector<Scalar>> by_tag;  // in file order
    size_t stored = 0, events = 0;
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      const auto records = launch::read_tfrecords(bytes, file);
      if (records.empty() || test::decode_event(records[0]).file_version != "brain.Event:2") {
        fail(file + ": the first record is not the file version brain.Event:2");
      }
      for (size_t i = 1; i < records.size(); ++i) {
        const test::DecodedEvent event = test::decode_event(records[i]);
        ++events;
        for (const auto& [tag, value] : event.values) {
          by_tag[tag].push_back({event.step, value});
          ++stored;
        }
      }
    }

    std::ifstream metrics(argv[2]);
    if (!metrics) fail(std::string("cannot read ") + argv[2]);
    std::map<int64_t, int64_t> last_step_of_epoch, first_step_of_epoch;
    std::vector<test::JsonValue> evaluations;
    size_t logged = 0;
    for (std::string line; std::getline(metrics, line);) {
      const test::JsonValue record = test::parse_json(line);
      const test::JsonValue* step = record.find("step");
      const int64_t epoch = int64_t(record.find("epoch")->number);
      if (step == nullptr) {
        evaluations.push_back(record);
        continue;
      }
      const int64_t s = int64_t(step->number);
      last_step_of_epoch[epoch] = s;
      if (!first_step_of_epoch.count(epoch)) first_step_of_epoch[epoch] = s;
      for (const auto& [name, value] : record.members) {
        if (name == "step" || name == "epoch") continue;
        ++logged;
        const auto& scalars = by_tag["train/" + name];
        auto found = std::find_if(scalars.begin(), scalars.end(),
                                  [&](const Scalar& x) { return x.step == s; });
        if (found == scalars.end())
          fail("train/" + name + " has no value at step " + std::to_string(s));
        if (!same(value, found->value)) {
          fail("train/" + name + " at step " + std::to_string(s) + " is " +
               std::to_string(found->value) + ", metrics.jsonl has " + line);
        }
      }
    }
    std::map<std::string, size_t> seen;
    for (const test::JsonValue& record : evaluations) {
      const int64_t epoch = int64_t(record.find("epoch")->number);
      for (const auto& [name, value] : record.members) {
        if (name == "epoch") continue;
        if (!name.starts_with("test_")) fail("evaluation key without test_: " + name);
        ++logged;
        const std::string tag = "test/" + name.substr(5);
        const auto& scalars = by_tag[tag];
        const size_t k = seen[tag]++;
        if (k >= scalars.size()) fail(tag + ": fewer events than evaluations");
        if (!same(value, scalars[k].value)) {
          fail(tag + " of epoch " + std::to_string(epoch) + " is " +
               std::to_string(scalars[k].value) + ", metrics.jsonl has " +
               std::to_string(value.number));
        }
        const int64_t step = scalars[k].step;
        if (last_step_of_epoch.count(epoch) && step < last_step_of_epoch[epoch]) {
          fail(tag + " of epoch " + std::to_string(epoch) + " at step " + std::to_string(step) +
               ", before that epoch's last logged step");
        }
        auto later = first_step_of_epoch.upper_bound(epoch);
        if (later != first_step_of_epoch.end() && step >= later->second) {
          fail(tag + " of epoch " + std::to_string(epoch) + " at step " + std::to_string(step) +
               ", not before the next epoch's steps");
        }
      }
    }
    if (stored != logged) {
      fail("the event files hold " + std::to_string(stored) + " values, metrics.jsonl " +
           std::to_string(logged));
    }
    std::printf("check-tfevents: %zu values in %zu events of %zu file(s) match metrics.jsonl\n",
                stored, events, files.size());
  } catch (const std::exception& error) {
    fail(error.what());
  }
  return 0;
}
