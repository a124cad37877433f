// mpigrad-config-reference: prints docs/configuration.md as the key table renders it
// (launch/config/config_reference.h), writes it (-o FILE), or checks a committed copy against it
// (--check FILE). A check names the first line that differs and the command that rewrites the
// file, and exits 1; it is how ctest keeps the page and the parser together.
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/launch/config/config_reference.h"

namespace {

int usage() {
  std::cerr << "usage: mpigrad-config-reference [-o FILE | --check FILE]\n";
  return 2;
}

// The 1-based line where `a` and `b` first differ, with each side's text of that line.
struct Difference {
  size_t line = 0;
  std::string ours, theirs;
};
Difference first_difference(const std::string& ours, const std::string& theirs) {
  std::istringstream a(ours), b(theirs);
  Difference difference;
  for (;;) {
    ++difference.line;
    std::string line_a, line_b;
    const bool more_a = bool(std::getline(a, line_a)), more_b = bool(std::getline(b, line_b));
    if (!more_a && !more_b) return {};  // same lines; a missing final newline is caught below
    if (!more_a) line_a = "(end of page)";
    if (!more_b) line_b = "(end of file)";
    if (!more_a || !more_b || line_a != line_b) {
      difference.ours = line_a;
      difference.theirs = line_b;
      return difference;
    }
  }
}

int check(const std::string& path, const std::string& program) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::cerr << "mpigrad-config-reference: cannot read " << path << "\n";
    return 1;
  }
  std::ostringstream text;
  text << file.rdbuf();
  const std::string page = mpigrad::launch::config_reference_markdown();
  if (text.str() == page) {
    std::cout << path << " matches the config key table\n";
    return 0;
  }
  Difference difference = first_difference(page, text.str());
  std::cerr << path << " differs from the config key table";
  if (difference.line == 0) {
    std::cerr << " in its line endings or its final newline\n";
  } else {
    std::cerr << " at line " << difference.line << ":\n  in the file: " << difference.theirs
              << "\n  generated:   " << difference.ours << "\n";
  }
  const std::string command = program + " -o " + path;
  std::cerr << "Regenerate it with: " << command << "\n";
  if (command != mpigrad::launch::kConfigReferenceCommand) {
    std::cerr << "(from the repository root after scripts/build.sh: "
              << mpigrad::launch::kConfigReferenceCommand << ")\n";
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 1) {
      std::cout << mpigrad::launch::config_reference_markdown();
      return 0;
    }
    if (argc != 3) return usage();
    const std::string_view option = argv[1];
    if (option == "--check") return check(argv[2], argv[0]);
    if (option != "-o") return usage();
    mpigrad::core::write_file_atomically(
        argv[2], [](std::ostream& out) { out << mpigrad::launch::config_reference_markdown(); });
    std::cout << "wrote " << argv[2] << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "mpigrad-config-reference: " << error.what() << "\n";
    return 1;
  }
}
