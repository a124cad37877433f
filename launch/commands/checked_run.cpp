#include "mpigrad/launch/commands/checked_run.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/training_data.h"
#include "mpigrad/nn/encoder_with_head.h"
#include "mpigrad/nn/onnx/onnx_model.h"

namespace mpigrad::launch {

namespace {

// Labels are checked before training, so a bad one fails on every rank at once instead of in
// one rank's loss while the others wait. Each rank reads only its own share of the index space
// (together the ranks cover every sample), one bounded piece at a time.
void check_labels(const data::Hdf5Dataset& dataset, const TrainConfig& config, const char* key,
                  int64_t rank, int64_t ranks) {
  const std::string& y = config.data.y;
  const int64_t size = dataset.total_size();
  const int64_t begin = size * rank / ranks, end = size * (rank + 1) / ranks;
  constexpr int64_t kPiece = int64_t(1) << 20;  // labels per read: 8 MiB as int64
  // Dense labels (an ONNX model's [N, d1, ...] targets) hold several per sample.
  const int64_t per_sample = std::max<int64_t>(1, dataset.field(y).sample_shape.numel());
  const int64_t piece = std::max<int64_t>(1, kPiece / per_sample);
  for (int64_t first = begin; first < end; first += piece) {
    const int64_t count = std::min(piece, end - first);
    core::Tensor labels = dataset.read_field(y, first, count).to(core::kInt64).contiguous();
    const int64_t* values = labels.data<int64_t>();
    for (int64_t i = 0; i < labels.numel(); ++i) {
      MPIGRAD_CHECK(values[i] >= 0 && values[i] < config.data.num_classes, key, ": ",
                    dataset.describe(), " field '", y, "' holds label ", values[i], " at sample ",
                    first + i / per_sample, ", outside [0, ", config.data.num_classes,
                    ") of [data] num_classes");
    }
  }
}

std::shared_ptr<data::Hdf5Dataset> open_dataset(const std::vector<std::string>& paths,
                                                const TrainConfig& config, const char* key,
                                                int64_t rank, int64_t ranks) {
  auto dataset = std::make_shared<data::Hdf5Dataset>(
      paths, data::Hdf5DatasetOptions{.fields = {config.data.x, config.data.y}});
  MPIGRAD_CHECK(dataset->size() > 0, key, ": ", dataset->describe(),
                " has no samples (N = 0 "
                "in field '",
                config.data.x, "'); nothing to ",
                std::string(key) == "[data] test" ? "evaluate on" : "train on");
  // The distributed samplers need one sample per rank; say so now, not in the training phase.
  MPIGRAD_CHECK(dataset->size() >= ranks, key, ": ", dataset->describe(), " has ", dataset->size(),
                " sample(s), fewer than the ", ranks, " ranks; every rank needs at least one");
  const data::FieldInfo& labels = dataset->field(config.data.y);
  const data::FieldInfo& inputs = dataset->field(config.data.x);
  MPIGRAD_CHECK(inputs.dtype != core::kBool, key, ": input field '", config.data.x, "' of ",
                dataset->describe(), " is bool; inputs must be numbers");
  if (config.loss.name != LossKind::CrossEntropy) {
    // Regression targets: the model's output's shape, checked against the model (check_run).
    MPIGRAD_CHECK(labels.dtype != core::kBool, key, ": target field '", config.data.y, "' of ",
                  dataset->describe(), " is bool; regression targets must be numbers");
    return dataset;
  }
  MPIGRAD_CHECK(!core::is_floating(labels.dtype), key, ": label field '", config.data.y, "' of ",
                dataset->describe(), " is ", labels.dtype,
                "; class labels must be integers "
                "(any integer dtype)",
                config.model.name == ModelKind::Onnx ? "; with [loss] name = mse or l1 it is a "
                                                       "regression target"
                                                     : "");
  // Dense predictions ([N, C, d1, ...] logits) take [N, d1, ...] labels: ONNX models only.
  MPIGRAD_CHECK(labels.sample_shape.numel() == 1 || config.model.name == ModelKind::Onnx, key,
                ": label field '", config.data.y, "' of ", dataset->describe(),
                " has per-sample shape ", labels.sample_shape, "; expected one label per sample");
  check_labels(*dataset, config, key, rank, ranks);
  return dataset;
}

// Channels are the first per-sample dimension ([C, H, W] images, [F] features).
int64_t input_channels(const core::Shape& sample_shape) {
  return sample_shape.size() >= 1 ? sample_shape[0] : 1;
}

void check_normalization(const TrainConfig& config, const data::FieldInfo& inputs) {
  const int64_t channels = input_channels(inputs.sample_shape);
  for (const auto* values : {&config.data.mean, &config.data.std}) {
    const size_t n = values->size();
    MPIGRAD_CHECK(n <= 1 || int64_t(n) == channels, "[data] ",
                  values == &config.data.mean ? "mean" : "std", ": ", n, " values, but field '",
                  config.data.x, "' has per-sample shape ", inputs.sample_shape, ", so ", channels,
                  " channel(s); give one value, or one per channel");
  }
}

// A batch is allocated at every step, and with the read-ahead a few are alive at once: one that
// cannot fit in memory is refused now, naming the file, the field and the bytes.
void check_batch_memory(const data::Dataset& dataset, const TrainConfig& config, const char* key,
                        int64_t batch) {
  int64_t bytes = 0;
  for (const data::FieldInfo& field : dataset.fields()) {
    const std::string what = std::string(key) + ": " + dataset.describe() + " field '" +
                             field.name + "' of per-sample shape " + field.sample_shape.str();
    bytes = core::checked_add(
        bytes,
        core::checked_mul(batch, field.sample_bytes(), what, ": a batch of ", batch, " samples"),
        what, ": a batch");
    check_fits_in_memory(bytes, what + ": a batch of " + std::to_string(batch) +
                                    " samples ([train] batch_size " +
                                    std::to_string(config.train.batch_size) + ")");
  }
}

// The file is written at the end of training: a path that cannot be written fails now instead.
// Its folder is created as out_dir is.
void check_writable(const std::string& path, const char* key) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) fs::create_directories(parent, error);
  MPIGRAD_CHECK(!error, key, ": cannot create the folder '", parent.string(), "' of '", path,
                "': ", error.message());
  MPIGRAD_CHECK(!fs::is_directory(path), key, ": '", path, "' is a folder; give a file name");
  const std::string probe = path + ".tmp";
  {
    std::ofstream out(probe);
    MPIGRAD_CHECK(out.good(), key, ": cannot write '", probe, "'");
  }
  fs::remove(probe, error);
}

// The graph's first output against [data] y, as far as the file fixes its shape: for
// cross_entropy, logits [batch, num_classes, d1, ...] against labels [d1, ...] per sample; for mse
// and l1, the target's per-sample shape. Dimensions exported as dynamic are checked at the step.
void check_onnx_outputs(const CheckedRun& run) {
  const TrainConfig& config = run.config;
  const auto& onnx = dynamic_cast<const nn::OnnxModel&>(*run.model);
  const std::vector<nn::OnnxValueInfo>& outputs = onnx.graph_outputs();
  MPIGRAD_CHECK(!outputs.empty(), "[model] file: '", config.model.file,
                "' declares no graph output");
  MPIGRAD_CHECK(onnx.graph_inputs().size() == 1, "[model] file: '", config.model.file, "' has ",
                onnx.graph_inputs().size(),
                " graph inputs; mpigrad train feeds one, [data] x (the C API's "
                "mpigrad_train_multi takes several)");
  const nn::OnnxValueInfo& output = outputs.front();
  const std::vector<int64_t> dims(output.shape.begin(), output.shape.end());
  const core::Shape& label_shape = run.train_set->field(config.data.y).sample_shape;
  std::vector<int64_t> expected{-1};
  if (config.loss.name == LossKind::CrossEntropy) {
    expected.push_back(config.data.num_classes);
    // One label per sample may be stored as [N] or [N, 1]; logits are then [N, C].
    if (label_shape.numel() != 1 || label_shape.size() > 1 || dims.size() > 2) {
      for (int64_t d = 0; d < label_shape.size(); ++d) expected.push_back(label_shape[d]);
    }
  } else {
    for (int64_t d = 0; d < label_shape.size(); ++d) expected.push_back(label_shape[d]);
  }
  bool fits = dims.empty() || dims.size() == expected.size();  // no shape declared: the step checks
  for (size_t d = 1; fits && d < dims.size(); ++d) {
    fits = dims[d] < 0 || dims[d] == expected[d];
  }
  MPIGRAD_CHECK(fits, "[model] file: '", config.model.file, "' output '", output.name,
                "' has shape ", nn::onnx_shape_text(dims),
                " (? free), but [loss] name = ", core::enum_name(config.loss.name, kLossKindNames),
                " with field '", config.data.y, "' of per-sample shape ", label_shape,
                config.loss.name == LossKind::CrossEntropy ? " and [data] num_classes" : "",
                " needs ", nn::onnx_shape_text(expected));
}

// The fields an energy_force run reads, checked on the set's first structure, so a store that
// lacks one fails before training (on every rank alike).
void check_atomic_fields(const data::Dataset& dataset, const TrainConfig& config, const char* key) {
  const std::vector<int64_t> first = {0};
  const data::Batch batch = dataset.get_batch(first);
  const EnergyForceLossOptions loss = energy_force_options(config.loss);
  std::vector<std::pair<std::string, std::string>> needed = {
      {"positions", "the model's input"},
      {"atomic_numbers", "the model's input"},
      {"energy", "the energy term and the metrics"}};
  if (loss.uses_forces()) needed.push_back({"forces", "[loss] force_weight"});
  if (loss.uses_stress()) {
    needed.push_back({"stress", "[loss] stress_weight"});
    needed.push_back({"cell", "the volume, for [loss] stress_weight"});
  }
  if (config.graph.cutoff <= 0) {
    needed.push_back({"edge_index",
                      "[graph] cutoff = 0 takes the store's neighbor_list; set a cutoff to "
                      "build one"});
  }
  for (const auto& [name, why] : needed) {
    MPIGRAD_CHECK(batch.has(name), key, ": ", dataset.describe(), " has no field '", name, "' (",
                  why, ")");
  }
}

// [loss] name = energy_force: atomic stores, an interatomic potential, the neighbor list.
void check_atomistic_run(CheckedRun& run, int64_t rank, int64_t ranks) {
  const TrainConfig& config = run.config;
  MPIGRAD_CHECK(config.train.stage == StageKind::Supervised,
                "[train] stage: [loss] name = energy_force trains one model (stage = "
                "supervised), not ",
                core::enum_name(config.train.stage, kStageKindNames));
  MPIGRAD_CHECK(config.train.swa_start == 0,
                "[train] swa_start: SWA's end recomputes BatchNorm and scores a classifier; "
                "[loss] name = energy_force takes ema_decay for averaged weights");
  MPIGRAD_CHECK(config.data.augment.empty() && config.data.mean.empty(),
                "[data] augment, mean and std are for images and features; atomic structures "
                "take none");
  // The model first: its keys are checked before any store is read.
  auto model = make_atomistic_model(config);
  run.model = model;
  const auto open = [&](const std::vector<std::string>& paths, const char* key) {
    std::shared_ptr<data::Dataset> dataset;
    try {
      dataset = data::open_training_data(paths);
    } catch (const core::Error& error) {
      core::fail(key, ": ", error.what());
    }
    MPIGRAD_CHECK(dataset->size() >= std::max<int64_t>(ranks, 1), key, ": ", dataset->describe(),
                  " has ", dataset->size(), " structure(s), fewer than the ", ranks,
                  " ranks; every rank needs at least one");
    check_atomic_fields(*dataset, config, key);
    return dataset;
  };
  run.train_set = open(config.data.train, "[data] train");
  if (!config.data.test.empty()) run.test_set = open(config.data.test, "[data] test");
  // The batches of an epoch as the run's sampler will cut them (an atom budget or a mix of
  // stores changes their count; a shuffled atom budget, from epoch to epoch: the first's is
  // taken for the schedule's length).
  const int64_t batches =
      data::make_batch_sampler(*run.train_set, batching_options(config, rank, ranks))->size();
  run.steps_per_epoch = core::ceil_div(batches, config.train.grad_accum_steps);
  run.total_steps = core::checked_mul(config.train.epochs, run.steps_per_epoch,
                                      "[train] epochs: the run's length in optimizer updates");
  if (config.train.max_steps > 0) {
    run.total_steps = std::min(run.total_steps, config.train.max_steps);
  }
  check_schedule(config.sched, run.total_steps);
  if (rank == 0 && !config.train.trace.empty() && !config.dry_run) {
    check_writable(config.train.trace, "[train] trace");
  }
  run.inputs = graph_transform(config.graph);
  // The model on the first structure: a graph it cannot run (an input it lacks, an op such as
  // the legacy exporter's index_add) fails here, on every rank, rather than in a rank's step.
  const std::vector<int64_t> first = {0};
  data::Batch batch = run.train_set->get_batch(first);
  if (run.inputs.transform) batch = run.inputs.transform(std::move(batch));
  core::NoGradGuard no_grad;
  model->energy(atomic_graph(batch));
}

}  // namespace

RunInputs CheckedRun::run_inputs() const {
  RunInputs run;
  run.model = model;
  run.train_set = train_set;
  run.test_set = test_set;
  run.inputs = inputs;
  run.sample_shape = sample_shape;
  run.outputs = outputs;
  run.total_steps = total_steps;
  return run;
}

CheckedRun check_run(const std::vector<std::string>& args, int64_t rank, int64_t ranks) {
  CheckedRun run;
  run.config = parse_train_config(args);
  if (run.config.help) return run;
  const TrainConfig& config = run.config;
  MPIGRAD_CHECK(!config.train.cuda_graphs,
                "[train] cuda_graphs: only embedded models (the C API) replay CUDA graphs; "
                "mpigrad train does not");
  if (is_atomistic(config)) {
    check_atomistic_run(run, rank, ranks);
    return run;
  }
  MPIGRAD_CHECK(config.model.name != ModelKind::SchNet,
                "[model] name = schnet is an interatomic potential; train it with [loss] name = "
                "energy_force on atomic structures");
  run.train_set = open_dataset(config.data.train, config, "[data] train", rank, ranks);
  if (!config.data.test.empty()) {
    run.test_set = open_dataset(config.data.test, config, "[data] test", rank, ranks);
  }
  const data::FieldInfo& inputs = run.train_set->field(config.data.x);
  run.sample_shape = inputs.sample_shape;
  check_normalization(config, inputs);
  // A classifier: the model's outputs are the classes. An ONNX model may be a regression too.
  MPIGRAD_CHECK(config.loss.name == LossKind::CrossEntropy || config.model.name == ModelKind::Onnx,
                "[loss] name: mpigrad train trains the built-in models as classifiers "
                "(cross_entropy); mse and l1 are for [model] name = onnx, and for regression "
                "through the C API (mpigrad/mpigrad_c.h); energy_force for interatomic "
                "potentials");
  MPIGRAD_CHECK(
      config.loss.name == LossKind::CrossEntropy || config.train.stage == StageKind::Supervised,
      "[loss] name: stage = ", core::enum_name(config.train.stage, kStageKindNames),
      " trains classifiers; mse and l1 need stage = supervised");
  MPIGRAD_CHECK(config.loss.name == LossKind::CrossEntropy || config.train.swa_start == 0,
                "[train] swa_start: SWA evaluates a classifier; [loss] name = ",
                core::enum_name(config.loss.name, kLossKindNames), " is a regression");
  MPIGRAD_CHECK(config.model.outputs == 0 || config.model.outputs == config.data.num_classes,
                "[model] outputs: ", config.model.outputs, " differs from [data] num_classes ",
                config.data.num_classes, "; leave it 0 for a classifier");
  run.outputs = config.data.num_classes;
  MPIGRAD_CHECK(
      config.model.input_shape.empty() || core::Shape(config.model.input_shape) == run.sample_shape,
      "[model] input_shape: ", core::Shape(config.model.input_shape), " but field '", config.data.x,
      "' has per-sample shape ", run.sample_shape);
  if (run.test_set) {
    const data::FieldInfo& test_x = run.test_set->field(config.data.x);
    MPIGRAD_CHECK(test_x.sample_shape == run.sample_shape, "[data] test: field '", config.data.x,
                  "' has per-sample shape ", test_x.sample_shape, " but the training data has ",
                  run.sample_shape);
  }
  // The distributed sampler pads every rank to ceil(N / R) samples. The config's sizes may be
  // anything up to int64's maximum: rounding up and multiplying are checked.
  const int64_t per_rank = core::ceil_div(run.train_set->size(), ranks);
  const int64_t batches = core::ceil_div(per_rank, config.train.batch_size);
  run.steps_per_epoch = core::ceil_div(batches, config.train.grad_accum_steps);
  run.total_steps = core::checked_mul(config.train.epochs, run.steps_per_epoch,
                                      "[train] epochs: the run's length in optimizer updates "
                                      "(epochs x ",
                                      run.steps_per_epoch, " per epoch)");
  check_batch_memory(*run.train_set, config, "[data] train",
                     std::min(config.train.batch_size, per_rank));
  if (run.test_set) {
    check_batch_memory(*run.test_set, config, "[data] test",
                       std::min(kTestBatchSize, core::ceil_div(run.test_set->size(), ranks)));
  }
  // (A dry run takes one step of this schedule: the schedule is the run's, checked as such.)
  if (config.train.max_steps > 0) {
    run.total_steps = std::min(run.total_steps, config.train.max_steps);
  }
  check_schedule(config.sched, run.total_steps);
  MPIGRAD_CHECK(!config.data.augment.geometric() || run.sample_shape.size() == 3,
                "[data] augment: crop and flip need images of shape [channels, height, width], "
                "but field '",
                config.data.x, "' has per-sample shape ", run.sample_shape);
  run.model = make_stage_model(config.model, config.train, run.sample_shape, run.outputs);
  if (config.train.stage == StageKind::Classifier) {
    // Read here, in the checking phase, so a missing or mismatched tensor fails on every rank.
    load_encoder(dynamic_cast<nn::EncoderWithHead&>(*run.model), config.train.init_from,
                 "[train] init_from");
  }
  if (rank == 0 && !config.train.trace.empty() && !config.dry_run) {
    check_writable(config.train.trace, "[train] trace");
  }
  if (rank == 0 && !config.train.profile_json.empty() && !config.dry_run) {
    check_writable(config.train.profile_json, "[train] profile_json");
  }
  if (config.model.name == ModelKind::Onnx) check_onnx_outputs(run);
  run.inputs =
      input_transform(config, run.train_set->field(config.data.x), model_input_dtype(*run.model));
  return run;
}

}  // namespace mpigrad::launch
