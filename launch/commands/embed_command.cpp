#include "mpigrad/launch/commands/embed_command.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/launch/commands/subcommand.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/embeddings.h"

namespace po = boost::program_options;

namespace mpigrad::launch {

namespace {

constexpr const char* kUsage =
    "usage: mpigrad embed --config FILE.ini --checkpoint CKPT.h5 [--split test|train] -o OUT.h5 "
    "[--metrics] [--batch-size N] [--section.key=value ...]\n\n"
    "Embeds a dataset with the encoder of a two-stage model ([train] stage = supcon or\n"
    "classifier) and writes /embeddings float32 [N, D], /labels int64 [N] and /indices int64 [N]\n"
    "in dataset order. Run it under mpirun like `mpigrad train`: every rank embeds its shard.\n"
    "--metrics also prints precision@1 and mAP@R (pytorch-metric-learning's definitions).\n"
    "Any other --section.key=value overrides the config's key, as for `mpigrad train`.\n\n";

struct EmbedJob {
  TrainConfig config;
  std::string checkpoint, split = "test", output;
  bool metrics = false;
  int64_t batch_size = 256;
  std::shared_ptr<data::Hdf5Dataset> dataset;
  std::shared_ptr<nn::EncoderWithHead> model;
};

po::options_description embed_options() {
  po::options_description options("options");
  options.add_options()("config", po::value<std::string>(), "the run's INI configuration")(
      "checkpoint", po::value<std::string>(), "checkpoint holding encoder.* tensors")(
      "split", po::value<std::string>(), "test (default) or train: [data] test or [data] train")(
      "output,o", po::value<std::string>(), "the HDF5 file to write")(
      "metrics", "also compute and print precision@1 and mAP@R")(
      "batch-size", po::value<int64_t>(), "samples per batch and rank (default 256)")(
      "help,h", "show this help");
  return options;
}

std::string embed_usage() {
  std::ostringstream text;
  text << kUsage << embed_options();
  return text.str();
}

EmbedJob check_embed_job(const std::vector<std::string>& args, int64_t ranks) {
  EmbedJob job;
  const po::options_description options = embed_options();
  po::variables_map values;
  std::vector<std::string> overrides;  // --section.key=value, for the config (checked there)
  try {
    po::parsed_options parsed =
        po::command_line_parser(args).options(options).allow_unregistered().run();
    po::store(parsed, values);
    overrides = po::collect_unrecognized(parsed.options, po::include_positional);
  } catch (const po::error& error) {
    core::fail("mpigrad embed: ", error.what());
  }
  for (const char* required : {"config", "checkpoint", "output"}) {
    MPIGRAD_CHECK(values.count(required), "mpigrad embed: --", required, " is required");
  }
  job.checkpoint = values["checkpoint"].as<std::string>();
  job.output = values["output"].as<std::string>();
  job.metrics = values.count("metrics") > 0;
  if (values.count("split")) job.split = values["split"].as<std::string>();
  if (values.count("batch-size")) job.batch_size = values["batch-size"].as<int64_t>();
  MPIGRAD_CHECK(job.batch_size >= 1, "mpigrad embed: --batch-size must be at least 1, got ",
                job.batch_size);
  MPIGRAD_CHECK(job.split == "test" || job.split == "train",
                "mpigrad embed: --split: expected "
                "test or train, got '",
                job.split, "'");
  MPIGRAD_CHECK(std::filesystem::is_regular_file(job.checkpoint), "mpigrad embed: --checkpoint: '",
                job.checkpoint, "' does not exist");
  const std::filesystem::path parent = std::filesystem::path(job.output).parent_path();
  MPIGRAD_CHECK(parent.empty() || std::filesystem::is_directory(parent),
                "mpigrad embed: -o: "
                "directory '",
                parent.string(), "' does not exist");

  const std::string config_file = values["config"].as<std::string>();
  try {
    std::vector<std::string> config_args = {"--config", config_file};
    config_args.insert(config_args.end(), overrides.begin(), overrides.end());
    job.config = parse_train_config(config_args);
  } catch (const core::Error& error) {
    core::fail("mpigrad embed: --config: ", error.what());
  }
  const TrainConfig& config = job.config;
  MPIGRAD_CHECK(config.train.stage != StageKind::Supervised, "mpigrad embed: ", config_file,
                ": [train] stage = supervised has no encoder; embed the checkpoint of a stage = "
                "supcon or classifier run, with its config");
  const std::vector<std::string>& files =
      job.split == "test" ? config.data.test : config.data.train;
  MPIGRAD_CHECK(!files.empty(), "mpigrad embed: --split ", job.split, ": ", config_file,
                " has no [data] ", job.split);
  job.dataset = std::make_shared<data::Hdf5Dataset>(
      files, data::Hdf5DatasetOptions{.fields = {config.data.x, config.data.y}});
  MPIGRAD_CHECK(job.dataset->size() >= ranks, "mpigrad embed: ", job.dataset->describe(), " has ",
                job.dataset->size(), " sample(s), fewer than the ", ranks, " ranks");
  const data::FieldInfo& labels = job.dataset->field(config.data.y);
  MPIGRAD_CHECK(!core::is_floating(labels.dtype) && labels.sample_shape.numel() == 1,
                "mpigrad embed: label field '", config.data.y, "' of ", job.dataset->describe(),
                " must hold one integer per sample");
  // The model as the config builds it; only its encoder is used, loaded from the checkpoint.
  TrainSection train = config.train;
  train.freeze_encoder = false;
  job.model = std::dynamic_pointer_cast<nn::EncoderWithHead>(
      make_stage_model(config.model, train, job.dataset->field(config.data.x).sample_shape,
                       config.data.num_classes));
  load_encoder(*job.model, job.checkpoint, "mpigrad embed: --checkpoint");
  return job;
}

int embed(EmbedJob& job, DistributedManager& manager) {
  const TrainConfig& config = job.config;
  RunInputs inputs;
  inputs.model = job.model;
  inputs.inputs = input_transform(config, job.dataset->field(config.data.x));
  Run run(config, std::move(inputs), manager, RunKind::Evaluate);
  nn::EncoderWithHead& model = *job.model;
  model.eval();
  std::unique_ptr<data::DataLoader> loader = run.evaluation_loader(job.dataset, job.batch_size);
  Embeddings table = gather_embeddings([&model](const core::Tensor& x) { return model.encode(x); },
                                       *loader, config.data.x, config.data.y, manager);
  std::optional<nn::RetrievalMetrics> metrics;
  if (job.metrics) metrics = distributed_retrieval_metrics(table, manager);
  if (manager.is_main_process()) {
    core::hdf5::AtomicFileWriter writer(job.output);
    writer.file().write_tensor("embeddings", table.embeddings);
    writer.file().write_tensor("labels", table.labels);
    writer.file().write_tensor("indices", table.indices);
    writer.file().write_attribute("/", "checkpoint", job.checkpoint);
    writer.file().write_attribute("/", "split", job.split);
    writer.commit();
    std::printf("mpigrad embed: %lld samples of %s, %lld values each, written to %s\n",
                static_cast<long long>(table.embeddings.size(0)), job.dataset->describe().c_str(),
                static_cast<long long>(table.embeddings.size(1)), job.output.c_str());
    if (metrics) {
      std::printf(
          "mpigrad embed: precision@1 %.4f  mAP@R %.4f  (%lld queries with another "
          "sample of their class)\n",
          metrics->precision_at_1, metrics->map_at_r, static_cast<long long>(metrics->queries));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int run_embed_command(int argc, char** argv) {
  EmbedJob job;
  return run_subcommand(
      argc, argv, "mpigrad embed", embed_usage(),
      [&](DistributedManager& manager, const std::vector<std::string>& args) {
        job = check_embed_job(args, manager.world_size());
      },
      [&](DistributedManager& manager) { return embed(job, manager); });
}

}  // namespace mpigrad::launch
