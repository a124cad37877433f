#include "mpigrad/launch/insitu/embedded_model.h"

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/data/batch.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/observe/rank_logging.h"
#include "mpigrad/launch/train/hooks/checkpoint_hook.h"
#include "mpigrad/launch/train/hooks/cuda_graph_hook.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/onnx/onnx_model.h"

namespace mpigrad::launch {

namespace {

// The part of the config table an embedded model reads.
const std::string kEmbedKeys[] = {"model",
                                  "graph",
                                  "loss",
                                  "optim",
                                  "sched",
                                  "train.seed",
                                  "train.clip_grad_norm",
                                  "train.grad_accum_steps",
                                  "train.cuda_graphs",
                                  "train.cuda_graph_warmup",
                                  "train.precision",
                                  "train.loss_scale_growth_interval",
                                  "distributed"};

// INI text as it is, or the contents of the file it names. Text has a '=' or a line break; a
// bare word is a path, which must exist.
std::pair<std::string, std::string> read_config(const std::string& config) {
  if (config.find('=') != std::string::npos || config.find('\n') != std::string::npos) {
    return {config, "config text"};
  }
  MPIGRAD_CHECK(!config.empty(), "config: empty (give INI text or the path of an INI file)");
  std::ifstream file(config);
  MPIGRAD_CHECK(std::filesystem::is_regular_file(config) && file.good(), "config file '", config,
                "' does not exist or cannot be read");
  std::ostringstream text;
  text << file.rdbuf();
  return {text.str(), config};
}

// Whether INI `text` sets `name` ("loss.name"), as Boost's parser reads it: `[section]` lines,
// `key = value` lines (a key may carry its section, "loss.name = mse"), '#' comments. A key's
// default cannot tell a config that left it out, so this looks at the text.
bool sets_key(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string section;
  auto trim = [](const std::string& part) {
    const size_t begin = part.find_first_not_of(" \t\r");
    if (begin == std::string::npos) return std::string();
    return part.substr(begin, part.find_last_not_of(" \t\r") - begin + 1);
  };
  for (std::string line; std::getline(lines, line);) {
    line = trim(line.substr(0, line.find('#')));
    if (line.size() >= 2 && line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
    } else if (const size_t equals = line.find('='); equals != std::string::npos) {
      const std::string key = trim(line.substr(0, equals));
      if ((section.empty() ? key : section + "." + key) == name) return true;
    }
  }
  return false;
}

// Throws EmbedError of `kind` with the parts streamed together unless `condition` holds.
template <typename... Parts>
void require(bool condition, EmbedErrorKind kind, const Parts&... parts) {
  if (!condition) throw EmbedError(kind, core::detail::concat(parts...));
}

core::Shape output_shape_of(const ModelSection& model, const core::Shape& input_shape) {
  if (model.name == ModelKind::Conv) return {model.outputs, input_shape[1], input_shape[2]};
  return {model.outputs};
}

}  // namespace

EmbeddedModel::EmbeddedModel(const std::string& config, core::Device device,
                             std::optional<uint64_t> seed)
    : device_(device) {
  try {
    build(config, seed);
    start_run();
  } catch (const EmbedError&) {
    throw;
  } catch (const core::Error& error) {
    throw EmbedError(EmbedErrorKind::Config, error.what());
  }
}

EmbeddedModel::EmbeddedModel(const std::string& config, DistributedManager manager,
                             std::optional<core::Device> device, std::optional<uint64_t> seed)
    : manager_(std::make_unique<DistributedManager>(std::move(manager))),
      device_(device.value_or(manager_->device())) {
  // Every rank reads and checks the config; if one fails, all fail with its message, so no rank
  // goes on to the collectives of DDP alone.
  std::string error;
  try {
    build(config, seed);
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    collectively("config", false, [&] {
      if (!error.empty()) throw core::Error(error);
    });
  } catch (const core::Error& failure) {
    throw EmbedError(EmbedErrorKind::Config, failure.what());
  }
  try {
    start_run();
  } catch (const core::Error& mismatch) {
    // DDP's model check fails on every rank alike: a config that differs between ranks.
    throw EmbedError(EmbedErrorKind::Config, mismatch.what());
  }
}

EmbeddedModel::~EmbeddedModel() = default;

void EmbeddedModel::build(const std::string& config, std::optional<uint64_t> seed) {
  const auto [text, origin] = read_config(config);
  config_ = parse_config_text(text, origin, kEmbedKeys);
  if (seed) config_.train.seed = *seed;
  const ModelSection& model = config_.model;
  const bool onnx = model.name == ModelKind::Onnx;
  atomistic_ = is_atomistic(config_);
  if (atomistic_) {
    build_atomistic(origin);
    check_schedule(config_.sched, 0);
    return;
  }
  // An ONNX graph declares its input and output shapes; the built-in models need them given.
  MPIGRAD_CHECK(onnx || !model.input_shape.empty(), origin,
                ": [model] input_shape is required (one "
                "sample's shape, e.g. 1,32,32)");
  MPIGRAD_CHECK(onnx || model.outputs >= 1, origin,
                ": [model] outputs is required (the classes or "
                "values a sample maps to, or the output channels of a conv model)");
  // mpigrad train's default loss, cross_entropy, is rarely what a simulation wants, and a
  // regression config that left [loss] out would otherwise fail only at its first step.
  MPIGRAD_CHECK(sets_key(text, "loss.name"), origin,
                ": [loss] name is required: mse or l1 for "
                "regression (float labels shaped like the model's output), cross_entropy for "
                "classes (one integer label per sample)");
  MPIGRAD_CHECK(config_.loss.name != LossKind::CrossEntropy || model.name != ModelKind::Conv,
                origin,
                ": [loss] name = cross_entropy needs a classifier (mlp, cnn, resnet); "
                "a conv model outputs a grid: use mse or l1");
  if (onnx) {
    build_onnx(origin);
  } else {
    input_shapes_ = {core::Shape(model.input_shape)};
    output_shapes_ = {output_shape_of(model, input_shape())};
    module_ = make_model(model, input_shape(), model.outputs, config_.train.seed);
    input_dtypes_ = {core::kFloat32};
  }
  // Checked here, before any collective: a bad schedule fails every rank in the agreement.
  check_schedule(config_.sched, 0);
  if (config_.train.cuda_graphs) {
    graphs_off_ = graphs_unavailable();
    if (!graphs_off_.empty()) {
      RankLogger(rank(), world_size(), stderr, stderr)
          .info("mpigrad: [train] cuda_graphs: off, " + graphs_off_);
    }
  }
}

// The step of this model: [loss] name of the output against the label (train_step's arrays
// "input" and "label", as mpigrad train's step reads its fields), or, for several arrays
// (train_step_multi's "inputs[i]" and "labels[i]"), the sum over the graph's outputs of the
// loss of each against its label array.
StepFunction EmbeddedModel::step_function() const {
  if (atomistic_) return nullptr;  // the Run's energy_force_step, as mpigrad train's
  StepFunction single = make_supervised_step(config_.loss.name, "input", "label");
  if (config_.model.name != ModelKind::Onnx) return single;
  const LossKind loss = config_.loss.name;
  const RegressionLoss regression =
      loss == LossKind::CrossEntropy ? RegressionLoss() : make_regression_loss(loss);
  const size_t inputs = input_shapes_.size();
  return [single, loss, regression, inputs](nn::Module& model, const data::Batch& batch) {
    if (batch.has("input")) return single(model, batch);
    std::vector<core::Tensor> x;
    for (size_t i = 0; i < inputs; ++i) x.push_back(batch["inputs[" + std::to_string(i) + "]"]);
    std::vector<core::Tensor> outputs = dynamic_cast<nn::OnnxModel&>(model).forward_all(x);
    const int64_t n = batch.size();
    core::Tensor total;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string name = "labels[" + std::to_string(i) + "]";
      core::Tensor term;
      if (loss == LossKind::CrossEntropy) {
        // Names the array in the error about a bad label (checked on the device on a GPU).
        nn::CrossEntropyOptions options;
        options.labels_name = name;
        term = nn::cross_entropy(outputs[i], batch[name], options);
      } else {
        term = regression(outputs[i].reshape({n, -1}), batch[name].reshape({n, -1}),
                          nn::Reduction::Mean);
      }
      total = total.defined() ? total + term : term;
    }
    return total;
  };
}

// The run that trains this model (launch/config/run.h), started: DDP checks that the ranks'
// models agree and broadcasts rank 0's weights. Collective.
void EmbeddedModel::start_run() {
  TrainConfig config = config_;
  config.train.cuda_graphs = config_.train.cuda_graphs && graphs_off_.empty();
  RunInputs inputs;
  inputs.model = module_;
  inputs.sample_shape = input_shape();
  inputs.step = step_function();
  run_ = std::make_unique<Run>(std::move(config), std::move(inputs), manager_.get(), device_,
                               RunKind::Embedded);
  run_->strategy().begin();
}

std::string EmbeddedModel::graphs_unavailable() const {
  if (!device_.is_cuda()) return core::detail::concat("the model is on ", device_);
  if (world_size() > 1) {
    return "the model is trained on more than one rank (its all-reduces are not captured yet)";
  }
  if (config_.train.grad_accum_steps > 1) {
    return "grad_accum_steps > 1 (a graph holds one kind of step)";
  }
  // A replay would draw the capture's dropout masks again, every step (a built-in model's
  // dropout, or an ONNX graph's Dropout nodes: whatever owns a generator).
  if (!module_->named_generators().empty()) return "the model has dropout";
  // The loss scale is a number the capture would keep, while the scaler changes it.
  if (config_.train.precision == nn::Precision::Float16) return "precision = fp16 (loss scaling)";
  return "";
}

// A potential of [model] and [graph] (make_atomistic_model, as mpigrad train builds it). Its
// "samples" are atoms: an input of [3] (a position) and an output of [] (an energy) stand for the
// sample shapes the array calls use, which refuse a potential.
void EmbeddedModel::build_atomistic(const std::string& origin) {
  try {
    module_ = make_atomistic_model(config_);
  } catch (const core::Error& error) {
    core::fail(origin, ": ", error.what());
  }
  MPIGRAD_CHECK(!energy_force_options(config_.loss).uses_stress(), origin,
                ": [loss] stress_weight: the atoms calls take no stress labels; set it to 0");
  input_shapes_ = {core::Shape{3}};
  output_shapes_ = {core::Shape{}};
  input_dtypes_ = {core::kFloat32};
  if (config_.train.cuda_graphs) {
    graphs_off_ = "an interatomic potential (its neighbor lists change every step)";
    RankLogger(rank(), world_size(), stderr, stderr)
        .info("mpigrad: [train] cuda_graphs: off, " + graphs_off_);
  }
}

// The graph's inputs, as [model] input_shape (the first) or the file declares them (every
// dimension but the batch fixed), and its outputs' shapes from one forward of a zero sample in
// evaluation mode: exact, whatever the file declares about them.
void EmbeddedModel::build_onnx(const std::string& origin) {
  const ModelSection& model = config_.model;
  MPIGRAD_CHECK(!model.file.empty(), origin, ": [model] file: name = onnx needs the .onnx file");
  MPIGRAD_CHECK(std::filesystem::is_regular_file(model.file), origin, ": [model] file: '",
                model.file, "' does not exist");
  std::shared_ptr<nn::OnnxModel> graph = nn::OnnxModel::load(model.file);
  const std::vector<nn::OnnxValueInfo>& inputs = graph->graph_inputs();
  MPIGRAD_CHECK(!inputs.empty(), origin, ": [model] file: '", model.file,
                "' declares no graph input");
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int64_t> dims(inputs[i].shape.begin(), inputs[i].shape.end());
    if (i == 0 && !model.input_shape.empty()) {
      input_shapes_.push_back(core::Shape(model.input_shape));  // make_model checks it
      input_dtypes_.push_back(inputs[i].dtype);
      continue;
    }
    bool fixed = !dims.empty();
    for (size_t d = 1; d < dims.size(); ++d) fixed = fixed && dims[d] >= 1;
    MPIGRAD_CHECK(fixed, origin, ": [model] file: '", model.file, "' input '", inputs[i].name,
                  "' has free dimensions besides the batch",
                  i == 0 ? "; give one sample's shape as [model] input_shape" : "");
    input_shapes_.push_back(core::Shape(std::vector<int64_t>(dims.begin() + 1, dims.end())));
    input_dtypes_.push_back(inputs[i].dtype);
  }
  module_ = make_model(model, input_shape(), 0, config_.train.seed);
  auto& onnx = dynamic_cast<nn::OnnxModel&>(*module_);
  std::vector<core::Tensor> probe;
  for (size_t i = 0; i < input_shapes_.size(); ++i) {
    core::Shape shape = input_shapes_[i];
    shape.insert(0, 1);
    probe.push_back(core::zeros(shape, input_dtypes_[i]));
  }
  std::vector<core::Tensor> outputs;
  {
    core::NoGradGuard no_grad;
    onnx.eval();
    outputs = onnx.forward_all(probe);
    onnx.train();
  }
  for (const core::Tensor& output : outputs) {
    MPIGRAD_CHECK(output.dim() >= 1 && output.size(0) == 1, origin, ": [model] file: '", model.file,
                  "' maps one sample to an output of shape ", output.shape(),
                  "; outputs must keep the batch as their first dimension");
    core::Shape shape = output.shape();
    shape.erase(0);
    output_shapes_.push_back(shape);
  }
  MPIGRAD_CHECK(config_.loss.name != LossKind::CrossEntropy || output_shape().size() >= 1, origin,
                ": [loss] name = cross_entropy needs logits [batch, classes, ...], but '",
                model.file, "' outputs one value per sample");
}

int EmbeddedModel::rank() const {
  return manager_ ? manager_->rank() : 0;
}
int EmbeddedModel::world_size() const {
  return manager_ ? manager_->world_size() : 1;
}

core::Tensor EmbeddedModel::prepare_input(const core::Tensor& input, const char* what,
                                          size_t index) {
  using Kind = EmbedErrorKind;
  require(input.defined() && input.dim() >= 1, Kind::Shape, what,
          ": expected an array [batch, ...], got a scalar");
  const int64_t batch = input.size(0);
  require(batch >= 1, Kind::Shape, what, ": an empty batch (shape ", input.shape(), ")");
  // Float inputs become float32; an ONNX graph's integer input (token ids) takes integers, in
  // the dtype it declares.
  const core::DType dtype = input_dtypes_[index];
  if (core::is_floating(dtype)) {
    require(core::is_floating(input.dtype()), Kind::DType, what, ": dtype ", input.dtype(),
            "; inputs must be float32, float64, bfloat16 or float16");
  } else {
    require(!core::is_floating(input.dtype()), Kind::DType, what, ": dtype ", input.dtype(),
            "; the model's input is ", dtype, " (indices): pass int32 or int64");
  }
  check_samples(input, ArrayRole::Input, what, index);
  core::Tensor x = input.to(device_, core::is_floating(dtype) ? core::kFloat32 : dtype);
  if (!x.is_same(input)) copied_bytes_ += x.nbytes();
  if (!x.is_contiguous()) {
    x = x.contiguous();
    copied_bytes_ += x.nbytes();
  }
  core::Shape shape = input_shapes_[index];
  shape.insert(0, batch);
  return x.view(shape);
}

core::Tensor EmbeddedModel::prepare_label(const core::Tensor& label, int64_t batch,
                                          const char* what, size_t index) {
  using Kind = EmbedErrorKind;
  require(label.defined() && label.dim() >= 1 && label.size(0) == batch, Kind::Shape, what,
          ": shape ", label.defined() ? label.shape() : core::Shape{},
          " must start with the input's batch of ", batch);
  core::Tensor y;
  if (config_.loss.name == LossKind::CrossEntropy) {
    require(!core::is_floating(label.dtype()), Kind::DType, what, ": dtype ", label.dtype(),
            "; cross_entropy labels are integer classes (int32 or int64)");
    check_samples(label, ArrayRole::Label, what, index);
    y = label.to(device_, core::kInt64);
  } else {
    require(core::is_floating(label.dtype()), Kind::DType, what, ": dtype ", label.dtype(), "; ",
            core::enum_name(config_.loss.name, kLossKindNames),
            " labels must be float32, float64, bfloat16 or float16");
    check_samples(label, ArrayRole::Label, what, index);
    y = label.to(device_, core::kFloat32);
  }
  if (!y.is_same(label)) copied_bytes_ += y.nbytes();
  if (!y.is_contiguous()) {
    y = y.contiguous();
    copied_bytes_ += y.nbytes();
  }
  return y;
}

core::Shape EmbeddedModel::sample_shape(ArrayRole role, size_t index) const {
  if (role == ArrayRole::Input) return input_shapes_.at(index);
  core::Shape output = output_shapes_.at(index);
  // Class labels: the logits' shape without the class dimension ([] for [classes]).
  if (role == ArrayRole::Label && config_.loss.name == LossKind::CrossEntropy) output.erase(0);
  return output;
}

bool EmbeddedModel::fits(const core::Shape& shape, ArrayRole role, size_t index) const {
  const core::Shape expected = sample_shape(role, index);
  if (shape == expected) return true;
  // An mlp flattens every sample: a one-number input_shape (or outputs) takes any shape of
  // that many values, e.g. [1, 32, 32] for input_shape = 1024.
  return config_.model.name == ModelKind::Mlp && expected.size() == 1 &&
         shape.numel() == expected[0];
}

void EmbeddedModel::check_samples(const core::Tensor& array, ArrayRole role, const char* what,
                                  size_t index) const {
  core::Shape sample = array.shape();
  sample.erase(0);
  if (fits(sample, role, index)) return;
  const core::Shape expected = sample_shape(role, index);
  if (expected.size() == 0) {
    throw EmbedError(EmbedErrorKind::Shape,
                     core::detail::concat(what, ": shape ", array.shape(),
                                          "; cross_entropy "
                                          "needs one class per sample, an array [batch]"));
  }
  const char* owner = role == ArrayRole::Input ? "[model] input_shape" : "the model's output";
  if (sample.numel() != expected.numel()) {
    throw EmbedError(EmbedErrorKind::Shape,
                     core::detail::concat(what, ": shape ", array.shape(), " holds ",
                                          sample.numel(), " values per sample, but ", owner, " ",
                                          expected, " needs ", expected.numel()));
  }
  throw EmbedError(EmbedErrorKind::Shape,
                   core::detail::concat(what, ": shape ", array.shape(), " is samples of shape ",
                                        sample, ", but ", owner, " is ", expected,
                                        " (rank and every extent must match)"));
}

core::Tensor EmbeddedModel::train_step(const core::Tensor& input, const core::Tensor& label) {
  require_atomistic("train_step", false);
  // With cuda_graphs, the arrays are converted (if they must be) on the step's stream too: a copy
  // made on the caller's stream would go back to that stream's cache while the step still reads it.
  std::optional<CapturedStep::Scope> on_step_stream;
  if (CudaGraphHook* graphs = run_->hook<CudaGraphHook>()) {
    on_step_stream.emplace(graphs->captured_step());
  }
  const int64_t copied_before = copied_bytes_;
  data::Batch batch;
  batch.set("input", prepare_input(input, "input", 0));
  const int64_t n = input.size(0);
  batch.set("label", prepare_label(label, n, "label", 0));
  core::Tensor loss = run_batch(batch, copied_bytes_ == copied_before);
  if (on_step_stream) on_step_stream->finish();
  return loss;
}

nn::OnnxModel& EmbeddedModel::graph(const char* call) {
  auto* onnx = dynamic_cast<nn::OnnxModel*>(module_.get());
  require(onnx != nullptr, EmbedErrorKind::Config, call,
          ": several inputs or outputs need [model] name = onnx; this model is ",
          core::enum_name(config_.model.name, kModelKindNames), " (use the one-array call)");
  return *onnx;
}

std::vector<core::Tensor> EmbeddedModel::prepare_inputs(const std::vector<core::Tensor>& inputs,
                                                        const char* call) {
  require(inputs.size() == input_shapes_.size(), EmbedErrorKind::Shape, call, ": ", inputs.size(),
          " input array(s), but the model takes ", input_shapes_.size());
  std::vector<core::Tensor> prepared;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string what = "inputs[" + std::to_string(i) + "]";
    prepared.push_back(prepare_input(inputs[i], what.c_str(), i));
    require(prepared[i].size(0) == prepared[0].size(0), EmbedErrorKind::Shape, what,
            ": a batch of ", prepared[i].size(0), " samples, but inputs[0] holds ",
            prepared[0].size(0));
  }
  return prepared;
}

core::Tensor EmbeddedModel::train_step_multi(const std::vector<core::Tensor>& inputs,
                                             const std::vector<core::Tensor>& labels) {
  require_atomistic("train_step_multi", false);
  graph("train_step_multi");
  std::optional<CapturedStep::Scope> on_step_stream;
  if (CudaGraphHook* graphs = run_->hook<CudaGraphHook>()) {
    on_step_stream.emplace(graphs->captured_step());
  }
  const int64_t copied_before = copied_bytes_;
  std::vector<core::Tensor> x = prepare_inputs(inputs, "train_step_multi");
  const int64_t n = x.front().size(0);
  require(labels.size() == output_shapes_.size(), EmbedErrorKind::Shape,
          "train_step_multi: ", labels.size(), " label array(s), but the model has ",
          output_shapes_.size(), " output(s), one label array each");
  data::Batch batch;
  for (size_t i = 0; i < x.size(); ++i) batch.set("inputs[" + std::to_string(i) + "]", x[i]);
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string what = "labels[" + std::to_string(i) + "]";
    batch.set(what, prepare_label(labels[i], n, what.c_str(), i));
  }
  core::Tensor loss = run_batch(batch, copied_bytes_ == copied_before);
  if (on_step_stream) on_step_stream->finish();
  return loss;
}

// One micro-step of the run's strategy on this rank's batch: forward and loss (under [train]
// precision), backward (averaged over the ranks by DDP), and the optimizer every
// grad_accum_steps calls, with loss scaling, clipping and the schedule, as in mpigrad train.
core::Tensor EmbeddedModel::run_batch(data::Batch& batch, bool arrays_in_place) {
  if (batch.indices.empty()) {  // samples; a batch of structures comes with its indices
    batch.indices.resize(size_t(batch.fields.front().second.size(0)));
    std::iota(batch.indices.begin(), batch.indices.end(), int64_t(0));
  }
  const int64_t n = batch.size();
  if (CudaGraphHook* graphs = run_->hook<CudaGraphHook>()) {
    graphs->set_arrays_in_place(arrays_in_place);
  }
  TrainingContext& context = run_->strategy().context();
  const int64_t steps_before = context.step;
  const double lr = run_->optimizer()->param_groups().front().lr;  // the lr this step uses
  run_->strategy().train_batch(batch);
  last_loss_ = context.loss.detach();
  // A potential's loss is each rank's part of the global loss already (atomistic_steps.h): the
  // plain mean of the ranks' is the global batch's.
  last_batch_ = atomistic_ ? 1 : n;
  if (context.step > steps_before && step_callback_) step_callback_(context.step, lr);
  return last_loss_;
}

int64_t EmbeddedModel::steps() const {
  return run_->strategy().context().step;
}

std::vector<core::Tensor> EmbeddedModel::predict_multi(const std::vector<core::Tensor>& inputs) {
  require_atomistic("predict_multi", false);
  nn::OnnxModel& onnx = graph("predict_multi");
  std::vector<core::Tensor> x = prepare_inputs(inputs, "predict_multi");
  core::NoGradGuard no_grad;
  const bool was_training = module_->is_training();
  module_->eval();
  std::vector<core::Tensor> outputs = onnx.forward_all(x);
  module_->train(was_training);
  return outputs;
}

std::string EmbeddedModel::cuda_graph_status() const {
  if (!config_.train.cuda_graphs) return "off";
  const CudaGraphHook* graphs = run_->hook<CudaGraphHook>();
  if (graphs == nullptr) return "off: " + graphs_off_;
  const CapturedStep& captured = graphs->captured_step();
  if (!captured.failure().empty()) return "off: the capture failed: " + captured.failure();
  if (captured.captured()) {
    return core::detail::concat("replaying (", captured.replays(), " replays)");
  }
  return "warming up";
}

double EmbeddedModel::last_loss() const {
  return last_loss_.defined() ? last_loss_.item<double>() : 0.0;
}

double EmbeddedModel::mean_loss() {
  const double local = last_loss();
  if (manager_ == nullptr || world_size() == 1) return local;
  core::Tensor sums =
      core::Tensor::from_vector<double>({local * double(last_batch_), double(last_batch_)}, {2});
  manager_->world().all_reduce(sums, ReduceOp::Sum);
  const std::vector<double> total = sums.to_vector<double>();
  return total[1] > 0 ? total[0] / total[1] : 0.0;
}

core::Tensor EmbeddedModel::predict(const core::Tensor& input) {
  require_atomistic("predict", false);
  core::Tensor x = prepare_input(input, "input", 0);
  core::NoGradGuard no_grad;
  const bool was_training = module_->is_training();
  module_->eval();
  core::Tensor output = (*module_)(x);
  module_->train(was_training);
  core::Shape shape = output_shape();
  shape.insert(0, x.size(0));
  return output.reshape(shape);
}

void EmbeddedModel::collectively(const char* what, bool writer_only,
                                 const std::function<void()>& io) {
  std::string error;
  if (!writer_only || rank() == 0) {
    try {
      io();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (manager_ == nullptr) {
    if (!error.empty()) throw core::Error(error);
    return;
  }
  // The lowest failing rank's message, on every rank.
  Communicator& world = manager_->world();
  const int size = world.size();
  core::Tensor first = core::Tensor::from_vector<int64_t>({error.empty() ? size : rank()}, {1});
  world.all_reduce(first, ReduceOp::Min);
  const int failing = int(first.item<int64_t>());
  if (failing == size) return;
  core::Tensor length = core::Tensor::from_vector<int64_t>({int64_t(error.size())}, {1});
  world.broadcast(length, failing);
  core::Tensor bytes = core::zeros({length.item<int64_t>()}, core::kUInt8);
  if (rank() == failing) std::copy(error.begin(), error.end(), bytes.data<uint8_t>());
  world.broadcast(bytes, failing);
  const std::vector<uint8_t> text = bytes.to_vector<uint8_t>();
  core::fail(what, " failed on rank ", failing, ": ", std::string(text.begin(), text.end()));
}

// File I/O of the save and load calls, as EmbedError (File) on every rank.
void EmbeddedModel::file_io(const char* what, bool writer_only, const std::function<void()>& io) {
  try {
    collectively(what, writer_only, io);
  } catch (const core::Error& error) {
    throw EmbedError(EmbedErrorKind::File, error.what());
  }
}

// The weights alone (save_model), or everything a restart needs (save_checkpoint): what
// mpigrad train's checkpoints hold, written by the same code
// (launch/train/hooks/checkpoint_hook.h).
void EmbeddedModel::save(const char* what, const std::string& path, bool training_state) {
  // The training state is gathered by every rank (ZeRO-1's shards), before only the writer goes on.
  std::optional<nn::CheckpointData> state;
  if (training_state) {
    state = gather_training_state(run_->strategy().context(), config_.resolved_text());
  }
  file_io(what, true, [&] {
    nn::CheckpointData data;
    if (state) {
      data = std::move(*state);
    } else {
      data.model = module_->state_dict();
      data.step = steps();
      data.world_size = world_size();
      data.config = config_.resolved_text();
    }
    nn::save_checkpoint(path, data);
  });
}

// Every rank reads, and none changes its model unless all could.
void EmbeddedModel::load(const char* what, const std::string& path, bool training_state) {
  nn::CheckpointData data;
  file_io(what, false, [&] { data = nn::load_checkpoint(path); });
  try {
    if (training_state) {
      restore_training_state(run_->strategy().context(), data, path);
    } else {
      nn::apply_checkpoint(data, path, *module_, nullptr, nullptr);
    }
  } catch (const core::Error& error) {
    throw EmbedError(EmbedErrorKind::File, error.what());
  }
}

void EmbeddedModel::save_model(const std::string& path) {
  save("save_model", path, false);
}
void EmbeddedModel::load_model(const std::string& path) {
  load("load_model", path, false);
}
void EmbeddedModel::save_checkpoint(const std::string& path) {
  save("save_checkpoint", path, true);
}
void EmbeddedModel::load_checkpoint(const std::string& path) {
  load("load_checkpoint", path, true);
}

}  // namespace mpigrad::launch
