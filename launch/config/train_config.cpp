#include "mpigrad/launch/config/train_config.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/train/preemption.h"

namespace po = boost::program_options;

namespace mpigrad::launch {

namespace {

// Trims at least what Boost trims from a config line's ends (" \t\r\n"), so that an item
// printed into config.ini parses back the same.
std::string trim(const std::string& text) {
  const char* whitespace = " \t\r\n\f\v";
  size_t begin = text.find_first_not_of(whitespace);
  size_t end = text.find_last_not_of(whitespace);
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

std::vector<std::string> split_list(const std::string& value) {
  std::vector<std::string> items;
  std::stringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

template <typename T>
std::string join(const std::vector<T>& items, const std::function<std::string(const T&)>& print) {
  std::string text;
  for (const T& item : items) {
    if (!text.empty()) text.push_back(',');
    text.append(print(item));
  }
  return text;
}

[[noreturn]] void bad_value(const std::string& where, const std::string& value,
                            const std::string& expected) {
  core::fail(where, ": expected ", expected, ", got '", value, "'");
}

// ---- Codecs: how one kind of value is parsed, printed and described ----------------------------

struct Integer {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  int64_t parse(const std::string& value, const std::string& where) const {
    std::string text = trim(value);
    int64_t parsed = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
      bad_value(where, value, "an integer");
    }
    MPIGRAD_CHECK(parsed >= min, where, ": must be at least ", min, ", got ", parsed);
    MPIGRAD_CHECK(parsed <= max, where, ": must be at most ", max, ", got ", parsed);
    return parsed;
  }
  std::string print(int64_t value) const { return std::to_string(value); }
  std::string accepted() const {
    if (max != std::numeric_limits<int64_t>::max()) {
      return "an integer from " + std::to_string(min) + " to " + std::to_string(max);
    }
    return "an integer >= " + std::to_string(min);
  }
};

struct Unsigned {
  uint64_t parse(const std::string& value, const std::string& where) const {
    std::string text = trim(value);
    uint64_t parsed = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
      bad_value(where, value, "a non-negative integer");
    }
    return parsed;
  }
  std::string print(uint64_t value) const { return std::to_string(value); }
  std::string accepted() const { return "an integer >= 0"; }
};

// The shortest text that reads back as the same double.
std::string shortest(double value) {
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return error == std::errc() ? std::string(buffer, end) : std::to_string(value);
}

double parse_number(const std::string& value, const std::string& where) {
  std::string text = trim(value);
  double parsed = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (error != std::errc() || end != text.data() + text.size() || text.empty() ||
      !std::isfinite(parsed)) {
    bad_value(where, value, "a number");
  }
  return parsed;
}

// A finite number in a range whose ends may be open: {0, true} is "> 0", {0, false, 1, true}
// is "in [0, 1)".
struct Number {
  double low = -std::numeric_limits<double>::infinity();
  bool low_open = false;
  double high = std::numeric_limits<double>::infinity();
  bool high_open = false;

  bool contains(double x) const {
    return (low_open ? x > low : x >= low) && (high_open ? x < high : x <= high);
  }
  std::string range() const {
    bool bounded_low = std::isfinite(low), bounded_high = std::isfinite(high);
    if (bounded_low && bounded_high) {
      return std::string("in ") + (low_open ? "(" : "[") + shortest(low) + ", " + shortest(high) +
             (high_open ? ")" : "]");
    }
    if (bounded_low) return (low_open ? "> " : ">= ") + shortest(low);
    if (bounded_high) return (high_open ? "< " : "<= ") + shortest(high);
    return "";
  }
  double parse(const std::string& value, const std::string& where) const {
    double parsed = parse_number(value, where);
    MPIGRAD_CHECK(contains(parsed), where, ": must be ", range(), ", got ", shortest(parsed));
    return parsed;
  }
  std::string print(double value) const { return shortest(value); }
  std::string accepted() const { return range().empty() ? "a number" : "a number " + range(); }
};

struct Boolean {
  bool parse(const std::string& value, const std::string& where) const {
    std::string text = trim(value);
    if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "0" || text == "no" || text == "off") return false;
    bad_value(where, value, "true or false");
  }
  std::string print(bool value) const { return value ? "true" : "false"; }
  std::string accepted() const { return "true | false"; }
};

struct Text {
  std::string parse(const std::string& value, const std::string&) const { return trim(value); }
  std::string print(const std::string& value) const { return value; }
  std::string accepted() const { return "text"; }
};

struct TextList {
  std::vector<std::string> parse(const std::string& value, const std::string&) const {
    return split_list(value);
  }
  std::string print(const std::vector<std::string>& items) const {
    return join<std::string>(items, [](const std::string& item) { return item; });
  }
  std::string accepted() const { return "a comma-separated list"; }
};

struct IntegerList {
  int64_t min = 1;
  bool may_be_empty = false;
  std::vector<int64_t> parse(const std::string& value, const std::string& where) const {
    std::vector<int64_t> numbers;
    for (const std::string& item : split_list(value)) {
      numbers.push_back(Integer{min}.parse(item, where));
    }
    MPIGRAD_CHECK(may_be_empty || !numbers.empty(), where,
                  ": expected a comma-separated list of integers >= ", min);
    return numbers;
  }
  std::string print(const std::vector<int64_t>& numbers) const {
    return join<int64_t>(numbers, [](const int64_t& n) { return std::to_string(n); });
  }
  std::string accepted() const {
    return "a comma-separated list of integers >= " + std::to_string(min);
  }
};

struct NumberList {
  Number each;
  std::vector<double> parse(const std::string& value, const std::string& where) const {
    std::vector<double> numbers;
    for (const std::string& item : split_list(value)) numbers.push_back(each.parse(item, where));
    return numbers;
  }
  std::string print(const std::vector<double>& numbers) const {
    return join<double>(numbers, [](const double& x) { return shortest(x); });
  }
  std::string accepted() const { return "one number, or a comma-separated list (one per channel)"; }
};

template <typename E>
struct Choice {
  std::span<const core::EnumName<E>> names;
  E parse(const std::string& value, const std::string& where) const {
    return core::parse_enum<E>(trim(value), names, where);
  }
  std::string print(E value) const { return std::string(core::enum_name(value, names)); }
  std::string accepted() const { return core::enum_choices(names); }
};

struct StopSignals {
  std::vector<int> parse(const std::string& value, const std::string& where) const {
    return parse_stop_signals(value, where);
  }
  std::string print(const std::vector<int>& signals) const {
    if (signals.empty()) return "none";
    return join<int>(signals, [](const int& signal) { return stop_signal_name(signal); });
  }
  std::string accepted() const {
    return "a comma-separated list of " + stop_signal_names() + ", or none";
  }
};

struct Duration {
  int64_t parse(const std::string& value, const std::string& where) const {
    return parse_duration(value, where);
  }
  std::string print(int64_t seconds) const { return format_duration(seconds); }
  std::string accepted() const { return "a duration such as 3h50m, 90m, 45s; 0: none"; }
};

struct Composition {
  std::optional<data::BatchComposition> parse(const std::string& value,
                                              const std::string& where) const {
    const std::string text = trim(value);
    if (text.empty()) return std::nullopt;
    try {
      return data::BatchComposition::parse(text);
    } catch (const core::Error& error) {
      core::fail(where, ": ", error.what());
    }
  }
  std::string print(const std::optional<data::BatchComposition>& composition) const {
    return composition ? composition->text() : "";
  }
  std::string accepted() const {
    return "counts like 16,16, ratios like 0.7,0.3, or balanced; empty: by the stores' sizes";
  }
};

struct Augmentations {
  data::AugmentSpec parse(const std::string& value, const std::string& where) const {
    return data::parse_augment(value, where);
  }
  std::string print(const data::AugmentSpec& spec) const { return data::augment_text(spec); }
  std::string accepted() const { return "comma-separated crop:P, flip, noise:S; empty: none"; }
};

// One row of the table: the key's name, the section and field it sets, its codec and help.
template <typename Section, typename T, typename Codec>
ConfigKey key(std::string name, Section TrainConfig::*section, T Section::*field, Codec codec,
              std::string help) {
  ConfigKey row;
  row.name = std::move(name);
  row.help = std::move(help);
  row.accepted = codec.accepted();
  row.parse = [=](TrainConfig& config, const std::string& text, const std::string& where) {
    (config.*section).*field = codec.parse(text, where);
  };
  row.print = [=](const TrainConfig& config) { return codec.print((config.*section).*field); };
  return row;
}

std::vector<ConfigKey> make_config_keys() {
  using C = TrainConfig;
  const Number positive{.low = 0, .low_open = true};
  const Number non_negative{.low = 0};
  const Number fraction{.low = 0, .high = 1, .high_open = true};
  const Number after_switch{.low = -1};
  return {
      key("data.train", &C::data, &DataSection::train, TextList{},
          "HDF5 training file(s), comma-separated shards, or atomic stores (Zarr folders, or HDF5 "
          "files with meta/ and core/) (required)"),
      key("data.test", &C::data, &DataSection::test, TextList{},
          "HDF5 test file(s), comma-separated shards"),
      key("data.x", &C::data, &DataSection::x, Text{}, "name of the input field"),
      key("data.y", &C::data, &DataSection::y, Text{},
          "name of the label field (integer class labels)"),
      key("data.num_classes", &C::data, &DataSection::num_classes, Integer{2},
          "number of classes; labels must lie in [0, num_classes)"),
      key("data.mean", &C::data, &DataSection::mean, NumberList{},
          "normalization mean: one value, or one per channel"),
      key("data.std", &C::data, &DataSection::std, NumberList{positive},
          "normalization std: one value, or one per channel"),
      key("data.augment", &C::data, &DataSection::augment, Augmentations{},
          "training augmentations: crop:P (zero-pad P, random crop), flip (horizontal, p 0.5), "
          "noise:S (Gaussian, after normalization)"),
      key("data.samples_per_dataset", &C::data, &DataSection::samples_per_dataset, Composition{},
          "several atomic stores: each batch's samples of each store (counts sum to "
          "train.batch_size; ratios and balanced are shared out)"),
      key("data.epoch_policy", &C::data, &DataSection::epoch_policy,
          Choice<data::EpochPolicy>{data::kEpochPolicyNames},
          "several atomic stores: batches per epoch: all samples (dataset_size), until the "
          "smallest store is used up (min_size), or the largest (max_size)"),
      key("data.replacement", &C::data, &DataSection::replacement, Boolean{},
          "several atomic stores: samples may repeat within an epoch (ALCHEMI's default)"),
      key("data.max_atoms", &C::data, &DataSection::max_atoms, Integer{0},
          "atomic stores: > 0: batches of at most this many atoms instead of train.batch_size "
          "structures"),
      key("data.read_ahead", &C::data, &DataSection::read_ahead,
          Choice<ReadAhead>{kReadAheadNames},
          "a thread reads the next batches while a step computes; auto: unless the CPU compute "
          "threads of the node's ranks fill this rank's cores"),
      key("model.name", &C::model, &ModelSection::name, Choice<ModelKind>{kModelKindNames},
          "the model (conv: fully convolutional, the output keeps the input's size)"),
      key("model.hidden", &C::model, &ModelSection::hidden, IntegerList{1, true},
          "hidden widths (mlp; none: one linear layer), fully connected widths (cnn), or one "
          "width (schnet: features per atom and filters per edge)"),
      key("model.channels", &C::model, &ModelSection::channels, IntegerList{1, true},
          "convolution channels (cnn; conv: the widths before its last conv)"),
      key("model.dropout", &C::model, &ModelSection::dropout, fraction,
          "dropout probability in [0, 1)"),
      key("model.input_shape", &C::model, &ModelSection::input_shape, IntegerList{1, true},
          "one sample's input shape, e.g. 1,32,32 (mpigrad train: the data's when empty)"),
      key("model.outputs", &C::model, &ModelSection::outputs, Integer{0},
          "outputs: classes or values (mlp, cnn), channels (conv); 0: from the data"),
      key("model.kernel_size", &C::model, &ModelSection::kernel_size, Integer{1},
          "convolution kernel size (conv; odd)"),
      key("model.padding_mode", &C::model, &ModelSection::padding_mode,
          Choice<nn::PaddingMode>{nn::kPaddingModeNames},
          "convolution padding (cnn, conv); circular for periodic grids"),
      key("model.projection", &C::model, &ModelSection::projection, Integer{1},
          "stage supcon: outputs of the projection head Linear(f,f) ReLU Linear(f,projection)"),
      key("model.head", &C::model, &ModelSection::head, Choice<nn::HeadKind>{nn::kHeadKindNames},
          "stage classifier: the head on the encoder (mlp: Linear(f,f) ReLU Linear(f,classes))"),
      key("model.depth", &C::model, &ModelSection::depth, Integer{18},
          "resnet: 18 or 34 (basic blocks [2,2,2,2] or [3,4,6,3])"),
      key("model.width", &C::model, &ModelSection::width, Integer{1},
          "resnet: channels of the first stage; the stages have w, 2w, 4w, 8w"),
      key("model.file", &C::model, &ModelSection::file, Text{},
          "onnx: the .onnx file exported from PyTorch (relative to the working directory)"),
      key("model.n_rbf", &C::model, &ModelSection::n_rbf, Integer{1},
          "schnet: Gaussians of the radial basis of edge lengths, from 0 to [graph] cutoff"),
      key("model.interactions", &C::model, &ModelSection::interactions, Integer{1},
          "schnet: continuous-filter convolutions (interaction blocks); its width is hidden"),
      key("graph.cutoff", &C::graph, &GraphSection::cutoff, non_negative,
          "interatomic potentials: rebuild each batch's neighbor list with this cutoff, periodic "
          "images included (schnet's cutoff too); 0: the store's neighbor_list"),
      key("graph.max_neighbors", &C::graph, &GraphSection::max_neighbors, Integer{0},
          "keep each atom's nearest N neighbors (0: every one within the cutoff)"),
      key("graph.self_loops", &C::graph, &GraphSection::self_loops, Boolean{},
          "an edge from each atom to itself"),
      key("loss.name", &C::loss, &LossSection::name, Choice<LossKind>{kLossKindNames},
          "the loss: cross_entropy for classes (mpigrad train), mse or l1 for regression, "
          "energy_force for interatomic potentials"),
      key("loss.temperature", &C::loss, &LossSection::temperature, positive,
          "stage supcon: SupConLoss temperature (and base temperature)"),
      key("loss.energy_weight", &C::loss, &LossSection::energy_weight, non_negative,
          "energy_force: the weight of the energy term"),
      key("loss.force_weight", &C::loss, &LossSection::force_weight, non_negative,
          "energy_force: the weight of the force term (forces = -dE/dpositions)"),
      key("loss.stress_weight", &C::loss, &LossSection::stress_weight, non_negative,
          "energy_force: the weight of the stress term (the strain derivative over the volume)"),
      key("loss.per_atom_energy", &C::loss, &LossSection::per_atom_energy, Boolean{},
          "energy_force: score the energy error divided by the structure's atoms"),
      key("loss.kind", &C::loss, &LossSection::kind, Choice<ErrorKind>{kErrorKindNames},
          "energy_force: how each error is scored (huber: quadratic below huber_delta, linear "
          "above)"),
      key("loss.huber_delta", &C::loss, &LossSection::huber_delta, positive,
          "energy_force, kind huber: where the quadratic part ends"),
      key("loss.switch_step", &C::loss, &LossSection::switch_step, Integer{0},
          "energy_force: from this optimizer step on, the *_weight_after weights (0: never)"),
      key("loss.energy_weight_after", &C::loss, &LossSection::energy_weight_after, after_switch,
          "energy_force: energy_weight from switch_step on (-1: unchanged)"),
      key("loss.force_weight_after", &C::loss, &LossSection::force_weight_after, after_switch,
          "energy_force: force_weight from switch_step on (-1: unchanged)"),
      key("loss.stress_weight_after", &C::loss, &LossSection::stress_weight_after, after_switch,
          "energy_force: stress_weight from switch_step on (-1: unchanged)"),
      key("optim.name", &C::optim, &OptimSection::name, Choice<OptimizerKind>{kOptimizerKindNames},
          "the optimizer"),
      key("optim.lr", &C::optim, &OptimSection::lr, positive, "learning rate"),
      key("optim.momentum", &C::optim, &OptimSection::momentum, fraction, "SGD momentum in [0, 1)"),
      key("optim.weight_decay", &C::optim, &OptimSection::weight_decay, non_negative,
          "weight decay"),
      key("sched.name", &C::sched, &SchedSection::name, Choice<SchedulerKind>{kSchedulerKindNames},
          "the learning-rate schedule (cosine: linear warmup, then cosine decay)"),
      key("sched.warmup_steps", &C::sched, &SchedSection::warmup_steps, Integer{0},
          "linear warmup steps (cosine)"),
      key("sched.total_steps", &C::sched, &SchedSection::total_steps, Integer{0},
          "the length in steps of cosine, linear and polynomial (0: the run's optimizer steps)"),
      key("sched.step_size", &C::sched, &SchedSection::step_size, Integer{1},
          "step: multiply the lr by gamma every step_size steps"),
      key("sched.gamma", &C::sched, &SchedSection::gamma, Number{.low = 0, .low_open = true},
          "the lr factor of step and multistep"),
      key("sched.milestones", &C::sched, &SchedSection::milestones, IntegerList{1, true},
          "multistep: steps at which the lr is multiplied by gamma"),
      key("sched.start_factor", &C::sched, &SchedSection::start_factor, non_negative,
          "linear: the lr factor at step 0"),
      key("sched.end_factor", &C::sched, &SchedSection::end_factor, non_negative,
          "linear: the lr factor from total_steps on"),
      key("sched.power", &C::sched, &SchedSection::power, positive,
          "polynomial: lr * (1 - step / total_steps)^power"),
      key("train.epochs", &C::train, &TrainSection::epochs, Integer{1}, "epochs"),
      key("train.max_steps", &C::train, &TrainSection::max_steps, Integer{0},
          "stop after this many optimizer steps (0: no limit)"),
      key("train.batch_size", &C::train, &TrainSection::batch_size, Integer{1},
          "batch size per rank"),
      key("train.seed", &C::train, &TrainSection::seed, Unsigned{},
          "seed of initialization, shuffling and dropout"),
      key("train.shuffle", &C::train, &TrainSection::shuffle, Boolean{},
          "shuffle the training data every epoch"),
      key("train.log_every", &C::train, &TrainSection::log_every, Integer{1},
          "log every N optimizer steps"),
      key("train.out_dir", &C::train, &TrainSection::out_dir, Text{},
          "where rank 0 writes metrics, checkpoints and the config"),
      key("train.resume", &C::train, &TrainSection::resume, Text{},
          "checkpoint to resume from; auto: the newest ckpt-epoch*.h5 in out_dir (mid-epoch "
          "ones too), or a fresh start if there is none"),
      key("train.keep_checkpoints", &C::train, &TrainSection::keep_checkpoints, Integer{0},
          "keep only the newest N checkpoints (ckpt-epoch*.h5) in out_dir (0: keep all)"),
      key("train.checkpoint_scope", &C::train, &TrainSection::checkpoint_scope,
          Choice<CheckpointScope>{kCheckpointScopeNames},
          "where the ranks read the checkpoint a resume starts from: shared (every rank reads "
          "out_dir) or node_local (out_dir is rank 0's own; rank 0 sends the file to the other "
          "nodes)"),
      key("train.stop_signals", &C::train, &TrainSection::stop_signals, StopSignals{},
          "signals that stop training on every rank at the same step's end, with a "
          "mid-epoch checkpoint, and exit with status 75"),
      key("train.time_limit", &C::train, &TrainSection::time_limit_s, Duration{},
          "stop the same way once this much wall time has passed (leave room for a step and a "
          "checkpoint write)"),
      key("train.save_initial", &C::train, &TrainSection::save_initial, Boolean{},
          "write ckpt-step0.h5 before the first step"),
      key("train.grad_accum_steps", &C::train, &TrainSection::grad_accum_steps, Integer{1},
          "micro-steps per optimizer step"),
      key("train.clip_grad_norm", &C::train, &TrainSection::clip_grad_norm, non_negative,
          "clip the global gradient norm (0: off)"),
      key("train.cuda_graphs", &C::train, &TrainSection::cuda_graphs, Boolean{},
          "C API on CUDA: capture forward and backward in a CUDA graph after the warm-up and "
          "replay it while the arrays keep their addresses"),
      key("train.cuda_graph_warmup", &C::train, &TrainSection::cuda_graph_warmup, Integer{1},
          "C API with cuda_graphs: ordinary steps before the capture"),
      key("train.ema_decay", &C::train, &TrainSection::ema_decay, fraction,
          "keep an EMA of the weights with this decay and evaluate with it (0: off)"),
      key("train.stage", &C::train, &TrainSection::stage, Choice<StageKind>{kStageKindNames},
          "supervised: a classifier; supcon: encoder + projection on two views; classifier: a "
          "head on init_from's encoder"),
      key("train.init_from", &C::train, &TrainSection::init_from, Text{},
          "stage classifier: checkpoint whose encoder.* tensors initialize the encoder"),
      key("train.freeze_encoder", &C::train, &TrainSection::freeze_encoder, Boolean{},
          "stage classifier: keep the encoder fixed (no grad, BatchNorm in eval mode)"),
      key("train.swa_start", &C::train, &TrainSection::swa_start, Integer{0},
          "average the weights of this epoch (1-based) and every later one; at the end, "
          "recompute BatchNorm, evaluate and write swa.h5 (0: off)"),
      key("train.swa_lr", &C::train, &TrainSection::swa_lr, non_negative,
          "constant lr from swa_start on, without annealing (0: the schedule's lr is kept)"),
      key("train.tensorboard", &C::train, &TrainSection::tensorboard, Boolean{},
          "rank 0 writes TensorBoard event files (every logged scalar) to out_dir/tb"),
      key("train.trace", &C::train, &TrainSection::trace, Text{},
          "write a Chrome trace-event timeline of every rank to this file (--trace FILE)"),
      key("train.profile", &C::train, &TrainSection::profile, Boolean{},
          "time every op, kernel, autograd node, ONNX node and optimizer step, and print rank "
          "0's table of them at the end (--profile); with trace, they join the timeline"),
      key("train.profile_rows", &C::train, &TrainSection::profile_rows, Integer{1},
          "profile: the rows of the table, those with the most self time"),
      key("train.profile_json", &C::train, &TrainSection::profile_json, Text{},
          "profile: also write every row of rank 0's table to this JSON file (--profile-json "
          "FILE; turns profile on)"),
      key("train.precision", &C::train, &TrainSection::precision,
          Choice<nn::Precision>{nn::kPrecisionNames},
          "fp32, or bf16 / fp16: matmul, linear and conv2d in 16 bits with fp32 sums; the rest, "
          "the weights and the optimizer stay fp32"),
      key("train.loss_scale_growth_interval", &C::train, &TrainSection::loss_scale_growth_interval,
          Integer{1},
          "fp16: the loss scale (from 2^16, halved on an overflow, whose step is skipped) doubles "
          "after this many clean steps"),
      key("distributed.backend", &C::distributed, &DistributedSection::backend,
          Choice<Backend>{kBackendNames}, "the communication library (auto: NCCL on GPUs)"),
      key("distributed.bucket_cap_mb", &C::distributed, &DistributedSection::bucket_cap_mb,
          positive, "gradient bucket size in MiB"),
      key("distributed.sync_bn", &C::distributed, &DistributedSection::sync_bn, Boolean{},
          "synchronize BatchNorm statistics across ranks"),
      key("distributed.find_unused_parameters", &C::distributed,
          &DistributedSection::find_unused_parameters, Boolean{},
          "reduce missing gradients as zeros"),
      key("distributed.compression", &C::distributed, &DistributedSection::compression,
          Choice<GradCompression>{kGradCompressionNames},
          "gradient compression (reduce_dtype = bf16 is the same as bf16 here)"),
      key("distributed.reduce_dtype", &C::distributed, &DistributedSection::reduce_dtype,
          Choice<ReduceDType>{kReduceDTypeNames},
          "the dtype gradients are averaged in, independent of [train] precision (bf16: "
          "buckets cast to bf16 for the reduction, as compression = bf16)"),
      key("distributed.shared_memory", &C::distributed, &DistributedSection::shared_memory,
          Boolean{}, "average host gradients in shared memory when all ranks share a node"),
      key("distributed.transport", &C::distributed, &DistributedSection::transport,
          Choice<TransportKind>{kTransportKindNames},
          "how gradient buckets are averaged (auto: shared memory on one node, hierarchical "
          "across nodes, else the communicator; a named one that cannot be had is an error)"),
      key("distributed.zero", &C::distributed, &DistributedSection::zero, Integer{0, 1},
          "ZeRO stage: 1 shards the optimizer state over the ranks (gradients reduce-scattered, "
          "parameters all-gathered); 0: every rank holds all of it"),
      key("distributed.timeout_s", &C::distributed, &DistributedSection::timeout_s, positive,
          "collective timeout in seconds"),
  };
}

po::options_description key_options(std::span<const std::string> allowed) {
  po::options_description options(
      "Configuration keys ([section] key = value in the file, or --section.key=value)");
  for (const ConfigKey& key : config_keys()) {
    if (!allowed.empty() &&
        std::find(allowed.begin(), allowed.end(), key.section()) == allowed.end() &&
        std::find(allowed.begin(), allowed.end(), key.name) == allowed.end()) {
      continue;
    }
    options.add_options()(key.name.c_str(), po::value<std::string>(), key.help.c_str());
  }
  return options;
}

// "a.ini: [train] epochs" or "command line: --train.epochs"
std::string where_of(const ConfigKey& key, bool on_command_line, const std::string& origin) {
  if (on_command_line) return "command line: --" + key.name;
  return origin + ": [" + key.section() + "] " + key.key();
}

// Applies every key present in `values` to `config`.
void apply(const po::variables_map& values, const std::vector<std::string>& from_command_line,
           const std::string& origin, TrainConfig& config) {
  for (const ConfigKey& key : config_keys()) {
    if (values.count(key.name) == 0) continue;
    bool on_command_line = std::find(from_command_line.begin(), from_command_line.end(),
                                     key.name) != from_command_line.end();
    key.parse(config, values[key.name].as<std::string>(), where_of(key, on_command_line, origin));
  }
  // Checks that span two keys.
  const DataSection& data = config.data;
  MPIGRAD_CHECK(data.mean.empty() == data.std.empty(), "[data] mean and std: give both or neither",
                " (mean has ", data.mean.size(), " value(s), std ", data.std.size(), ")");
  MPIGRAD_CHECK(config.train.swa_start <= config.train.epochs, "[train] swa_start: epoch ",
                config.train.swa_start,
                " is after the last of [train] epochs = ", config.train.epochs);
  MPIGRAD_CHECK(config.distributed.reduce_dtype == ReduceDType::Float32 ||
                    config.distributed.compression != GradCompression::Float16,
                "[distributed] reduce_dtype = bf16 and compression = fp16 ask for two different "
                "reduction dtypes; set one of them");
  const LossSection& loss = config.loss;
  MPIGRAD_CHECK(loss.name != LossKind::EnergyForce ||
                    loss.energy_weight + loss.force_weight + loss.stress_weight > 0,
                "[loss] energy_weight, force_weight and stress_weight are all 0; energy_force "
                "needs at least one term to train on");
  MPIGRAD_CHECK(config.train.swa_start == 0 || config.train.stage != StageKind::SupCon,
                "[train] swa_start: SWA evaluates a classifier; stage = supcon has no classes to "
                "score (use it with stage = supervised or classifier)");
}

// `stores`: atomic stores, which may be folders (Zarr) as well as files (HDF5).
void require_files(const std::vector<std::string>& paths, const char* key, bool required,
                   bool stores) {
  MPIGRAD_CHECK(!required || !paths.empty(), key,
                ": required (an HDF5 file or a comma-separated "
                "list of shards)");
  for (const std::string& path : paths) {
    // An atomic store may be a folder (Zarr, with its zarr.json) as well as an HDF5 file.
    const bool found = std::filesystem::is_regular_file(path) ||
                       (stores && std::filesystem::exists(path)) ||
                       std::filesystem::is_regular_file(std::filesystem::path(path) / "zarr.json");
    MPIGRAD_CHECK(found, key, stores ? ": store '" : ": file '", path, "' does not exist");
  }
}

// Boost.Program_options builds its error messages by replacing "%canonical_option%" and its
// other placeholders with the offending name, over and over until none is left: a name that
// holds a placeholder never ends (a hang in Boost's what()). No key holds '%', so a '%' in a
// key or section name (the text before '=' of a line, comments removed) is our error, first.
void refuse_percent_in_keys(const std::string& text, const std::string& origin) {
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    std::string name = line.substr(0, std::min(line.find('#'), line.find('=')));
    MPIGRAD_CHECK(name.find('%') == std::string::npos, origin, ": line ", number, ": '", trim(name),
                  "' holds '%', which no key or section name has");
  }
}

void refuse_percent_in_flags(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg.rfind("-", 0) != 0) continue;  // a value, not a flag
    MPIGRAD_CHECK(arg.substr(0, arg.find('=')).find('%') == std::string::npos, "command line: '",
                  arg, "' holds '%', which no key has");
  }
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = make_config_keys();
  return keys;
}

TrainConfig parse_train_config(const std::vector<std::string>& args) {
  po::options_description general("mpigrad train");
  general.add_options()("config", po::value<std::string>(), "INI configuration file")(
      "dry-run", "check the config, the data and the model, run one step, and exit")(
      "trace", po::value<std::string>(), "the same as --train.trace")(
      "profile", "the same as --train.profile=true")("profile-json", po::value<std::string>(),
                                                     "the same as --train.profile_json")(
      "help,h", "show this help");
  po::options_description all;
  all.add(general).add(key_options({}));

  TrainConfig config;
  po::variables_map values;
  std::vector<std::string> from_command_line;
  refuse_percent_in_flags(args);
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
      MPIGRAD_CHECK(file.good(), "mpigrad train: cannot open config file '", config.config_file,
                    "'");
      std::stringstream text;
      text << file.rdbuf();
      refuse_percent_in_keys(text.str(), "config file '" + config.config_file + "'");
      try {
        po::store(po::parse_config_file(text, key_options({}), /*allow_unregistered=*/false),
                  values);
      } catch (const po::error& error) {
        core::fail("config file '", config.config_file, "': ", error.what());
      }
    }
  } catch (const po::error& error) {
    core::fail("mpigrad train: ", error.what());
  }
  config.dry_run = values.count("dry-run") > 0;
  apply(values, from_command_line, config.config_file, config);
  // --trace FILE is --train.trace=FILE, which the table cannot alias; it overrides the file too.
  if (values.count("trace")) {
    MPIGRAD_CHECK(std::find(from_command_line.begin(), from_command_line.end(), "train.trace") ==
                      from_command_line.end(),
                  "mpigrad train: give --trace or --train.trace, not both");
    config.train.trace = trim(values["trace"].as<std::string>());
    MPIGRAD_CHECK(!config.train.trace.empty(), "command line: --trace: expected a file name");
  }
  if (values.count("profile")) config.train.profile = true;
  if (values.count("profile-json")) {
    MPIGRAD_CHECK(std::find(from_command_line.begin(), from_command_line.end(),
                            "train.profile_json") == from_command_line.end(),
                  "mpigrad train: give --profile-json or --train.profile_json, not both");
    config.train.profile_json = trim(values["profile-json"].as<std::string>());
    MPIGRAD_CHECK(!config.train.profile_json.empty(),
                  "command line: --profile-json: expected a file name");
  }
  // A profile file asks for the profile.
  if (!config.train.profile_json.empty()) config.train.profile = true;
  const bool stores = config.loss.name == LossKind::EnergyForce;
  require_files(config.data.train, "[data] train", true, stores);
  require_files(config.data.test, "[data] test", false, stores);
  const TrainSection& train = config.train;
  if (train.stage == StageKind::Classifier) {
    MPIGRAD_CHECK(!train.init_from.empty(),
                  "[train] init_from: stage = classifier needs the "
                  "checkpoint of a stage = supcon run (its encoder.* tensors)");
    MPIGRAD_CHECK(std::filesystem::is_regular_file(train.init_from),
                  "[train] init_from: "
                  "checkpoint '",
                  train.init_from, "' does not exist");
  } else {
    MPIGRAD_CHECK(train.init_from.empty(),
                  "[train] init_from: only stage = classifier loads an "
                  "encoder; this run has stage = ",
                  core::enum_name(train.stage, kStageKindNames));
  }
  // Under node_local only rank 0 needs the file; its resume reports a missing one for every rank.
  if (!config.train.resume.empty() && config.train.resume != "auto" &&
      config.train.checkpoint_scope == CheckpointScope::Shared) {
    MPIGRAD_CHECK(std::filesystem::is_regular_file(config.train.resume),
                  "[train] resume: checkpoint '", config.train.resume, "' does not exist");
  }
  return config;
}

TrainConfig parse_config_text(const std::string& text, const std::string& origin,
                              std::span<const std::string> allowed) {
  TrainConfig config;
  po::variables_map values;
  refuse_percent_in_keys(text, origin);
  std::istringstream in(text);
  try {
    po::store(po::parse_config_file(in, key_options(allowed), /*allow_unregistered=*/false),
              values);
  } catch (const po::error& error) {
    core::fail(origin, ": ", error.what());
  }
  apply(values, {}, origin, config);
  return config;
}

std::string TrainConfig::resolved_text() const {
  std::ostringstream out;
  std::string section;
  for (const ConfigKey& key : config_keys()) {
    if (key.section() != section) {
      out << (section.empty() ? "" : "\n") << "[" << key.section() << "]\n";
      section = key.section();
    }
    out << key.key() << " = " << key.print(*this) << "\n";
  }
  return out.str();
}

std::string train_config_help() {
  std::ostringstream out;
  out << "usage: mpigrad train --config FILE.ini [--dry-run] [--trace FILE] [--profile] "
         "[--profile-json FILE] [--section.key=value ...]\n\n"
      << "Trains a model on HDF5 data under mpirun (or as one process). A --section.key flag\n"
      << "overrides the same key of the file.\n\n"
      << "Inputs ([data] x): uint8 inputs are images and are scaled to [0, 1]; every other dtype\n"
      << "(float32, float64, float16, bfloat16, integers) is used as it is, converted to float32.\n"
      << "Then, with [data] mean and std, x becomes (x - mean[c]) / std[c], c being the channel\n"
      << "(the first per-sample dimension); one value applies to every channel.\n"
      << "Labels ([data] y): one integer per sample, of any integer dtype, in [0, num_classes).\n"
      << "Float labels and labels outside that range are errors naming the field.\n"
      << "[model] name = onnx trains a graph exported from PyTorch ([model] file): its inputs\n"
      << "are fed in the dtype it declares (int64 token ids stay integers), cross_entropy also\n"
      << "takes dense logits [N, C, d1, ...] with labels [N, d1, ...], and [loss] name = mse or\n"
      << "l1 takes float targets of the output's shape.\n"
      << "[loss] name = energy_force trains an interatomic potential ([model] name = schnet, or\n"
      << "onnx with inputs named positions, atomic_numbers, edge_index, ...) on stores of atomic\n"
      << "structures, on energies, forces and stress; [graph] builds each batch's neighbor list\n"
      << "(docs/interatomic-potentials.md).\n\n"
      << "Exit status: 0 when training finished; 75 when it was stopped by one of [train]\n"
      << "stop_signals (default TERM, INT, USR1) or by [train] time_limit, every rank at the same\n"
      << "step, after rank 0 wrote out_dir/ckpt-epochN-stepS.h5: run the same command with\n"
      << "[train] resume = auto to continue from that step (a batch script requeues on 75);\n"
      << "1 on an error.\n\n";
  for (const ConfigKey& key : config_keys()) {
    out << "  --" << key.name << "=VALUE";
    int pad = 38 - int(key.name.size());
    // The accepted values come from the key's codec, so they cannot drift from the parser.
    out << std::string(size_t(pad > 1 ? pad : 1), ' ') << key.help << " [" << key.accepted << "]";
    std::string default_text = key.default_text();
    if (!default_text.empty()) out << " (default " << default_text << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace mpigrad::launch
