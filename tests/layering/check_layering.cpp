// The layering rule, checked on every #include of the library (docs/architecture.md, "Layers"):
//
//   kernels < core < nn, data < launch
//   and inside launch/:
//   comm < job < mpi_interop.{h,cpp} < observe < ddp (with ddp/transports) < train < config
//        < insitu, commands
//
// A file may include its own folder and any folder before it, never one after it, and never a
// sibling of the same rank (nn and data do not include each other, nor do insitu and commands).
// The top-level mpigrad.h and mpigrad_c.h sit above everything and are not checked.
//
// Usage: mpigrad-check-layering SOURCE_ROOT. Prints one line per violation,
// "file:line: <folder> includes <folder> (<header>), which is above it", and exits 1 if any;
// prints the number of includes checked and exits 0 otherwise.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Each folder's rank; a file belongs to the longest folder prefix that matches its path.
const std::map<std::string, int>& folder_ranks() {
  static const std::map<std::string, int> ranks = {
      {"kernels", 0},
      {"core", 1},
      {"nn", 2},
      {"data", 2},
      {"launch/comm", 3},
      {"launch/job", 4},
      {"launch/mpi_interop", 5},
      {"launch/observe", 6},
      {"launch/ddp", 7},
      {"launch/train", 8},
      {"launch/config", 9},
      {"launch/insitu", 10},
      {"launch/commands", 10},
  };
  return ranks;
}

// The folder of a path relative to the source root ("launch/ddp/transports/x.h" -> "launch/ddp"),
// or nothing for a path outside the layered library.
std::optional<std::string> folder_of(const std::string& path) {
  std::optional<std::string> best;
  for (const auto& [folder, rank] : folder_ranks()) {
    const bool matches =
        path.compare(0, folder.size(), folder) == 0 &&
        (path.size() == folder.size() || path[folder.size()] == '/' || path[folder.size()] == '.');
    if (matches && (!best || folder.size() > best->size())) best = folder;
  }
  return best;
}

bool is_source(const fs::path& path) {
  const std::string extension = path.extension().string();
  return extension == ".h" || extension == ".cpp" || extension == ".c" || extension == ".cu" ||
         extension == ".cuh";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SOURCE_ROOT\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const std::regex include_line(R"(^\s*#\s*include\s*[<"]mpigrad/([^">]+)[">])");
  int checked = 0;
  int violations = 0;
  std::vector<fs::path> files;
  for (const char* top : {"kernels", "core", "nn", "data", "launch"}) {
    if (!fs::exists(root / top)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (entry.is_regular_file() && is_source(entry.path())) files.push_back(entry.path());
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "check-layering: no library sources under %s\n", root.c_str());
    return 2;
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    const std::string relative = fs::relative(file, root).generic_string();
    const std::optional<std::string> from = folder_of(relative);
    if (!from) continue;
    std::ifstream in(file);
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      std::smatch match;
      if (!std::regex_search(line, match, include_line)) continue;
      const std::string header = match[1].str();
      const std::optional<std::string> to = folder_of(header);
      if (!to) continue;  // version.h and other generated or top-level headers
      ++checked;
      const int from_rank = folder_ranks().at(*from);
      const int to_rank = folder_ranks().at(*to);
      if (to_rank > from_rank || (to_rank == from_rank && *to != *from)) {
        std::printf("%s:%d: %s includes %s (%s), which is %s it\n", relative.c_str(), number,
                    from->c_str(), to->c_str(), header.c_str(),
                    to_rank > from_rank ? "above" : "a sibling of");
        ++violations;
      }
    }
  }
  if (violations > 0) {
    std::printf("check-layering: %d include(s) break the layering, of %d checked in %zu files\n",
                violations, checked, files.size());
    return 1;
  }
  std::printf("check-layering: %d includes in %zu files follow the layering\n", checked,
              files.size());
  return 0;
}
