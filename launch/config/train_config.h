// The configuration of `mpigrad train`: an INI file with the sections [data] [model] [loss]
// [optim] [sched] [train] [distributed], read by Boost.Program_options, where any key can be
// overridden on the command line as --section.key=value.
//
// Every key is declared once, in the table behind config_keys() (train_config.cpp): its name,
// its help, the struct field it sets and how its text is parsed and printed. The defaults are
// the struct's member initializers below. Parsing, --help, the resolved config.ini that every
// run writes and the README's key table (checked by a test) all follow from that table.
// Enum-valued keys are parsed once, into the enums below; an unknown value is an error that
// lists the accepted ones.
//
// Everything is checked here, before any training starts: an unknown key, a value of the wrong
// type or range, or a missing file is one error that names the key (and the config file).
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/data/augment.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/nn/encoder_with_head.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/mixed_precision.h"

namespace mpigrad::launch {

// Onnx: a graph exported from PyTorch ([model] file), trained as nn::OnnxModel; its weights and
// shapes come from the file, so the other [model] keys do not apply to it.
enum class ModelKind : uint8_t { Mlp, Cnn, Conv, ResNet, Onnx };
inline constexpr core::EnumName<ModelKind> kModelKindNames[] = {{ModelKind::Mlp, "mlp"},
                                                                {ModelKind::Cnn, "cnn"},
                                                                {ModelKind::Conv, "conv"},
                                                                {ModelKind::ResNet, "resnet"},
                                                                {ModelKind::Onnx, "onnx"}};

enum class LossKind : uint8_t { CrossEntropy, Mse, L1 };
inline constexpr core::EnumName<LossKind> kLossKindNames[] = {
    {LossKind::CrossEntropy, "cross_entropy"}, {LossKind::Mse, "mse"}, {LossKind::L1, "l1"}};

enum class OptimizerKind : uint8_t { Sgd, Adam, AdamW };
inline constexpr core::EnumName<OptimizerKind> kOptimizerKindNames[] = {
    {OptimizerKind::Sgd, "sgd"}, {OptimizerKind::Adam, "adam"}, {OptimizerKind::AdamW, "adamw"}};

enum class SchedulerKind : uint8_t { None, Cosine, Step, MultiStep, Linear, Polynomial };
inline constexpr core::EnumName<SchedulerKind> kSchedulerKindNames[] = {
    {SchedulerKind::None, "none"},     {SchedulerKind::Cosine, "cosine"},
    {SchedulerKind::Step, "step"},     {SchedulerKind::MultiStep, "multistep"},
    {SchedulerKind::Linear, "linear"}, {SchedulerKind::Polynomial, "polynomial"}};

// What `mpigrad train` trains: today's classifier (supervised), stage 1 of two-stage training
// (supcon: encoder + projection head on two augmented views, SupConLoss) or stage 2
// (classifier: a head on the encoder of an [train] init_from checkpoint).
enum class StageKind : uint8_t { Supervised, SupCon, Classifier };
inline constexpr core::EnumName<StageKind> kStageKindNames[] = {
    {StageKind::Supervised, "supervised"},
    {StageKind::SupCon, "supcon"},
    {StageKind::Classifier, "classifier"}};

struct DataSection {
  std::vector<std::string> train;  // HDF5 files (shards), joined in order
  std::vector<std::string> test;
  std::string x = "x";  // field names
  std::string y = "y";
  int64_t num_classes = 10;
  // Per-channel (or one for all channels) normalization: x becomes (x - mean[c]) / std[c],
  // after uint8 inputs are scaled to [0, 1]. Empty: no normalization.
  std::vector<double> mean;
  std::vector<double> std;
  data::AugmentSpec augment;  // training loader only (data/augment.h)
};

struct ModelSection {
  ModelKind name = ModelKind::Mlp;
  std::vector<int64_t> hidden = {256, 128};  // MLP hidden widths, or the CNN's FC widths
  std::vector<int64_t> channels = {32, 64};  // conv channels (cnn, conv)
  double dropout = 0.0;
  std::vector<int64_t> input_shape;  // one sample's shape; empty: the data's (mpigrad train)
  int64_t outputs = 0;               // outputs (classes, values, channels); 0: from the data
  int64_t kernel_size = 3;           // conv
  nn::PaddingMode padding_mode = nn::PaddingMode::Zeros;  // cnn, conv
  int64_t projection = 128;                  // stage supcon: the projection head's outputs
  nn::HeadKind head = nn::HeadKind::Linear;  // stage classifier: the head on the encoder
  int64_t depth = 18;                        // resnet: 18 or 34
  int64_t width = 64;  // resnet: channels of the first stage (then 2w, 4w, 8w)
  // onnx: the .onnx file; a relative path is taken from the working directory, like [data]
  // train's files (and the C API's, whose config text has no folder of its own).
  std::string file;
};

struct LossSection {
  LossKind name = LossKind::CrossEntropy;
  double temperature = 0.1;  // stage supcon (base_temperature is the same, as in BioEncoder)
};

struct OptimSection {
  OptimizerKind name = OptimizerKind::Sgd;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
};

struct SchedSection {
  SchedulerKind name = SchedulerKind::None;  // cosine: linear warmup, then cosine to zero
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;          // cosine, linear, polynomial: the length; 0: the run's steps
  int64_t step_size = 1000;         // step: lr *= gamma every step_size steps
  double gamma = 0.1;               // step, multistep
  std::vector<int64_t> milestones;  // multistep: lr *= gamma at each of these steps
  double start_factor = 1.0;        // linear: lr * start_factor at step 0 ...
  double end_factor = 0.0;          // ... to lr * end_factor at total_steps
  double power = 1.0;               // polynomial: lr * (1 - step / total_steps)^power
};

struct TrainSection {
  int64_t epochs = 1;
  int64_t max_steps = 0;    // 0: no limit
  int64_t batch_size = 64;  // per rank
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t log_every = 50;
  std::string out_dir = "runs/mpigrad";
  std::string resume;  // checkpoint to resume from; "auto": the newest in out_dir, if any
  bool save_initial = false;
  int64_t keep_checkpoints = 0;  // keep the newest N ckpt-epoch*.h5 files; 0: keep all
  // Signals that stop the run at the next step boundary with a checkpoint, and the wall time
  // after which it stops so by itself (0: none); launch/train/preemption.h.
  std::vector<int> stop_signals = {SIGTERM, SIGINT, SIGUSR1};
  int64_t time_limit_s = 0;
  int64_t grad_accum_steps = 1;
  double clip_grad_norm = 0.0;  // 0: off
  // Embedded models on CUDA (launch/train/captured_step.h): replay forward and backward as a
  // CUDA graph after this many warm-up steps. mpigrad train refuses it.
  bool cuda_graphs = false;
  int64_t cuda_graph_warmup = 3;
  double ema_decay = 0.0;  // 0: no EMA; otherwise evaluation uses the EMA weights
  StageKind stage = StageKind::Supervised;
  std::string init_from;       // stage classifier: the checkpoint whose encoder.* is loaded
  bool freeze_encoder = true;  // stage classifier: train the head only
  int64_t swa_start = 0;       // SWA from this epoch on (1-based); 0: off (launch/train/swa.h)
  double swa_lr = 0.0;         // constant lr from swa_start; 0: the schedule's lr is kept
  bool tensorboard = true;     // rank 0 writes TensorBoard event files to out_dir/tb
  std::string trace;           // the merged timeline of every rank (Chrome trace JSON); empty: off
  nn::Precision precision = nn::Precision::Float32;  // autocast (nn/mixed_precision.h)
  int64_t loss_scale_growth_interval = 2000;         // fp16: clean steps before the scale grows
};

// [distributed] reduce_dtype: the dtype gradient buckets are averaged in, whatever the compute
// precision. bf16 is the same as compression = bf16 (one mechanism: DDP's bucket cast); fp32,
// the default, leaves the older compression key in charge.
enum class ReduceDType : uint8_t { Float32, BFloat16 };
inline constexpr core::EnumName<ReduceDType> kReduceDTypeNames[] = {
    {ReduceDType::Float32, "fp32"}, {ReduceDType::BFloat16, "bf16"}};

struct DistributedSection {
  Backend backend = Backend::Auto;
  double bucket_cap_mb = 25.0;
  bool sync_bn = false;
  bool find_unused_parameters = false;
  GradCompression compression = GradCompression::None;
  ReduceDType reduce_dtype = ReduceDType::Float32;
  bool shared_memory = true;  // host gradients averaged in shared memory on one node
  TransportKind transport = TransportKind::Auto;
  double timeout_s = 300.0;
  int64_t zero = 0;  // ZeRO stage: 0 or 1
};

struct TrainConfig {
  DataSection data;
  ModelSection model;
  LossSection loss;
  OptimSection optim;
  SchedSection sched;
  TrainSection train;
  DistributedSection distributed;
  std::string config_file;
  bool dry_run = false;
  bool help = false;
  // The resolved configuration as INI text (what out_dir/config.ini gets, and checkpoints keep):
  // every key of config_keys(), section by section.
  std::string resolved_text() const;
};

// One configuration key, declared once in config_keys().
struct ConfigKey {
  std::string name;      // "train.epochs"
  std::string help;      // "epochs"
  std::string accepted;  // "an integer >= 1", "mlp | cnn", ...
  // Sets the key's field from `text`; `where` names the key and its origin in errors.
  std::function<void(TrainConfig&, const std::string& text, const std::string& where)> parse;
  // The field's value as config text (parse(print(c)) gives the same value back).
  std::function<std::string(const TrainConfig&)> print;

  std::string section() const { return name.substr(0, name.find('.')); }
  std::string key() const { return name.substr(name.find('.') + 1); }
  std::string default_text() const { return print(TrainConfig{}); }
};

// Every key of `mpigrad train`, in the order of --help and config.ini.
const std::vector<ConfigKey>& config_keys();

// Parses `mpigrad train` arguments (without the program and subcommand names): --config FILE,
// --dry-run, --help and --section.key=value overrides. Throws core::Error on any bad input.
TrainConfig parse_train_config(const std::vector<std::string>& args);

// Parses INI text holding only the keys `allowed` names: a section ("model") or one key
// ("train.seed"); an empty span allows every key. For programs that reuse part of this table
// (the C API reads [model] [loss] [optim] [sched] and [train] seed). `origin` names the text in
// errors (a file name, or "config text"). Other keys are errors; keys not given keep their
// defaults. Files are not checked.
TrainConfig parse_config_text(const std::string& text, const std::string& origin,
                              std::span<const std::string> allowed = {});

// The --help text: usage, how inputs and labels are read, and every key with its default.
std::string train_config_help();

}  // namespace mpigrad::launch
