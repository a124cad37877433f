// Helpers shared by the benchmark programs: timing, a results table, and --json output.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/launch/observe/json_text.h"

namespace mpigrad::bench {

// Seconds per call of fn: the best of `repeats` timings of `iterations` calls each, after one
// warm-up round. The best, not the mean, because we compare against a baseline timed the same
// way in the same run and want neither to carry the other's scheduling noise.
inline double seconds_per_call(const std::function<void()>& fn, int iterations, int repeats = 5) {
  for (int i = 0; i < iterations; ++i) fn();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count() / iterations);
  }
  return best;
}

// The median of `values` (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// A benchmark's run, returning its exit status: an exception it throws (a model file that cannot
// be read, a shape a kernel does not take) ends it with one line "program: what" and status 1.
template <typename Run>
int run_reporting_errors(const char* program, Run&& run) {
  try {
    return run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return 1;
  }
}

// Named numbers, printed as a table and optionally written as one flat JSON object.
class Results {
 public:
  void add(std::string key, double value, std::string unit, std::string note = "") {
    rows_.push_back({std::move(key), value, std::move(unit), std::move(note)});
  }
  void add_text(std::string key, std::string value) {
    text_.emplace_back(std::move(key), std::move(value));
  }

  void print() const {
    for (const auto& [key, value] : text_) std::printf("%-28s %s\n", key.c_str(), value.c_str());
    std::printf("%-28s %14s  %-8s %s\n", "metric", "value", "unit", "note");
    for (const auto& row : rows_) {
      std::printf("%-28s %14.4f  %-8s %s\n", row.key.c_str(), row.value, row.unit.c_str(),
                  row.note.c_str());
    }
  }

  // print(), then write_json(json_path) where a path is given; returns the program's exit
  // status: 1, with one message (after "program: " where one is named), when the file cannot be
  // written.
  int report(const std::string& json_path, const std::string& program = "") const {
    print();
    if (json_path.empty() || write_json(json_path)) return 0;
    std::fprintf(stderr, "%s%scannot write %s\n", program.c_str(), program.empty() ? "" : ": ",
                 json_path.c_str());
    return 1;
  }

  // Writes to path + ".tmp" and renames, so a reader never sees half a file.
  bool write_json(const std::string& path) const {
    std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      if (!out) return false;
      out.precision(12);  // the default 6 digits would round counts like 9443328 parameters
      out << "{\n";
      bool first = true;
      for (const auto& [key, value] : text_) {
        std::string quoted;
        launch::append_json_string(quoted, value);
        out << (first ? "" : ",\n") << "  \"" << key << "\": " << quoted;
        first = false;
      }
      for (const auto& row : rows_) {
        out << (first ? "" : ",\n") << "  \"" << row.key << "\": " << row.value;
        first = false;
      }
      out << "\n}\n";
      if (!out) return false;
    }
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }

 private:
  struct Row {
    std::string key;
    double value;
    std::string unit, note;
  };
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::string>> text_;
};

}  // namespace mpigrad::bench
