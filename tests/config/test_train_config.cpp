// The one table of `mpigrad train` config keys: every key round-trips through its printer and
// parser, the resolved config.ini parses back to the same configuration, enum keys parse into
// enums and list their choices on a bad value, --help shows every key, and the configuration
// reference (docs/configuration.md, rendered from the table) lists every key under its section.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "../error_message.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/config/config_reference.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"

using namespace mpigrad;
using launch::ConfigKey;
using launch::TrainConfig;

namespace {
using mpigrad::test::error_message;
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
// Concatenation through a stream: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.
template <typename... Parts>
std::string text(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace

TEST_CASE("every key is declared once and round-trips through its printer and parser") {
  std::set<std::string> names;
  for (const ConfigKey& key : launch::config_keys()) {
    CAPTURE(key.name);
    CHECK(names.insert(key.name).second);
    CHECK(!key.help.empty());
    CHECK(!key.accepted.empty());
    TrainConfig config;
    const std::string printed = key.print(config);
    if (printed.empty()) continue;  // list keys without a default
    key.parse(config, printed, "test");
    CHECK(key.print(config) == printed);
  }
  CHECK(names.size() >= 35);
}

TEST_CASE("the resolved config.ini parses back to the same configuration") {
  TrainConfig config = launch::parse_config_text(
      "[data]\ntrain = a.h5, b.h5\nx = image\nmean = 0.49,0.48,0.45\nstd = 0.2,0.2,0.2\n"
      "[model]\nname = cnn\nchannels = 8,16\n[optim]\nname = adamw\nlr = 0.000123456789\n"
      "[sched]\nname = cosine\n[train]\nema_decay = 0.999\nseed = 18446744073709551615\n"
      "[distributed]\nbackend = nccl\ncompression = bf16\n",
      "text");
  CHECK(config.model.name == launch::ModelKind::Cnn);
  CHECK(config.optim.name == launch::OptimizerKind::AdamW);
  CHECK(config.sched.name == launch::SchedulerKind::Cosine);
  CHECK(config.distributed.backend == launch::Backend::Nccl);
  CHECK(config.distributed.compression == launch::GradCompression::BFloat16);
  CHECK(config.data.mean == std::vector<double>{0.49, 0.48, 0.45});
  CHECK(config.optim.lr == 0.000123456789);
  CHECK(config.train.seed == 18446744073709551615ull);
  const std::string resolved = config.resolved_text();
  CHECK(contains(resolved, "[data]\ntrain = a.h5,b.h5\n"));
  CHECK(contains(resolved, "lr = 0.000123456789\n"));
  CHECK(launch::parse_config_text(resolved, "resolved").resolved_text() == resolved);
  // Every key appears in the resolved text, under its section.
  for (const ConfigKey& key : launch::config_keys()) {
    CAPTURE(key.name);
    const size_t section = resolved.find(text("[", key.section(), "]\n"));
    REQUIRE(section != std::string::npos);
    CHECK(resolved.find(text("\n", key.key(), " = "), section) != std::string::npos);
  }
}

TEST_CASE("[data] read_ahead: a reader thread unless CPU compute threads fill the cores") {
  using launch::ReadAhead;
  CHECK(launch::parse_config_text("[data]\nread_ahead = off\n", "run.ini").data.read_ahead ==
        ReadAhead::Off);
  CHECK(launch::TrainConfig{}.data.read_ahead == ReadAhead::Auto);
  // auto: 2 threads x 1 rank on 2 CPUs, 1 x 2 on 2, 1 x 2 ranks bound to 1 CPU each: full.
  CHECK(launch::loader_workers(ReadAhead::Auto, true, 2, 1, 2) == 0);
  CHECK(launch::loader_workers(ReadAhead::Auto, true, 1, 2, 2) == 0);
  CHECK(launch::loader_workers(ReadAhead::Auto, true, 1, 2, 1) == 0);
  CHECK(launch::loader_workers(ReadAhead::Auto, true, 1, 1, 2) == 1);  // a core is free
  CHECK(launch::loader_workers(ReadAhead::Auto, true, 3, 1, 4) == 1);
  CHECK(launch::loader_workers(ReadAhead::Auto, false, 8, 1, 8) == 1);  // a GPU computes
  CHECK(launch::loader_workers(ReadAhead::On, true, 2, 1, 2) == 1);
  CHECK(launch::loader_workers(ReadAhead::Off, false, 1, 1, 8) == 0);
}

TEST_CASE("bad values name the key and what is accepted") {
  auto parse = [](const std::string& text) {
    return error_message([&] { launch::parse_config_text(text, "run.ini"); });
  };
  CHECK(contains(parse("[model]\nname = transformer\n"),
                 "run.ini: [model] name: expected one of mlp | cnn | conv | resnet | onnx | "
                 "schnet, got 'transformer'"));
  CHECK(contains(parse("[distributed]\nbackend = gloo\n"), "expected one of auto | mpi | nccl"));
  CHECK(contains(parse("[data]\nread_ahead = yes\n"),
                 "run.ini: [data] read_ahead: expected one of auto | on | off, got 'yes'"));
  CHECK(contains(parse("[train]\nepochs = 0\n"), "[train] epochs: must be at least 1, got 0"));
  CHECK(contains(parse("[optim]\nmomentum = 1\n"), "[optim] momentum: must be in [0, 1), got 1"));
  CHECK(contains(parse("[optim]\nlr = fast\n"), "[optim] lr: expected a number, got 'fast'"));
  CHECK(contains(parse("[data]\nstd = 0.3,0\n"), "[data] std: must be > 0, got 0"));
  CHECK(contains(parse("[data]\nmean = 0.5\n"), "[data] mean and std: give both or neither"));
  CHECK(contains(parse("[train]\nepochz = 3\n"), "train.epochz"));
  // A program that reuses only some sections refuses the others.
  const std::string sections[] = {"model", "optim"};
  std::string error = error_message(
      [&] { launch::parse_config_text("[data]\ntrain = a.h5\n", "embed.ini", sections); });
  CHECK(contains(error, "embed.ini"));
  CHECK(contains(error, "data.train"));
}

TEST_CASE("--help lists every key with its default, and how inputs and labels are read") {
  const std::string help = launch::train_config_help();
  for (const ConfigKey& key : launch::config_keys()) {
    CAPTURE(key.name);
    CHECK(contains(help, text("--", key.name, "=VALUE")));
    if (!key.default_text().empty()) {
      CHECK(contains(help, text("(default ", key.default_text(), ")")));
    }
  }
  CHECK(contains(help, "uint8 inputs are images and are scaled to [0, 1]"));
  CHECK(contains(help, "Float labels and labels outside that range are errors"));
}

TEST_CASE("the configuration reference lists every key under its section, with its default") {
  const std::string page = launch::config_reference_markdown();
  for (const ConfigKey& key : launch::config_keys()) {
    CAPTURE(key.name);
    const size_t section = page.find(text("\n## `[", key.section(), "]`\n"));
    REQUIRE(section != std::string::npos);
    const size_t next_section = page.find("\n## ", section + 1);
    const size_t row = page.find(text("\n| `", key.key(), "` | "), section);
    REQUIRE(row != std::string::npos);
    CHECK(row < next_section);
    const std::string line = page.substr(row + 1, page.find('\n', row + 1) - row - 1);
    const std::string default_text = key.default_text();
    CHECK(contains(line, default_text.empty() ? "| (empty) |" : text("| `", default_text, "` |")));
    CHECK(contains(line, launch::markdown_table_cell(key.help)));
  }
  // Accepted values hold '|', which would split a table cell: the page escapes it.
  CHECK(contains(page, "| mlp \\| cnn \\| conv \\| resnet \\| onnx \\| schnet |"));
  CHECK(launch::markdown_table_cell("a | b\nc") == "a \\| b c");
}

TEST_CASE("docs/configuration.md lists every key under its section") {
  std::ifstream file(MPIGRAD_SOURCE_DIR "/docs/configuration.md");
  REQUIRE(file.good());
  std::map<std::string, std::set<std::string>> keys;  // section -> keys in its table
  std::string section;
  for (std::string line; std::getline(file, line);) {
    if (line.starts_with("## `[")) section = line.substr(5, line.find("]`") - 5);
    if (line.starts_with("| `") && !section.empty()) {
      keys[section].insert(line.substr(3, line.find('`', 3) - 3));
    }
  }
  for (const ConfigKey& key : launch::config_keys()) {
    CAPTURE(key.name);
    CHECK(keys[key.section()].count(key.key()) == 1);
  }
}
