// The timeline's cost: short training runs (TrainingStrategy with DDP, the data loader and the
// optimizer, as `mpigrad train` builds them) in which the timeline is on for every other step,
// repeated; the figure is the ratio of the median step times (on / off) over every step, and
// the cost of one span, on and off, in a tight loop, and what the spans of a step cost as a
// fraction of the step (a figure free of the ratio's run-to-run noise on a loaded machine).
//
//   MPIGRAD_NUM_THREADS=1 mpirun -np 2 --oversubscribe mpigrad-bench-timeline
//       [--model mlp|cnn] [--steps 60] [--repeats 7] [--batch 64] [--json FILE]
//
// Synthetic in-memory data of 1x28x28 images and 10 classes; steps are timed on rank 0 (DDP
// keeps the ranks in step) after 5 warm-up steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/tensor_dataset.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/timeline.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/launch/train/training_strategy.h"

using namespace mpigrad;

namespace {

// n random 1x28x28 float32 images, labels i % 10, in memory.
std::shared_ptr<data::TensorDataset> synthetic_images(int64_t n) {
  core::Generator generator(7);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(i % 10);
  return std::make_shared<data::TensorDataset>(
      std::vector<std::pair<std::string, core::Tensor>>{
          {"x", core::randn({n, 1, 28, 28}, generator)},
          {"y", core::Tensor::from_vector<int64_t>(labels, {n})}},
      "synthetic images");
}

// Turns the timeline on for every other step of one run and times each step (from the end of
// the previous one, so a step's data wait is in it) into the arm it ran in: the two arms share
// the run's load, caches and DDP state, which on a busy machine matters more than the spans.
class AlternatingTimeline final : public launch::Hook {
 public:
  AlternatingTimeline(launch::Timeline* timeline, int64_t warmup)
      : timeline_(timeline), warmup_(warmup) {}
  std::string name() const override { return "alternating_timeline"; }
  launch::HookStages stages() const override { return {launch::HookStage::AfterBatch}; }
  launch::HookPlace place() const override { return {2000}; }  // after every built-in hook
  void on(launch::HookStage stage, launch::TrainingContext& context) override {
    if (stage != launch::HookStage::AfterBatch) return;
    const auto now = std::chrono::steady_clock::now();
    if (context.micro_batches >= warmup_) {
      const double seconds = std::chrono::duration<double>(now - last_).count();
      (context.timeline != nullptr ? on_ : off_).push_back(seconds);
    }
    last_ = now;
    // The next step's arm: on after an off step, off after an on one.
    const bool next_on = context.timeline == nullptr;
    context.timeline = next_on ? timeline_ : nullptr;
    if (context.ddp != nullptr) context.ddp->set_timeline(context.timeline);
  }
  const std::vector<double>& on_seconds() const { return on_; }
  const std::vector<double>& off_seconds() const { return off_; }

 private:
  launch::Timeline* timeline_;
  int64_t warmup_;
  std::chrono::steady_clock::time_point last_;
  std::vector<double> on_, off_;
};

struct Options {
  std::string model = "mlp";
  int64_t steps = 60, repeats = 7, batch = 64;
  std::string json;
};

// One training run with the timeline on every other step; appends its step times to the arms.
void train_once(launch::DistributedManager& manager, const Options& options,
                std::shared_ptr<data::TensorDataset> data, std::vector<double>& off,
                std::vector<double>& on, int64_t* spans) {
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
  launch::Timeline timeline;
  timeline.start(manager.world());
  auto alternating = std::make_shared<AlternatingTimeline>(&timeline, warmup);
  std::vector<std::shared_ptr<launch::Hook>> hooks = {std::make_shared<launch::DDPHook>(),
                                                      alternating};
  launch::TrainingStrategy strategy({model.get()}, {optimizer.get()},
                                    launch::classification_step("x", "y"), nullptr, manager, hooks,
                                    1000, options.steps + warmup);
  strategy.run(loader, nullptr);
  off.insert(off.end(), alternating->off_seconds().begin(), alternating->off_seconds().end());
  on.insert(on.end(), alternating->on_seconds().begin(), alternating->on_seconds().end());
  *spans += int64_t(timeline.events().size());
}

// Nanoseconds per Span (constructor and destructor) on `timeline`.
double span_ns(launch::Timeline* timeline, int64_t count) {
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < count; ++i) {
    launch::Span span(timeline, "x");
    asm volatile("" ::: "memory");  // keep the loop
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() /
         double(count);
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
    if (arg == "--model")
      options.model = value();
    else if (arg == "--steps")
      options.steps = std::atoll(value().c_str());
    else if (arg == "--repeats")
      options.repeats = std::atoll(value().c_str());
    else if (arg == "--batch")
      options.batch = std::atoll(value().c_str());
    else if (arg == "--json")
      options.json = value();
    else {
      std::fprintf(stderr,
                   "usage: %s [--model mlp|cnn] [--steps N] [--repeats N] [--batch N] "
                   "[--json FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    launch::DistributedManager manager = launch::DistributedManager::initialize(&argc, &argv);
    auto data = synthetic_images(options.batch * manager.world_size() * 40);
    std::vector<double> off, on, ratios;
    int64_t spans = 0;
    for (int64_t r = 0; r < options.repeats; ++r) {
      const size_t off_before = off.size(), on_before = on.size();
      train_once(manager, options, data, off, on, &spans);
      ratios.push_back(
          bench::median(std::vector<double>(on.begin() + long(on_before), on.end())) /
          bench::median(std::vector<double>(off.begin() + long(off_before), off.end())));
    }
    const double null_ns = span_ns(nullptr, 10'000'000);
    // Spans into the vector a timeline reserves ahead (2^14 events), the best of 50 fresh
    // timelines: the steady cost of a training run's few spans per step, without the growth of
    // a vector of millions of events that a tight loop would time instead.
    double recorded_ns = 1e30;
    for (int i = 0; i < 50; ++i) {
      launch::Timeline timeline;
      recorded_ns = std::min(recorded_ns, span_ns(&timeline, 16'000));
    }
    if (manager.is_main_process()) {
      bench::Results results;
      results.add_text("model", options.model + " on 1x28x28, batch " +
                                    std::to_string(options.batch) + " per rank, " +
                                    std::to_string(manager.world_size()) + " rank(s)");
      results.add("step_ms_trace_off", 1e3 * bench::median(off), "ms", "median of every off step");
      results.add("step_ms_trace_on", 1e3 * bench::median(on), "ms", "median of every on step");
      results.add("ratio_on_over_off", bench::median(on) / bench::median(off), "x",
                  "target < 1.02");
      results.add("ratio_median_of_runs", bench::median(ratios), "x", "median of per-run ratios");
      results.add("ratio_min_of_runs", *std::min_element(ratios.begin(), ratios.end()), "x", "");
      results.add("ratio_max_of_runs", *std::max_element(ratios.begin(), ratios.end()), "x", "");
      const double spans_per_step = double(spans) / double(on.size());
      results.add("spans_per_traced_step", spans_per_step, "", "rank 0");
      results.add("span_ns_off", null_ns, "ns", "Span on a null timeline");
      results.add("span_ns_on", recorded_ns, "ns", "Span recorded");
      // What the spans themselves cost a step, free of the run-to-run noise of the ratio.
      results.add("span_cost_percent_of_step",
                  100.0 * spans_per_step * recorded_ns * 1e-9 / bench::median(off), "%",
                  "spans per step x span_ns_on / step time off");
      return results.report(options.json, "mpigrad-bench-timeline");
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench-timeline: %s\n", error.what());
    return 1;
  }
  return 0;
}
