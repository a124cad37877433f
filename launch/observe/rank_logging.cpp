// RankLogger: whole lines written with one call each, so ranks sharing a terminal do not
// interleave mid-line.
#include "mpigrad/launch/observe/rank_logging.h"

#include <string>

#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

std::string RankLogger::prefix() const {
  return rank_label(rank_, world_size_) + " ";
}

void RankLogger::info(std::string_view message) const {
  if (!is_main_process()) return;
  std::string line(message);
  line += '\n';
  std::fputs(line.c_str(), out_);
  std::fflush(out_);
}

void RankLogger::warning(std::string_view message) const {
  std::string line = prefix() + "warning: " + std::string(message) + "\n";
  std::fputs(line.c_str(), err_);
  std::fflush(err_);
}

void RankLogger::error(std::string_view message) const {
  std::string line = prefix() + "error: " + std::string(message) + "\n";
  std::fputs(line.c_str(), err_);
  std::fflush(err_);
}

}  // namespace mpigrad::launch
