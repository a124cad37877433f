// Writing through a temporary file and a rename (core/atomic_file.h): a complete write replaces
// the target, and every failure (the writer throws, the stream fails, the temporary file cannot
// be created, the rename fails) leaves the target as it was and no temporary file behind.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../error_message.h"
#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"

namespace {

namespace fs = std::filesystem;
using mpigrad::core::AtomicFile;
using mpigrad::core::write_file_atomically;
using mpigrad::test::error_message;

// A fresh folder under the system's temporary folder, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "mpigrad-atomic-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // The names in the folder, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(path_)) {
      out.push_back(entry.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("atomic file: a complete write replaces the target and leaves nothing else") {
  ScratchDir dir;
  const std::string path = dir.file("out.txt");
  write_file_atomically(path, [](std::ostream& out) { out << "first\n"; });
  CHECK(read_all(path) == "first\n");
  write_file_atomically(path, [](std::ostream& out) { out << "second"; });
  CHECK(read_all(path) == "second");
  CHECK(dir.names() == std::vector<std::string>{"out.txt"});
}

TEST_CASE("atomic file: a link makes the target another name of a file, with nothing copied") {
  using mpigrad::core::link_file_atomically;
  ScratchDir dir;
  const std::string epoch = dir.file("ckpt-epoch1.h5"), last = dir.file("last.h5");
  write_file_atomically(epoch, [](std::ostream& out) { out << "epoch 1"; });
  write_file_atomically(last, [](std::ostream& out) { out << "an older epoch"; });
  std::ofstream(last + ".tmp") << "left over by a killed run";
  REQUIRE(link_file_atomically(epoch, last));  // this machine's /tmp has hard links
  CHECK(fs::equivalent(epoch, last));
  CHECK(read_all(last) == "epoch 1");
  CHECK(dir.names() == std::vector<std::string>{"ckpt-epoch1.h5", "last.h5"});
  // The next epoch's file is written atomically, so the link's other name keeps the old bytes;
  // and removing one name leaves the other.
  write_file_atomically(epoch, [](std::ostream& out) { out << "epoch 2"; });
  CHECK(read_all(last) == "epoch 1");
  fs::remove(epoch);
  CHECK(read_all(last) == "epoch 1");
  // A link that cannot be made (here: no such file) changes nothing and asks for a write.
  CHECK_FALSE(link_file_atomically(epoch, last));
  CHECK(read_all(last) == "epoch 1");
  CHECK(dir.names() == std::vector<std::string>{"last.h5"});
  // Linking a name to its own file again is done at once, and leaves no temporary behind.
  const std::string other = dir.file("other.h5");
  REQUIRE(link_file_atomically(last, other));
  CHECK(link_file_atomically(last, other));
  CHECK(dir.names() == std::vector<std::string>{"last.h5", "other.h5"});
}

TEST_CASE("atomic file: the temporary file sits beside the target until the rename") {
  ScratchDir dir;
  const std::string path = dir.file("out.txt");
  write_file_atomically(path, [&](std::ostream& out) {
    out << "new";
    CHECK_FALSE(fs::exists(path));
    CHECK(dir.names().size() == 1);
    CHECK(contains(dir.names().at(0), "out.txt.tmp"));
  });
  CHECK(read_all(path) == "new");
}

TEST_CASE("atomic file: an exception from the writer removes the temporary file") {
  ScratchDir dir;
  const std::string path = dir.file("out.txt");
  write_file_atomically(path, [](std::ostream& out) { out << "old"; });
  CHECK_THROWS_WITH_AS(write_file_atomically(path,
                                             [](std::ostream& out) {
                                               out << "half";
                                               throw std::runtime_error("writer gave up");
                                             }),
                       "writer gave up", std::runtime_error);
  CHECK(read_all(path) == "old");
  CHECK(dir.names() == std::vector<std::string>{"out.txt"});
}

TEST_CASE("atomic file: a stream that fails is an error naming the path, and nothing is left") {
  ScratchDir dir;
  const std::string path = dir.file("out.txt");
  const std::string error = error_message([&] {
    write_file_atomically(path, [](std::ostream& out) {
      out << "partial";
      out.setstate(std::ios::badbit);  // as a full disk leaves it
    });
  });
  CHECK(contains(error, "cannot write '" + path + "'"));
  CHECK(dir.names().empty());
}

TEST_CASE("atomic file: a failed rename is an error naming the path, and nothing is left") {
  ScratchDir dir;
  // A non-empty folder where the file should go: the rename cannot replace it.
  const std::string path = dir.file("out.txt");
  fs::create_directories(fs::path(path) / "inside");
  const std::string error =
      error_message([&] { write_file_atomically(path, [](std::ostream& out) { out << "data"; }); });
  CHECK(contains(error, "cannot write '" + path + "'"));
  CHECK(contains(error, "renaming the temporary file"));
  CHECK(dir.names() == std::vector<std::string>{"out.txt"});
  CHECK(fs::is_directory(fs::path(path) / "inside"));
}

TEST_CASE("atomic file: a folder that does not exist is an error naming the path") {
  ScratchDir dir;
  const std::string path = dir.file("missing/out.txt");
  const std::string error =
      error_message([&] { write_file_atomically(path, [](std::ostream& out) { out << "data"; }); });
  CHECK(contains(error, "cannot write '" + path + "'"));
  CHECK(contains(error, "cannot create the temporary file"));
  CHECK(contains(error, "No such file or directory"));
  CHECK(dir.names().empty());
}

TEST_CASE("atomic file: an uncommitted AtomicFile removes what was written to its temporary") {
  ScratchDir dir;
  const std::string path = dir.file("out.bin");
  {
    AtomicFile file(path);
    CHECK(file.path() == path);
    CHECK(fs::path(file.temp_path()).parent_path() == fs::path(path).parent_path());
    std::ofstream(file.temp_path()) << "abandoned";
    CHECK(fs::exists(file.temp_path()));
  }
  CHECK(dir.names().empty());
  {
    AtomicFile file(path);
    std::ofstream(file.temp_path()) << "kept";
    file.commit();
    CHECK(file.committed());
    CHECK(contains(error_message([&] { file.commit(); }), "committed twice"));
  }
  CHECK(read_all(path) == "kept");
  CHECK(dir.names() == std::vector<std::string>{"out.bin"});
}

TEST_CASE("atomic file: the HDF5 writer's failed commit names the path and leaves nothing") {
  ScratchDir dir;
  const std::string path = dir.file("out.h5");
  fs::create_directories(fs::path(path) / "inside");
  {
    mpigrad::core::hdf5::AtomicFileWriter writer(path);
    writer.file().write_attribute("/", "step", int64_t(3));
    const std::string error = error_message([&] { writer.commit(); });
    CHECK(contains(error, "cannot write '" + path + "'"));
    CHECK(dir.names() == std::vector<std::string>{"out.h5"});
  }
  CHECK(dir.names() == std::vector<std::string>{"out.h5"});
  CHECK(fs::is_directory(fs::path(path) / "inside"));
}
