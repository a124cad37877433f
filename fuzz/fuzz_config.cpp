// fuzz target fuzz_config: the input is the text of a `mpigrad train` INI config. It is parsed
// and checked as the program does (launch::parse_config_text over every key, then the schedule
// and the model it describes), and the resolved config.ini that every run writes must parse
// back to itself. core::Error is the expected outcome for a bad config; anything else (a crash,
// undefined behaviour, a leak, another exception, a resolved text that does not round-trip) is
// a finding. Nothing touches the filesystem: the text is parsed from memory.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"

namespace {

using namespace mpigrad;

// The model is built only when its widths are small, or so large that the size checks must
// refuse them before allocating: widths in between are valid and only cost memory and time.
bool buildable(const std::vector<int64_t>& widths) {
  if (widths.size() > 6) return false;
  for (int64_t width : widths) {
    if (width > 64 && width < (int64_t(1) << 31)) return false;
  }
  return true;
}

core::Shape input_shape_of(const launch::ModelSection& model) {
  bool small = !model.input_shape.empty() && model.input_shape.size() <= 4;
  for (int64_t extent : model.input_shape) small = small && extent >= 0 && extent <= 32;
  return small ? core::Shape(model.input_shape) : core::Shape({1, 8, 8});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string text(reinterpret_cast<const char*>(bytes), size);
  try {
    const launch::TrainConfig config = launch::parse_config_text(text, "fuzz.ini");
    const std::string resolved = config.resolved_text();
    const std::string again =
        launch::parse_config_text(resolved, "resolved config.ini").resolved_text();
    if (again != resolved) {
      std::fprintf(stderr, "fuzz_config: the resolved config does not round-trip:\n%s\n---\n%s\n",
                   resolved.c_str(), again.c_str());
      std::abort();
    }
    launch::check_schedule(config.sched, config.train.max_steps);
    const launch::ModelSection& model = config.model;
    const int64_t outputs = config.data.num_classes;
    if (buildable(model.hidden) && buildable(model.channels) && model.kernel_size <= 7 &&
        (outputs <= 64 || outputs >= (int64_t(1) << 31))) {
      launch::make_model(model, input_shape_of(model), outputs, config.train.seed);
    }
  } catch (const core::Error&) {
  }
  return 0;
}
