// The config keys of the timeline and of TensorBoard: [train] trace and its --trace flag (which
// overrides the file, and may not be given with --train.trace), and [train] tensorboard.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/config/train_config.h"

using namespace mpigrad;
namespace fs = std::filesystem;

namespace {
struct ConfigFile {
  fs::path dir = fs::temp_directory_path() / ("mpigrad-trace-config-" + std::to_string(getpid()));
  std::string ini;
  explicit ConfigFile(const std::string& extra) {
    fs::create_directories(dir);
    { std::ofstream(dir / "train.h5") << "stand-in: the parser only checks that it exists"; }
    ini = (dir / "run.ini").string();
    std::ofstream(ini) << "[data]\ntrain = " << (dir / "train.h5").string() << "\n[train]\n"
                       << extra;
  }
  ~ConfigFile() { fs::remove_all(dir); }
};
}  // namespace

TEST_CASE("[train] trace comes from the file, --train.trace or --trace; tensorboard is on") {
  ConfigFile file("trace = from_file.json\n");
  CHECK(launch::parse_train_config({"--config", file.ini}).train.trace == "from_file.json");
  CHECK(launch::parse_train_config({"--config", file.ini}).train.tensorboard);
  CHECK(launch::parse_train_config({"--config", file.ini, "--trace", "flag.json"}).train.trace ==
        "flag.json");
  CHECK(launch::parse_train_config({"--config", file.ini, "--trace=flag.json"}).train.trace ==
        "flag.json");
  CHECK(launch::parse_train_config({"--config", file.ini, "--train.trace=key.json"}).train.trace ==
        "key.json");
  CHECK_THROWS_WITH_AS(launch::parse_train_config(
                           {"--config", file.ini, "--trace", "a.json", "--train.trace=b.json"}),
                       doctest::Contains("not both"), core::Error);
  CHECK_FALSE(launch::parse_train_config({"--config", file.ini, "--train.tensorboard=false"})
                  .train.tensorboard);
  // The resolved config keeps the flag's value under its key.
  const launch::TrainConfig config =
      launch::parse_train_config({"--config", file.ini, "--trace", "flag.json"});
  CHECK(config.resolved_text().find("trace = flag.json\n") != std::string::npos);
  CHECK(launch::train_config_help().find("--trace FILE") != std::string::npos);
}

TEST_CASE("no trace by default") {
  ConfigFile file("");
  CHECK(launch::parse_train_config({"--config", file.ini}).train.trace.empty());
}
