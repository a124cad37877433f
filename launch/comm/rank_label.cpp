#include "mpigrad/launch/comm/rank_label.h"

#include <unistd.h>

#include <array>
#include <cstdio>

namespace mpigrad::launch {

std::string rank_label(int world_rank, int world_size) {
  return "[rank " + std::to_string(world_rank) + "/" + std::to_string(world_size) + "]";
}

std::string rank_label_on_host(int world_rank, int world_size) {
  return "[rank " + std::to_string(world_rank) + "/" + std::to_string(world_size) + " on " +
         host_name() + "]";
}

const std::string& host_name() {
  static const std::string name = [] {
    std::array<char, 256> buffer{};
    if (gethostname(buffer.data(), buffer.size() - 1) != 0 || buffer[0] == '\0') {
      return std::string("unknown-host");
    }
    return std::string(buffer.data());
  }();
  return name;
}

void print_rank_error(int world_rank, int world_size, std::string_view program,
                      std::string_view message) {
  std::string line = rank_label(world_rank, world_size);
  line += ' ';
  line += program;
  line += ": error: ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace mpigrad::launch
