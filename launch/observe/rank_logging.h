// Small helpers every distributed program needs.
// - rank_seed: the seed of a rank's generator, base + rank, so ranks draw different data
//   augmentation or dropout masks while a run stays reproducible from one base seed. Parameter
//   initialization should use the base seed alone (then broadcast) so all replicas start equal.
// - RankLogger: info() prints on the main process only, so a 64-rank job logs one line per
//   event; warning() and error() print from whichever rank calls them, prefixed with
//   "[rank r/w]" so a reader knows where they came from.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace mpigrad::launch {

constexpr uint64_t rank_seed(uint64_t base_seed, int rank) {
  return base_seed + uint64_t(rank);
}

class RankLogger {
 public:
  RankLogger(int rank, int world_size, std::FILE* out = stdout, std::FILE* err = stderr)
      : rank_(rank), world_size_(world_size), out_(out), err_(err) {}

  bool is_main_process() const { return rank_ == 0; }
  void info(std::string_view message) const;     // main process only, no prefix
  void warning(std::string_view message) const;  // any rank, "[rank r/w] warning: ..."
  void error(std::string_view message) const;    // any rank, "[rank r/w] error: ..."
  // "[rank r/w] " for callers composing their own lines.
  std::string prefix() const;

 private:
  int rank_;
  int world_size_;
  std::FILE* out_;
  std::FILE* err_;
};

}  // namespace mpigrad::launch
