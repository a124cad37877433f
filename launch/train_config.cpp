#include "mpigrad/launch/train_config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "mpigrad/core/error.h"

namespace po = boost::program_options;

namespace mpigrad::launch {

namespace {

// One configurable key: its dotted name, default text, help, and how to apply a value.
struct Key {
  const char* name;  // "section.key"
  std::string default_text;
  const char* help;
  std::function<void(TrainConfig&, const std::string& value, const std::string& where)> apply;
};

[[noreturn]] void bad_value(const std::string& where, const std::string& value,
                            const char* expected) {
  core::fail(where, ": expected ", expected, ", got '", value, "'");
}

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

int64_t to_int(const std::string& value, const std::string& where, int64_t min) {
  std::string text = trim(value);
  int64_t parsed = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    bad_value(where, value, "an integer");
  }
  MPIGRAD_CHECK(parsed >= min, where, ": must be at least ", min, ", got ", parsed);
  return parsed;
}

double to_double(const std::string& value, const std::string& where) {
  std::string text = trim(value);
  try {
    size_t used = 0;
    double parsed = std::stod(text, &used);
    if (used == text.size() && std::isfinite(parsed)) return parsed;
  } catch (const std::exception&) {
  }
  bad_value(where, value, "a number");
}

bool to_bool(const std::string& value, const std::string& where) {
  std::string text = trim(value);
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  bad_value(where, value, "true or false");
}

std::vector<std::string> to_list(const std::string& value) {
  std::vector<std::string> items;
  std::stringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::vector<int64_t> to_int_list(const std::string& value, const std::string& where) {
  std::vector<int64_t> numbers;
  for (const std::string& item : to_list(value)) numbers.push_back(to_int(item, where, 1));
  MPIGRAD_CHECK(!numbers.empty(), where, ": expected a comma-separated list of positive integers");
  return numbers;
}

std::string one_of(const std::string& value, const std::string& where,
                   std::initializer_list<const char*> choices) {
  std::string text = trim(value);
  std::string expected;
  for (const char* choice : choices) {
    if (text == choice) return text;
    expected += expected.empty() ? choice : std::string(" | ") + choice;
  }
  core::fail(where, ": expected one of ", expected, ", got '", value, "'");
}

std::string join(const std::vector<int64_t>& numbers) {
  std::ostringstream text;
  for (size_t i = 0; i < numbers.size(); ++i) text << (i ? "," : "") << numbers[i];
  return text.str();
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::vector<Key> keys() {
  using C = TrainConfig;
  using S = const std::string&;
  return {
      {"data.train", "", "HDF5 training file(s), comma-separated shards",
       [](C& c, S v, S) { c.data.train = to_list(v); }},
      {"data.test", "", "HDF5 test file(s), comma-separated",
       [](C& c, S v, S) { c.data.test = to_list(v); }},
      {"data.x", "x", "name of the input field", [](C& c, S v, S) { c.data.x = trim(v); }},
      {"data.y", "y", "name of the label field", [](C& c, S v, S) { c.data.y = trim(v); }},
      {"data.num_classes", "10", "number of classes",
       [](C& c, S v, S w) { c.data.num_classes = to_int(v, w, 2); }},
      {"data.normalize", "", "mean,std applied after scaling uint8 inputs to [0, 1]",
       [](C& c, S v, S w) {
         std::vector<std::string> parts = to_list(v);
         if (parts.empty()) return;
         MPIGRAD_CHECK(parts.size() == 2, w, ": expected 'mean,std', got '", v, "'");
         c.data.normalize_mean = to_double(parts[0], w);
         c.data.normalize_std = to_double(parts[1], w);
         MPIGRAD_CHECK(*c.data.normalize_std > 0, w, ": std must be positive");
       }},
      {"model.name", "mlp", "mlp | cnn",
       [](C& c, S v, S w) { c.model.name = one_of(v, w, {"mlp", "cnn"}); }},
      {"model.hidden", "256,128", "hidden widths (MLP) or fully connected widths (CNN)",
       [](C& c, S v, S w) { c.model.hidden = to_int_list(v, w); }},
      {"model.channels", "32,64", "convolution channels (CNN)",
       [](C& c, S v, S w) { c.model.channels = to_int_list(v, w); }},
      {"model.dropout", "0", "dropout probability in [0, 1)",
       [](C& c, S v, S w) {
         c.model.dropout = to_double(v, w);
         MPIGRAD_CHECK(c.model.dropout >= 0 && c.model.dropout < 1, w, ": must be in [0, 1)");
       }},
      {"optim.name", "sgd", "sgd | adamw",
       [](C& c, S v, S w) { c.optim.name = one_of(v, w, {"sgd", "adamw"}); }},
      {"optim.lr", "0.05", "learning rate",
       [](C& c, S v, S w) {
         c.optim.lr = to_double(v, w);
         MPIGRAD_CHECK(c.optim.lr > 0, w, ": must be positive");
       }},
      {"optim.momentum", "0.9", "SGD momentum in [0, 1)",
       [](C& c, S v, S w) {
         c.optim.momentum = to_double(v, w);
         MPIGRAD_CHECK(c.optim.momentum >= 0 && c.optim.momentum < 1, w, ": must be in [0, 1)");
       }},
      {"optim.weight_decay", "0", "weight decay",
       [](C& c, S v, S w) {
         c.optim.weight_decay = to_double(v, w);
         MPIGRAD_CHECK(c.optim.weight_decay >= 0, w, ": must be non-negative");
       }},
      {"sched.name", "none", "none | cosine (linear warmup, then cosine decay)",
       [](C& c, S v, S w) { c.sched.name = one_of(v, w, {"none", "cosine"}); }},
      {"sched.warmup_steps", "0", "linear warmup steps",
       [](C& c, S v, S w) { c.sched.warmup_steps = to_int(v, w, 0); }},
      {"train.epochs", "1", "epochs", [](C& c, S v, S w) { c.train.epochs = to_int(v, w, 1); }},
      {"train.max_steps", "0", "stop after this many optimizer steps (0: no limit)",
       [](C& c, S v, S w) { c.train.max_steps = to_int(v, w, 0); }},
      {"train.batch_size", "64", "batch size per rank",
       [](C& c, S v, S w) { c.train.batch_size = to_int(v, w, 1); }},
      {"train.seed", "0", "seed of initialization, shuffling and dropout",
       [](C& c, S v, S w) { c.train.seed = uint64_t(to_int(v, w, 0)); }},
      {"train.shuffle", "true", "shuffle the training data every epoch",
       [](C& c, S v, S w) { c.train.shuffle = to_bool(v, w); }},
      {"train.log_every", "50", "log every N steps",
       [](C& c, S v, S w) { c.train.log_every = to_int(v, w, 1); }},
      {"train.out_dir", "runs/mpigrad", "where rank 0 writes metrics, checkpoints and the config",
       [](C& c, S v, S) { c.train.out_dir = trim(v); }},
      {"train.resume", "", "checkpoint to resume from",
       [](C& c, S v, S) { c.train.resume = trim(v); }},
      {"train.save_initial", "false", "write ckpt-step0.h5 before the first step",
       [](C& c, S v, S w) { c.train.save_initial = to_bool(v, w); }},
      {"train.grad_accum_steps", "1", "micro-steps per optimizer step",
       [](C& c, S v, S w) { c.train.grad_accum_steps = to_int(v, w, 1); }},
      {"train.clip_grad_norm", "0", "clip the global gradient norm (0: off)",
       [](C& c, S v, S w) {
         c.train.clip_grad_norm = to_double(v, w);
         MPIGRAD_CHECK(c.train.clip_grad_norm >= 0, w, ": must be non-negative");
       }},
      {"distributed.backend", "auto", "auto | mpi | nccl",
       [](C& c, S v, S w) { c.distributed.backend = one_of(v, w, {"auto", "mpi", "nccl"}); }},
      {"distributed.bucket_cap_mb", "25", "gradient bucket size in MiB",
       [](C& c, S v, S w) {
         c.distributed.bucket_cap_mb = to_double(v, w);
         MPIGRAD_CHECK(c.distributed.bucket_cap_mb > 0, w, ": must be positive");
       }},
      {"distributed.sync_bn", "false", "synchronize BatchNorm statistics across ranks",
       [](C& c, S v, S w) { c.distributed.sync_bn = to_bool(v, w); }},
      {"distributed.find_unused_parameters", "false", "reduce missing gradients as zeros",
       [](C& c, S v, S w) { c.distributed.find_unused_parameters = to_bool(v, w); }},
      {"distributed.compression", "none", "none | bf16 | fp16 gradient compression",
       [](C& c, S v, S w) {
         c.distributed.compression = one_of(v, w, {"none", "bf16", "fp16"});
       }},
      {"distributed.shared_memory", "true",
       "average host gradients in shared memory when all ranks share a node",
       [](C& c, S v, S w) { c.distributed.shared_memory = to_bool(v, w); }},
      {"distributed.timeout_s", "300", "collective timeout in seconds",
       [](C& c, S v, S w) {
         c.distributed.timeout_s = to_double(v, w);
         MPIGRAD_CHECK(c.distributed.timeout_s > 0, w, ": must be positive");
       }},
  };
}

po::options_description key_options() {
  po::options_description options("Configuration keys ([section] key = value in the file, or --section.key=value)");
  for (const Key& key : keys()) {
    options.add_options()(key.name, po::value<std::string>(), key.help);
  }
  return options;
}

void require_files(const std::vector<std::string>& paths, const char* key, bool required) {
  MPIGRAD_CHECK(!required || !paths.empty(), key, ": required (an HDF5 file or a comma-separated "
                "list of shards)");
  for (const std::string& path : paths) {
    MPIGRAD_CHECK(std::filesystem::is_regular_file(path), key, ": file '", path,
                  "' does not exist");
  }
}

}  // namespace

TrainConfig parse_train_config(const std::vector<std::string>& args) {
  po::options_description general("mpigrad train");
  general.add_options()("config", po::value<std::string>(), "INI configuration file")(
      "dry-run", "check the config, the data and the model, run one step, and exit")(
      "help,h", "show this help");
  po::options_description all;
  all.add(general).add(key_options());

  TrainConfig config;
  po::variables_map values;
  std::vector<std::string> from_command_line;
  try {
    // The command line is stored first: Program_options keeps the first value it sees, so a
    // --section.key flag overrides the same key in the file.
    po::store(po::command_line_parser(args).options(all).run(), values);
    for (const auto& [name, value] : values) from_command_line.push_back(name);
    if (values.count("help")) {
      config.help = true;
      return config;
    }
    if (values.count("config")) {
      config.config_file = values["config"].as<std::string>();
      std::ifstream file(config.config_file);
      MPIGRAD_CHECK(file.good(), "mpigrad train: cannot open config file '", config.config_file, "'");
      try {
        po::store(po::parse_config_file(file, key_options(), /*allow_unregistered=*/false), values);
      } catch (const po::error& error) {
        core::fail("config file '", config.config_file, "': ", error.what());
      }
    }
  } catch (const po::error& error) {
    core::fail("mpigrad train: ", error.what());
  }
  config.dry_run = values.count("dry-run") > 0;
  for (const Key& key : keys()) {
    std::string name = key.name;
    bool on_command_line = std::find(from_command_line.begin(), from_command_line.end(), name) !=
                           from_command_line.end();
    // "a.ini: [train] epochs" or "command line: --train.epochs"
    size_t dot = name.find('.');
    std::string where = on_command_line ? "command line: --" + name
                                        : config.config_file + ": [" + name.substr(0, dot) +
                                              "] " + name.substr(dot + 1);
    bool given = values.count(key.name) > 0;
    std::string value = given ? values[key.name].as<std::string>() : key.default_text;
    if (!given && key.default_text.empty()) continue;
    key.apply(config, value, where);
  }
  require_files(config.data.train, "[data] train", true);
  require_files(config.data.test, "[data] test", false);
  if (!config.train.resume.empty()) {
    MPIGRAD_CHECK(std::filesystem::is_regular_file(config.train.resume),
                  "[train] resume: checkpoint '", config.train.resume, "' does not exist");
  }
  return config;
}

std::string TrainConfig::resolved_text() const {
  std::ostringstream out;
  out << "[data]\ntrain = " << join(data.train) << "\ntest = " << join(data.test)
      << "\nx = " << data.x << "\ny = " << data.y << "\nnum_classes = " << data.num_classes << "\n";
  if (data.normalize_mean) {
    out << "normalize = " << number(*data.normalize_mean) << "," << number(*data.normalize_std)
        << "\n";
  }
  out << "\n[model]\nname = " << model.name << "\nhidden = " << join(model.hidden)
      << "\nchannels = " << join(model.channels) << "\ndropout = " << number(model.dropout)
      << "\n\n[optim]\nname = " << optim.name << "\nlr = " << number(optim.lr)
      << "\nmomentum = " << number(optim.momentum) << "\nweight_decay = "
      << number(optim.weight_decay) << "\n\n[sched]\nname = " << sched.name
      << "\nwarmup_steps = " << sched.warmup_steps << "\n\n[train]\nepochs = " << train.epochs
      << "\nmax_steps = " << train.max_steps << "\nbatch_size = " << train.batch_size
      << "\nseed = " << train.seed << "\nshuffle = " << (train.shuffle ? "true" : "false")
      << "\nlog_every = " << train.log_every << "\nout_dir = " << train.out_dir
      << "\nresume = " << train.resume << "\nsave_initial = "
      << (train.save_initial ? "true" : "false") << "\ngrad_accum_steps = "
      << train.grad_accum_steps << "\nclip_grad_norm = " << number(train.clip_grad_norm)
      << "\n\n[distributed]\nbackend = " << distributed.backend << "\nbucket_cap_mb = "
      << number(distributed.bucket_cap_mb) << "\nsync_bn = "
      << (distributed.sync_bn ? "true" : "false") << "\nfind_unused_parameters = "
      << (distributed.find_unused_parameters ? "true" : "false") << "\ncompression = "
      << distributed.compression << "\nshared_memory = "
      << (distributed.shared_memory ? "true" : "false")
      << "\ntimeout_s = " << number(distributed.timeout_s) << "\n";
  return out.str();
}

std::string train_config_help() {
  std::ostringstream out;
  out << "usage: mpigrad train --config FILE.ini [--dry-run] [--section.key=value ...]\n\n"
      << "Trains a classifier on HDF5 data under mpirun (or as one process).\n\n";
  for (const Key& key : keys()) {
    out << "  --" << key.name << "=VALUE";
    int pad = 34 - int(std::string(key.name).size());
    out << std::string(size_t(pad > 1 ? pad : 1), ' ') << key.help;
    if (!key.default_text.empty()) out << " (default " << key.default_text << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace mpigrad::launch
