#include "mpigrad/launch/config/train_setup.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/data/neighbor_list.h"
#include "mpigrad/data/transforms.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/onnx/onnx_energy_model.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/sgd.h"
#include "mpigrad/nn/schnet.h"

namespace mpigrad::launch {

void check_fits_in_memory(int64_t bytes, const std::string& what, int64_t memory_bytes) {
  if (memory_bytes < 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_bytes <= 0) return;  // unknown: nothing to compare with
    memory_bytes = int64_t(pages) * int64_t(page_bytes);
  }
  constexpr double kGiB = double(int64_t(1) << 30);
  MPIGRAD_CHECK(bytes <= memory_bytes / 2, what, ": needs ", bytes, " bytes (",
                double(bytes) / kGiB, " GiB), more than half of this machine's ",
                double(memory_bytes) / kGiB, " GiB of memory");
}

namespace {

// The weights of a `inputs` -> `outputs` layer (kernel x kernel for convolutions, plus the
// bias), checked: the sizes are the config's and the file's, and their product may not fit.
int64_t layer_parameters(int64_t inputs, int64_t outputs, int64_t kernel, const char* key) {
  const int64_t taps = core::checked_mul(kernel, kernel, "[model] kernel_size");
  int64_t weights = core::checked_mul(inputs, outputs, "[model] ", key, ": a layer of ", inputs,
                                      " inputs and ", outputs, " outputs");
  weights =
      core::checked_mul(weights, taps, "[model] ", key, ": a layer of ", inputs, " inputs and ",
                        outputs, " outputs with ", kernel, "x", kernel, " kernels");
  return core::checked_add(weights, outputs, "[model] ", key, ": a layer of ", inputs,
                           " inputs and ", outputs, " outputs");
}

// What the model's parameters will take, counted before anything is allocated: a width of 2^62
// is an error naming its key, not an overflow inside a layer (or a kernel writing past a wrapped
// size), and a model that cannot fit in memory says so with the key that sized it.
void check_model_size(const ModelSection& model, const core::Shape& input_shape, int64_t outputs) {
  int64_t parameters = 0;
  auto add = [&](int64_t count, const char* key) {
    parameters = core::checked_add(parameters, count, "[model] ", key, ": the parameter count");
    check_fits_in_memory(core::checked_mul(parameters, 4, "[model] ", key, ": the model's bytes"),
                         std::string("[model] ") + key + ": the model's " +
                             std::to_string(parameters) + " float32 parameters");
  };
  auto classifier = [&](int64_t features) {
    for (int64_t width : model.hidden) {
      add(layer_parameters(features, width, 1, "hidden"), "hidden");
      features = width;
    }
    add(layer_parameters(features, outputs, 1, "outputs ([data] num_classes)"), "outputs");
  };
  switch (model.name) {
    case ModelKind::Mlp:
      classifier(input_shape.numel());
      break;
    case ModelKind::Cnn: {
      if (input_shape.size() != 3) return;  // make_model says why
      int64_t channels = input_shape[0], height = input_shape[1], width = input_shape[2];
      for (int64_t out : model.channels) {
        add(layer_parameters(channels, out, 3, "channels"), "channels");
        channels = out;
        height /= 2;
        width /= 2;
      }
      classifier(core::checked_mul(core::checked_mul(channels, height, "[model] channels"), width,
                                   "[model] channels"));
      break;
    }
    case ModelKind::ResNet: {
      if (input_shape.size() != 3) return;
      // An upper bound, enough to name the key before anything is built: the stem, then per
      // stage (w, 2w, 4w, 8w channels) two 3x3 convs a block and a 1x1 downsample where the
      // width changes; BatchNorm's weights are a rounding error beside them.
      const int64_t blocks = model.depth == 34 ? 6 : 2;  // per stage; 34's [3,4,6,3] at most
      int64_t channels = model.width;
      add(layer_parameters(input_shape[0], channels, 3, "width"), "width");
      for (int stage = 0; stage < 4; ++stage) {
        const int64_t out = core::checked_mul(model.width, int64_t(1) << stage, "[model] width");
        for (int64_t block = 0; block < blocks; ++block) {
          add(layer_parameters(channels, out, 3, "width"), "width");
          add(layer_parameters(out, out, 3, "width"), "width");
          if (channels != out) add(layer_parameters(channels, out, 1, "width"), "width");
          channels = out;
        }
      }
      if (outputs > 0) {
        add(layer_parameters(channels, outputs, 1, "outputs ([data] num_classes)"), "outputs");
      }
      break;
    }
    case ModelKind::Onnx:
      return;  // the file's weights are its own; reading them checked their sizes
    case ModelKind::SchNet:
      return;  // make_model refuses it; make_atomistic_model checks its widths
    case ModelKind::Conv: {
      if (input_shape.size() != 3) return;
      int64_t channels = input_shape[0];
      for (int64_t out : model.channels) {
        add(layer_parameters(channels, out, model.kernel_size, "channels"), "channels");
        channels = out;
      }
      add(layer_parameters(channels, outputs, model.kernel_size, "outputs ([data] num_classes)"),
          "outputs");
      break;
    }
  }
}

void check_resnet(const ModelSection& model, const core::Shape& input_shape) {
  MPIGRAD_CHECK(input_shape.size() == 3,
                "[model] name = resnet needs samples of shape "
                "[channels, height, width], got ",
                input_shape);
  MPIGRAD_CHECK(model.depth == 18 || model.depth == 34,
                "[model] depth: resnet has depth 18 or "
                "34 (basic blocks), got ",
                model.depth);
}

// The graph's first input must take [batch, input_shape...]: its rank, and every extent the file
// fixes (the batch and any dimension exported as dynamic are free).
void check_onnx_input(const nn::OnnxModel& onnx, const std::string& file,
                      const core::Shape& input_shape) {
  const std::vector<nn::OnnxValueInfo>& inputs = onnx.graph_inputs();
  MPIGRAD_CHECK(!inputs.empty(), "[model] file: '", file, "' declares no graph input");
  const nn::OnnxValueInfo& input = inputs.front();
  const std::vector<int64_t> declared(input.shape.begin(), input.shape.end());
  bool fits = int64_t(declared.size()) == input_shape.size() + 1;
  for (size_t d = 1; fits && d < declared.size(); ++d) {
    fits = declared[d] < 0 || declared[d] == input_shape[int64_t(d - 1)];
  }
  MPIGRAD_CHECK(fits, "[model] file: '", file, "' input '", input.name, "' has shape ",
                nn::onnx_shape_text(declared), " (? free), which does not take samples of shape ",
                input_shape, " (the data's, or [model] input_shape)");
}

std::shared_ptr<nn::Module> make_onnx_model(const ModelSection& model,
                                            const core::Shape& input_shape) {
  MPIGRAD_CHECK(!model.file.empty(), "[model] file: name = onnx needs the .onnx file to train");
  MPIGRAD_CHECK(std::filesystem::is_regular_file(model.file), "[model] file: '", model.file,
                "' does not exist");
  std::shared_ptr<nn::OnnxModel> onnx = nn::OnnxModel::load(model.file);
  check_onnx_input(*onnx, model.file, input_shape);
  return onnx;
}

std::string numbers(const std::vector<double>& values) {
  std::string text;
  for (double value : values) {
    char number[32];
    std::snprintf(number, sizeof(number), "%g", value);
    if (!text.empty()) text.push_back(',');
    text.append(number);
  }
  return text;
}

}  // namespace

core::DType model_input_dtype(const nn::Module& model) {
  const auto* onnx = dynamic_cast<const nn::OnnxModel*>(&model);
  if (onnx == nullptr || onnx->graph_inputs().empty()) return core::kFloat32;
  return onnx->graph_inputs().front().dtype;
}

InputTransform input_transform(const TrainConfig& config, const data::FieldInfo& inputs,
                               core::DType model_dtype) {
  if (!core::is_floating(model_dtype)) {
    // Token ids and other indices: kept as integers, in the graph's dtype.
    MPIGRAD_CHECK(!core::is_floating(inputs.dtype), "[data] x: field '", config.data.x, "' is ",
                  inputs.dtype, " but the model's input is ", model_dtype,
                  " (indices); store it as integers");
    MPIGRAD_CHECK(config.data.mean.empty(), "[data] mean: the model's input is ", model_dtype,
                  " (indices), which cannot be normalized; leave [data] mean and std unset");
    std::ostringstream text;
    text << "field '" << config.data.x << "' " << inputs.dtype << " " << inputs.sample_shape
         << ", used as " << model_dtype << " (the graph's input dtype)";
    if (inputs.dtype == model_dtype) return {nullptr, text.str()};
    const std::string field = config.data.x;
    return {[field, model_dtype](data::Batch batch) {
              batch.set(field, batch[field].to(model_dtype));
              return batch;
            },
            text.str()};
  }
  const bool image = inputs.dtype == core::kUInt8;
  const bool normalized = !config.data.mean.empty();
  std::ostringstream text;
  text << "field '" << config.data.x << "' " << inputs.dtype << " " << inputs.sample_shape
       << (image ? ", scaled to [0, 1]" : ", used as it is");
  if (normalized) {
    text << ", normalized with mean " << numbers(config.data.mean) << " and std "
         << numbers(config.data.std);
  }
  if (!image && !normalized && inputs.dtype == core::kFloat32) return {nullptr, text.str()};
  if (!image && !normalized) text << " (converted to float32)";
  std::vector<double> mean = normalized ? config.data.mean : std::vector<double>{0.0};
  std::vector<double> std = normalized ? config.data.std : std::vector<double>{1.0};
  return {data::normalize_transform(config.data.x, image ? 1.0 / 255.0 : 1.0, mean, std),
          text.str()};
}

DdpOptions ddp_options(const DistributedSection& distributed, bool loss_scaling) {
  DdpOptions ddp;
  ddp.bucket_cap_mb = distributed.bucket_cap_mb;
  ddp.find_unused_parameters = distributed.find_unused_parameters;
  ddp.compression = distributed.reduce_dtype == ReduceDType::BFloat16 ? GradCompression::BFloat16
                                                                      : distributed.compression;
  ddp.shared_memory = distributed.shared_memory;
  ddp.transport = distributed.transport;
  ddp.timeout_seconds = distributed.timeout_s;
  ddp.zero = distributed.zero == 1;
  ddp.carry_found_inf = ddp.zero && loss_scaling;
  return ddp;
}

std::shared_ptr<nn::Module> make_model(const ModelSection& model, const core::Shape& input_shape,
                                       int64_t outputs, uint64_t seed) {
  core::Generator generator(seed);
  MPIGRAD_CHECK(input_shape.numel() >= 1, "[model] input_shape: empty input ", input_shape);
  // An onnx model's outputs are the file's; the caller checks them against the labels.
  MPIGRAD_CHECK(outputs >= 1 || model.name == ModelKind::Onnx,
                "[model] outputs: must be at least 1, got ", outputs);
  // The loader's errors name the file and the node; no "[model]: " prefix is needed.
  if (model.name == ModelKind::Onnx) return make_onnx_model(model, input_shape);
  const bool images = input_shape.size() == 3;
  check_model_size(model, input_shape, outputs);
  try {
    switch (model.name) {
      case ModelKind::Mlp:
        return nn::make_mlp(input_shape, model.hidden, outputs, model.dropout, generator);
      case ModelKind::Cnn:
        MPIGRAD_CHECK(images,
                      "[model] name = cnn needs samples of shape [channels, height, "
                      "width], got ",
                      input_shape);
        return nn::make_cnn(input_shape, model.channels, model.hidden, outputs, model.dropout,
                            generator, model.padding_mode);
      case ModelKind::Conv:
        MPIGRAD_CHECK(images,
                      "[model] name = conv needs samples of shape [channels, height, "
                      "width], got ",
                      input_shape);
        return nn::make_conv_net(input_shape, model.channels, outputs, model.kernel_size,
                                 model.padding_mode, generator);
      case ModelKind::ResNet:
        check_resnet(model, input_shape);
        return nn::make_resnet(input_shape, model.depth, model.width, outputs, generator);
      case ModelKind::Onnx:
        break;  // above
      case ModelKind::SchNet:
        core::fail(
            "[model] name = schnet is an interatomic potential; train it with [loss] name = "
            "energy_force on atomic structures");
    }
  } catch (const core::Error& error) {
    core::fail("[model]: ", error.what());
  }
  core::fail("[model] name: unhandled model kind");
}

nn::Encoder make_encoder(const ModelSection& model, const core::Shape& input_shape,
                         core::Generator& generator) {
  MPIGRAD_CHECK(input_shape.numel() >= 1, "[model] input_shape: empty input ", input_shape);
  const bool images = input_shape.size() == 3;
  try {
    switch (model.name) {
      case ModelKind::Mlp:
        return nn::make_mlp_encoder(input_shape, model.hidden, model.dropout, generator);
      case ModelKind::Cnn:
        MPIGRAD_CHECK(images,
                      "[model] name = cnn needs samples of shape [channels, height, "
                      "width], got ",
                      input_shape);
        return nn::make_cnn_encoder(input_shape, model.channels, model.hidden, model.dropout,
                                    generator, model.padding_mode);
      case ModelKind::ResNet: {
        check_resnet(model, input_shape);
        check_model_size(model, input_shape, 0);
        auto resnet = nn::make_resnet(input_shape, model.depth, model.width, 0, generator);
        return {resnet, core::checked_mul(model.width, 8, "[model] width")};
      }
      case ModelKind::Conv:
        core::fail(
            "[model] name = conv has no encoder (its output is a grid, not features); "
            "two-stage training takes mlp, cnn or resnet");
      case ModelKind::Onnx:
        core::fail(
            "[model] name = onnx has no encoder to split off (the graph is one piece); "
            "two-stage training takes mlp, cnn or resnet");
      case ModelKind::SchNet:
        core::fail(
            "[model] name = schnet is an interatomic potential; two-stage training takes mlp, "
            "cnn or resnet");
    }
  } catch (const core::Error& error) {
    core::fail("[model]: ", error.what());
  }
  core::fail("[model] name: unhandled model kind");
}

std::shared_ptr<nn::Module> make_stage_model(const ModelSection& model, const TrainSection& train,
                                             const core::Shape& input_shape, int64_t classes) {
  if (train.stage == StageKind::Supervised) {
    return make_model(model, input_shape, classes, train.seed);
  }
  core::Generator generator(train.seed);
  nn::Encoder encoder = make_encoder(model, input_shape, generator);
  if (train.stage == StageKind::SupCon) {
    auto head = nn::make_head(nn::HeadKind::Mlp, encoder.features, model.projection, generator);
    return std::make_shared<nn::EncoderWithHead>(
        encoder.module, encoder.features, head,
        nn::EncoderWithHeadOptions{.normalize_output = true});
  }
  MPIGRAD_CHECK(classes >= 1, "[model] outputs: must be at least 1, got ", classes);
  auto head = nn::make_head(model.head, encoder.features, classes, generator);
  return std::make_shared<nn::EncoderWithHead>(
      encoder.module, encoder.features, head,
      nn::EncoderWithHeadOptions{.freeze_encoder = train.freeze_encoder});
}

void load_encoder(nn::EncoderWithHead& model, const std::string& path, const std::string& where) {
  nn::CheckpointData data;
  try {
    data = nn::load_checkpoint(path);
  } catch (const core::Error& error) {
    core::fail(where, ": cannot read checkpoint '", path, "': ", error.what());
  }
  const std::string prefix = "encoder.";
  nn::StateDict encoder_state;
  for (const auto& [name, tensor] : data.model.tensors()) {
    if (name.starts_with(prefix)) encoder_state.set(name.substr(prefix.size()), tensor);
  }
  MPIGRAD_CHECK(encoder_state.size() > 0, where, ": checkpoint '", path,
                "' holds no encoder.* "
                "tensors; give the checkpoint of a stage = supcon (or classifier) run");
  const nn::StateDict expected = model.encoder().state_dict();
  for (const auto& [name, tensor] : expected.tensors()) {
    const core::Tensor* stored = encoder_state.find(name);
    MPIGRAD_CHECK(stored != nullptr, where, ": checkpoint '", path, "' lacks tensor '", prefix,
                  name, "' of this [model]'s encoder (shape ", tensor.shape(),
                  "); was it written with the same [model] keys?");
    MPIGRAD_CHECK(stored->shape() == tensor.shape(), where, ": checkpoint '", path, "' tensor '",
                  prefix, name, "' has shape ", stored->shape(),
                  " but this [model]'s encoder "
                  "expects ",
                  tensor.shape(), "; was it written with the same [model] keys?");
  }
  for (const auto& [name, tensor] : encoder_state.tensors()) {
    MPIGRAD_CHECK(expected.contains(name), where, ": checkpoint '", path, "' tensor '", prefix,
                  name,
                  "' has no place in this [model]'s encoder; was it written with the same "
                  "[model] keys?");
  }
  try {
    model.encoder().load_state_dict(encoder_state, /*strict=*/true);
  } catch (const core::Error& error) {
    core::fail(where, ": checkpoint '", path, "': ", error.what());
  }
}

namespace {
std::vector<core::Tensor> trainable_parameters(const nn::Module& model) {
  std::vector<core::Tensor> trainable;
  for (const core::Tensor& parameter : model.parameters()) {
    if (parameter.requires_grad()) trainable.push_back(parameter);
  }
  return trainable;
}
}  // namespace

std::unique_ptr<nn::Optimizer> make_optimizer(const OptimSection& optim, nn::Module& model) {
  switch (optim.name) {
    case OptimizerKind::Sgd:
      return std::make_unique<nn::SGD>(
          trainable_parameters(model),
          nn::SGDOptions{
              .lr = optim.lr, .momentum = optim.momentum, .weight_decay = optim.weight_decay});
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW: {
      nn::AdamOptions options;
      options.lr = optim.lr;
      options.weight_decay = optim.weight_decay;
      if (optim.name == OptimizerKind::Adam) {
        return std::make_unique<nn::Adam>(trainable_parameters(model), options);
      }
      return std::make_unique<nn::AdamW>(trainable_parameters(model), options);
    }
  }
  core::fail("[optim] name: unhandled optimizer kind");
}

namespace {
int64_t schedule_length(const SchedSection& sched, int64_t run_steps) {
  return sched.total_steps > 0 ? sched.total_steps : run_steps;
}
}  // namespace

void check_schedule(const SchedSection& sched, int64_t run_steps) {
  if (sched.name == SchedulerKind::Linear || sched.name == SchedulerKind::Polynomial) {
    MPIGRAD_CHECK(schedule_length(sched, run_steps) > 0,
                  "[sched] total_steps: ", core::enum_name(sched.name, kSchedulerKindNames),
                  " needs its length in "
                  "steps (set [sched] total_steps)");
  }
  if (sched.name == SchedulerKind::Cosine) {
    const int64_t total = schedule_length(sched, run_steps);
    MPIGRAD_CHECK(total > 0,
                  "[sched] total_steps: cosine needs its length in steps (set "
                  "[sched] total_steps)");
    MPIGRAD_CHECK(sched.warmup_steps < total, "[sched] warmup_steps: ", sched.warmup_steps,
                  " must be below the cosine's ", total, " steps");
  }
  if (sched.name == SchedulerKind::MultiStep) {
    MPIGRAD_CHECK(!sched.milestones.empty(), "[sched] milestones: multistep needs at least one");
  }
}

std::unique_ptr<nn::LRScheduler> make_scheduler(const SchedSection& sched, nn::Optimizer& optimizer,
                                                int64_t run_steps) {
  check_schedule(sched, run_steps);
  switch (sched.name) {
    case SchedulerKind::None:
      return nullptr;
    case SchedulerKind::Cosine:
      return std::make_unique<nn::WarmupCosineLR>(optimizer, sched.warmup_steps,
                                                  schedule_length(sched, run_steps));
    case SchedulerKind::Step:
      return std::make_unique<nn::StepLR>(optimizer, sched.step_size, sched.gamma);
    case SchedulerKind::MultiStep:
      return std::make_unique<nn::MultiStepLR>(optimizer, sched.milestones, sched.gamma);
    case SchedulerKind::Linear:
      return std::make_unique<nn::LinearLR>(optimizer, sched.start_factor, sched.end_factor,
                                            schedule_length(sched, run_steps));
    case SchedulerKind::Polynomial:
      return std::make_unique<nn::PolynomialLR>(optimizer, schedule_length(sched, run_steps),
                                                sched.power);
  }
  core::fail("[sched] name: unhandled scheduler kind");
}

int loader_workers(ReadAhead read_ahead, bool cpu_device, int64_t threads, int64_t ranks,
                   int64_t cpus) {
  if (read_ahead != ReadAhead::Auto) return read_ahead == ReadAhead::On ? 1 : 0;
  if (!cpu_device) return 1;  // the GPU computes; the host's cores are free to read
  return threads * ranks < cpus ? 1 : 0;
}

bool is_atomistic(const TrainConfig& config) {
  return config.loss.name == LossKind::EnergyForce;
}

data::BatchingOptions batching_options(const TrainConfig& config, int64_t rank, int64_t ranks) {
  data::BatchingOptions options;
  options.batch_size = config.train.batch_size;
  options.max_atoms = config.data.max_atoms;
  options.samples_per_dataset = config.data.samples_per_dataset;
  options.epoch_policy = config.data.epoch_policy;
  options.replacement = config.data.replacement;
  options.shuffle = config.train.shuffle;
  options.seed = config.train.seed;
  options.num_replicas = ranks;
  options.rank = rank;
  return options;
}

std::shared_ptr<nn::AtomisticModel> make_atomistic_model(const TrainConfig& config) {
  const ModelSection& model = config.model;
  if (model.name == ModelKind::Onnx) {
    MPIGRAD_CHECK(!model.file.empty(), "[model] file: name = onnx needs the .onnx file to train");
    MPIGRAD_CHECK(std::filesystem::is_regular_file(model.file), "[model] file: '", model.file,
                  "' does not exist");
    std::shared_ptr<nn::OnnxModel> graph = nn::OnnxModel::load(model.file);
    MPIGRAD_CHECK(nn::OnnxEnergyModel::is_energy_model(*graph), "[model] file: '", model.file,
                  "' is not an interatomic potential for [loss] name = energy_force: its inputs ",
                  "must be named from positions, atomic_numbers, edge_index, edge_shifts, batch, "
                  "cell (torch.onnx.export(..., input_names=[...]))");
    return std::make_shared<nn::OnnxEnergyModel>(graph);
  }
  MPIGRAD_CHECK(model.name == ModelKind::SchNet,
                "[model] name: ", core::enum_name(model.name, kModelKindNames),
                " is not an interatomic potential; [loss] name = energy_force trains schnet, or "
                "onnx with a potential's graph");
  MPIGRAD_CHECK(model.hidden.size() == 1,
                "[model] hidden: schnet takes one width (features per "
                "atom and filters per edge), e.g. hidden = 64; got ",
                model.hidden.size(), " values (the default 256,128 is the mlp's)");
  MPIGRAD_CHECK(config.graph.cutoff > 0,
                "[graph] cutoff: schnet takes its cutoff from [graph] "
                "cutoff, which must then be set (the neighbor list is rebuilt with it)");
  nn::SchNetOptions options;
  options.hidden = model.hidden.front();
  options.n_rbf = model.n_rbf;
  options.interactions = model.interactions;
  options.cutoff = config.graph.cutoff;
  MPIGRAD_CHECK(options.hidden >= 2, "[model] hidden: schnet needs a width of at least 2, got ",
                options.hidden);
  // Its largest layers are hidden x hidden per interaction: a size that cannot fit names the key.
  const int64_t square = core::checked_mul(options.hidden, options.hidden, "[model] hidden");
  const int64_t per_block = core::checked_mul(square, 4, "[model] hidden");
  check_fits_in_memory(
      core::checked_mul(core::checked_mul(per_block, options.interactions, "[model] interactions"),
                        4, "[model] hidden"),
      "[model] hidden and interactions: schnet's float32 parameters");
  core::Generator generator(config.train.seed);
  return std::make_shared<nn::SchNet>(options, generator);
}

EnergyForceLossOptions energy_force_options(const LossSection& loss) {
  EnergyForceLossOptions options;
  options.weights = {loss.energy_weight, loss.force_weight, loss.stress_weight};
  options.switch_step = loss.switch_step;
  options.weights_after = {loss.energy_weight_after, loss.force_weight_after,
                           loss.stress_weight_after};
  options.per_atom_energy = loss.per_atom_energy;
  options.kind = loss.kind;
  options.huber_delta = loss.huber_delta;
  return options;
}

InputTransform graph_transform(const GraphSection& graph) {
  if (graph.cutoff <= 0) return {nullptr, "the store's neighbor lists"};
  std::ostringstream text;
  text << "neighbor lists rebuilt per batch, cutoff " << graph.cutoff;
  if (graph.max_neighbors > 0) text << ", at most " << graph.max_neighbors << " neighbors";
  if (graph.self_loops) text << ", self loops";
  return {data::radius_graph_transform({.cutoff = graph.cutoff,
                                        .max_neighbors = graph.max_neighbors,
                                        .self_loops = graph.self_loops}),
          text.str()};
}

RegressionLoss make_regression_loss(LossKind loss) {
  switch (loss) {
    case LossKind::Mse:
      return [](const core::Tensor& prediction, const core::Tensor& target, nn::Reduction r) {
        return nn::mse_loss(prediction, target, r);
      };
    case LossKind::L1:
      return [](const core::Tensor& prediction, const core::Tensor& target, nn::Reduction r) {
        return nn::l1_loss(prediction, target, r);
      };
    case LossKind::CrossEntropy:
    case LossKind::EnergyForce:
      break;
  }
  core::fail("[loss] name: ", core::enum_name(loss, kLossKindNames), " is not a regression loss");
}

StepFunction make_supervised_step(LossKind loss, const std::string& input,
                                  const std::string& label) {
  if (loss == LossKind::CrossEntropy) return classification_step(input, label);
  return regression_step(input, label, make_regression_loss(loss));
}

}  // namespace mpigrad::launch
