// The timeline's cost: the same short training run (TrainingStrategy with DDP, the data loader
// and the optimizer, as `mpigrad train` builds them) with the timeline off and on, alternating
// in one process, repeated; the figure is the ratio of the median step times (on / off), and
// the cost of one span, on and off, in a tight loop.
//
//   MPIGRAD_NUM_THREADS=1 mpirun -np 2 --oversubscribe mpigrad-bench-timeline
//       [--model mlp|cnn] [--steps 60] [--repeats 7] [--batch 64] [--json FILE]
//
// Synthetic in-memory data of 1x28x28 images and 10 classes; the step time is taken between the
// end of the warm-up steps and the end of the run, on rank 0 (DDP keeps the ranks in step).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/launch/distributed_manager.h"
#include "mpigrad/launch/trace/timeline.h"
#include "mpigrad/launch/train_setup.h"
#include "mpigrad/launch/training_hooks.h"
#include "mpigrad/launch/training_steps.h"
#include "mpigrad/launch/training_strategy.h"

using namespace mpigrad;

namespace {

class SyntheticImages final : public data::Dataset {
 public:
  explicit SyntheticImages(int64_t n) {
    core::Generator generator(7);
    x_ = core::randn({n, 1, 28, 28}, generator);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < n; ++i) labels.push_back(i % 10);
    y_ = core::Tensor::from_vector<int64_t>(labels, {n});
    fields_ = {{"x", core::kFloat32, {1, 28, 28}}, {"y", core::kInt64, {}}};
  }
  int64_t size() const override { return x_.size(0); }
  const std::vector<data::FieldInfo>& fields() const override { return fields_; }
  data::Batch get_batch(std::span<const int64_t> indices) const override {
    std::vector<int64_t> picked(indices.begin(), indices.end());
    core::Tensor index = core::Tensor::from_vector<int64_t>(picked, {int64_t(picked.size())});
    data::Batch batch;
    batch.indices = picked;
    batch.set("x", core::index_select(x_, 0, index));
    batch.set("y", core::index_select(y_, 0, index));
    return batch;
  }
  std::string describe() const override { return "synthetic images"; }

 private:
  core::Tensor x_, y_;
  std::vector<data::FieldInfo> fields_;
};

// Seconds per optimizer step after the first `warmup` steps.
class StepClock final : public launch::Hook {
 public:
  explicit StepClock(int64_t warmup) : warmup_(warmup) {}
  std::string name() const override { return "step_clock"; }
  void on(launch::HookStage stage, launch::TrainingContext& context) override {
    if (stage == launch::HookStage::AfterOptimizerStep && context.step == warmup_) {
      start_ = std::chrono::steady_clock::now();
    } else if (stage == launch::HookStage::AfterTraining) {
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() /
                 double(context.step - warmup_);
    }
  }
  double seconds_per_step() const { return seconds_; }

 private:
  int64_t warmup_;
  std::chrono::steady_clock::time_point start_;
  double seconds_ = 0;
};

struct Options {
  std::string model = "mlp";
  int64_t steps = 60, repeats = 7, batch = 64;
  std::string json;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// One training run; returns seconds per step (rank 0's; every rank's agree through DDP).
double train_once(launch::DistributedManager& manager, const Options& options,
                  std::shared_ptr<SyntheticImages> data, bool traced, int64_t* spans) {
  launch::ModelSection model_section;
  model_section.name = options.model == "cnn" ? launch::ModelKind::Cnn : launch::ModelKind::Mlp;
  if (options.model == "cnn") model_section.channels = {8, 16};
  std::shared_ptr<nn::Module> model = launch::make_model(model_section, {1, 28, 28}, 10, 1);
  launch::OptimSection optim;
  std::unique_ptr<nn::Optimizer> optimizer = launch::make_optimizer(optim, *model);
  data::DataLoaderOptions loader_options;
  loader_options.batch_size = options.batch;
  loader_options.shuffle = true;
  loader_options.num_workers = 1;
  data::DataLoader loader(data, loader_options);
  const int64_t warmup = 5;
  auto clock = std::make_shared<StepClock>(warmup);
  std::vector<std::shared_ptr<launch::Hook>> hooks = {std::make_shared<launch::DDPHook>(), clock};
  launch::TrainingStrategy strategy({model.get()}, {optimizer.get()},
                                    launch::classification_step("x", "y"), nullptr, manager,
                                    hooks, 1000, options.steps + warmup);
  std::unique_ptr<launch::Timeline> timeline;
  if (traced) {
    timeline = std::make_unique<launch::Timeline>();
    timeline->start(manager.world());
    strategy.context().timeline = timeline.get();
  }
  manager.world().barrier();
  strategy.run(loader, nullptr);
  if (timeline) *spans = int64_t(timeline->events().size());
  return clock->seconds_per_step();
}

// Nanoseconds per Span (constructor and destructor) on `timeline`.
double span_ns(launch::Timeline* timeline, int64_t count) {
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < count; ++i) {
    launch::Span span(timeline, "x");
    asm volatile("" ::: "memory");  // keep the loop
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() / double(count);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (arg == "--model") options.model = value();
    else if (arg == "--steps") options.steps = std::atoll(value().c_str());
    else if (arg == "--repeats") options.repeats = std::atoll(value().c_str());
    else if (arg == "--batch") options.batch = std::atoll(value().c_str());
    else if (arg == "--json") options.json = value();
    else {
      std::fprintf(stderr, "usage: %s [--model mlp|cnn] [--steps N] [--repeats N] [--batch N] "
                   "[--json FILE]\n", argv[0]);
      return 2;
    }
  }
  try {
    launch::DistributedManager manager = launch::DistributedManager::initialize(&argc, &argv);
    auto data = std::make_shared<SyntheticImages>(options.batch * manager.world_size() * 40);
    std::vector<double> off, on, ratios;
    int64_t spans = 0;
    for (int64_t r = 0; r < options.repeats; ++r) {
      // Alternate which arm goes first, so neither always runs on a warmer machine.
      const bool on_first = r % 2 == 1;
      double a = train_once(manager, options, data, on_first, &spans);
      double b = train_once(manager, options, data, !on_first, &spans);
      off.push_back(on_first ? b : a);
      on.push_back(on_first ? a : b);
      ratios.push_back(on.back() / off.back());
    }
    launch::Timeline timeline(size_t(1) << 22);
    const double null_ns = span_ns(nullptr, 10'000'000);
    const double recorded_ns = span_ns(&timeline, 2'000'000);
    if (manager.is_main_process()) {
      bench::Results results;
      results.add_text("model", options.model + " on 1x28x28, batch " +
                                    std::to_string(options.batch) + " per rank, " +
                                    std::to_string(manager.world_size()) + " rank(s)");
      results.add("step_ms_trace_off", 1e3 * median(off), "ms", "median of the repeats");
      results.add("step_ms_trace_on", 1e3 * median(on), "ms", "median of the repeats");
      results.add("ratio_on_over_off", median(on) / median(off), "x", "target < 1.02");
      results.add("paired_ratio_median", median(ratios), "x", "median of per-repeat ratios");
      results.add("spans_per_step", double(spans) / double(options.steps + 5), "",
                  "rank 0, one traced run");
      results.add("span_ns_off", null_ns, "ns", "Span on a null timeline");
      results.add("span_ns_on", recorded_ns, "ns", "Span recorded");
      results.print();
      if (!options.json.empty() && !results.write_json(options.json)) {
        std::fprintf(stderr, "cannot write %s\n", options.json.c_str());
        return 1;
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench-timeline: %s\n", error.what());
    return 1;
  }
  return 0;
}
