// The layering rule, checked on every #include of the library against the one list of its layers,
// layers.txt at the top of the tree (which says how to read it; docs/architecture.md, "Layers"):
//
// - A file may include its own folder and any folder on an earlier line, never a later one, and
//   never a folder beside its own (nn and data do not include each other, nor do insitu and
//   commands).
// - A file belongs to the longest entry that is its folder, a folder above it, or its own stem
//   (launch/mpi_interop for launch/mpi_interop.{h,cpp}). A source file (.h .cpp .cu .cuh .c) under
//   kernels/, core/, nn/, data/ or launch/ that belongs to no entry is an error naming its folder,
//   and so is an include of one: a new folder must take its place in the list first.
// - Includes are checked whether they name the header from the top (<mpigrad/launch/x.h>) or
//   relative to the including file ("x.h", "../comm/x.h"); an include that resolves to no file of
//   the tree (a system or generated header, version.h) is not ours to check.
// The top-level mpigrad.h and mpigrad_c.h sit above everything and are not checked.
//
// Usage: mpigrad-check-layering LAYERS_FILE SOURCE_ROOT. Prints one line per violation,
// "file:line: <folder> includes <folder> (<header>), which is above it" (or "a sibling of it",
// or "which has no rank in layers.txt"), and one per folder without a rank,
// "file: <folder> has no rank in layers.txt; ...", then exits 1 if there was any; prints the
// number of includes checked and exits 0 otherwise. A malformed LAYERS_FILE exits 2.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Layers {
  std::map<std::string, int> rank_of;  // entry ("launch/comm") -> its rank (line order, 0 first)
  std::set<std::string> tops;          // the library's top folders ("core", "launch")
};

[[noreturn]] void malformed(const fs::path& file, int line, const std::string& why) {
  std::fprintf(stderr, "%s:%d: %s\n", file.c_str(), line, why.c_str());
  std::exit(2);
}

// One entry per line, lowest first: "FOLDER  # what it holds", or "beside FOLDER ..." for a
// folder that shares the rank of the line above.
Layers read_layers(const fs::path& file) {
  std::ifstream in(file);
  if (!in) malformed(file, 0, "cannot read the list of layers");
  const std::regex entry_line(R"(^\s*(beside\s+)?([A-Za-z0-9_./-]+)\s*$)");
  Layers layers;
  std::string line;
  int number = 0, rank = -1;
  while (std::getline(in, line)) {
    ++number;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::smatch match;
    if (!std::regex_match(line, match, entry_line)) {
      malformed(file, number, "expected one folder, or \"beside FOLDER\", then a # comment");
    }
    const bool beside = match[1].matched;
    const std::string folder = match[2].str();
    if (beside && rank < 0) malformed(file, number, "the first folder is beside nothing");
    if (!beside) ++rank;
    if (!layers.rank_of.emplace(folder, rank).second) {
      malformed(file, number, folder + " is listed twice");
    }
    layers.tops.insert(folder.substr(0, folder.find('/')));
  }
  if (layers.rank_of.empty()) malformed(file, number, "lists no folder");
  return layers;
}

// The entry a path relative to the source root belongs to ("launch/ddp/transports/x.h" ->
// "launch/ddp", "launch/mpi_interop.h" -> "launch/mpi_interop"), or nothing.
std::optional<std::string> entry_of(const Layers& layers, const std::string& path) {
  std::optional<std::string> best;
  for (const auto& [entry, rank] : layers.rank_of) {
    const bool matches =
        path.compare(0, entry.size(), entry) == 0 &&
        (path.size() == entry.size() || path[entry.size()] == '/' || path[entry.size()] == '.');
    if (matches && (!best || entry.size() > best->size())) best = entry;
  }
  return best;
}

bool in_library(const Layers& layers, const std::string& path) {
  return layers.tops.count(path.substr(0, path.find('/'))) > 0 && path.find('/') != path.npos;
}

bool is_source(const fs::path& path) {
  const std::string extension = path.extension().string();
  return extension == ".h" || extension == ".cpp" || extension == ".c" || extension == ".cu" ||
         extension == ".cuh";
}

// The file an include names, relative to the source root, or nothing when it is not a file of
// the tree: <mpigrad/X> and "mpigrad/X" name X from the top; any other quoted include is looked
// up beside the including file first, as the compiler does.
std::optional<std::string> resolve(const fs::path& root, const fs::path& file, char quote,
                                   const std::string& header) {
  if (header.rfind("mpigrad/", 0) == 0) return header.substr(8);
  if (quote != '"') return std::nullopt;
  const fs::path beside = (file.parent_path() / header).lexically_normal();
  if (!fs::is_regular_file(beside)) return std::nullopt;
  const std::string relative = beside.lexically_relative(root).generic_string();
  if (relative.empty() || relative.rfind("..", 0) == 0) return std::nullopt;
  return relative;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s LAYERS_FILE SOURCE_ROOT\n", argv[0]);
    return 2;
  }
  const Layers layers = read_layers(argv[1]);
  const fs::path root = fs::path(argv[2]).lexically_normal();
  const std::regex include_line(R"(^\s*#\s*include\s*([<"])([^">]+)[">])");
  std::vector<fs::path> files;
  for (const std::string& top : layers.tops) {
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
  int checked = 0, violations = 0;
  std::set<std::string> unranked;
  for (const fs::path& file : files) {
    const std::string relative = file.lexically_relative(root).generic_string();
    const std::optional<std::string> from = entry_of(layers, relative);
    if (!from) {
      const std::string folder = fs::path(relative).parent_path().generic_string();
      if (unranked.insert(folder).second) {
        std::printf(
            "%s: %s has no rank in layers.txt; give it a line there (or move the file "
            "into a folder that has one)\n",
            relative.c_str(), folder.c_str());
      }
      continue;
    }
    const int from_rank = layers.rank_of.at(*from);
    std::ifstream in(file);
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      std::smatch match;
      if (!std::regex_search(line, match, include_line)) continue;
      std::string header = match[2].str();
      const std::optional<std::string> target = resolve(root, file, match[1].str()[0], header);
      if (header.rfind("mpigrad/", 0) == 0) header.erase(0, 8);  // named from the top
      if (!target || !in_library(layers, *target)) continue;  // not ours, or mpigrad.h and the like
      ++checked;
      const std::optional<std::string> to = entry_of(layers, *target);
      if (!to) {
        const std::string folder = fs::path(*target).parent_path().generic_string();
        std::printf("%s:%d: %s includes %s (%s), which has no rank in layers.txt\n",
                    relative.c_str(), number, from->c_str(), folder.c_str(), header.c_str());
        ++violations;
        continue;
      }
      const int to_rank = layers.rank_of.at(*to);
      if (to_rank > from_rank || (to_rank == from_rank && *to != *from)) {
        std::printf("%s:%d: %s includes %s (%s), which is %s it\n", relative.c_str(), number,
                    from->c_str(), to->c_str(), header.c_str(),
                    to_rank > from_rank ? "above" : "a sibling of");
        ++violations;
      }
    }
  }
  if (violations > 0 || !unranked.empty()) {
    std::printf(
        "check-layering: %d include(s) break the layering and %zu folder(s) have no rank, "
        "of %d includes checked in %zu files\n",
        violations, unranked.size(), checked, files.size());
    return 1;
  }
  std::printf("check-layering: %d includes in %zu files follow the layering\n", checked,
              files.size());
  return 0;
}
