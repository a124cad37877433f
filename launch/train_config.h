// defines: TrainConfig (and its sections), parse_train_config, train_config_help
//
// The configuration of `mpigrad train`: an INI file with the sections [data] [model] [optim]
// [sched] [train] [distributed], read by Boost.Program_options, where any key can be overridden
// on the command line as --section.key=value. Everything is checked here, before any training
// starts: an unknown key, a value of the wrong type or range, or a missing file is one error that
// names the key (and the config file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mpigrad::launch {

struct DataSection {
  std::vector<std::string> train;  // HDF5 files (shards), joined in order
  std::vector<std::string> test;
  std::string x = "x";             // field names
  std::string y = "y";
  int64_t num_classes = 10;
  std::optional<double> normalize_mean;  // inputs become (x / 255 - mean) / std when set
  std::optional<double> normalize_std;
};

struct ModelSection {
  std::string name = "mlp";                 // mlp | cnn
  std::vector<int64_t> hidden = {256, 128};  // MLP hidden widths, or the CNN's FC widths
  std::vector<int64_t> channels = {32, 64};  // CNN conv channels
  double dropout = 0.0;
};

struct OptimSection {
  std::string name = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
};

struct SchedSection {
  std::string name = "none";  // none | cosine (linear warmup, then cosine to zero)
  int64_t warmup_steps = 0;
};

struct TrainSection {
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: no limit
  int64_t batch_size = 64;  // per rank
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t log_every = 50;
  std::string out_dir = "runs/mpigrad";
  std::string resume;  // checkpoint to resume from
  bool save_initial = false;
  int64_t grad_accum_steps = 1;
  double clip_grad_norm = 0.0;  // 0: off
};

struct DistributedSection {
  std::string backend = "auto";  // auto | mpi | nccl
  double bucket_cap_mb = 25.0;
  bool sync_bn = false;
  bool find_unused_parameters = false;
  std::string compression = "none";  // none | bf16 | fp16
  bool shared_memory = true;         // host gradients averaged in shared memory on one node
  double timeout_s = 300.0;
};

struct TrainConfig {
  DataSection data;
  ModelSection model;
  OptimSection optim;
  SchedSection sched;
  TrainSection train;
  DistributedSection distributed;
  std::string config_file;
  bool dry_run = false;
  bool help = false;
  // The resolved configuration as INI text (what out_dir/config.ini gets, and checkpoints keep).
  std::string resolved_text() const;
};

// Parses `mpigrad train` arguments (without the program and subcommand names): --config FILE,
// --dry-run, --help and --section.key=value overrides. Throws core::Error on any bad input.
TrainConfig parse_train_config(const std::vector<std::string>& args);

// The --help text: usage and every key with its default.
std::string train_config_help();

}  // namespace mpigrad::launch
