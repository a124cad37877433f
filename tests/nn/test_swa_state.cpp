// SWAAverager's state_dict round trip: what CheckpointHook saves for in-training SWA and gives
// back on resume.
#include <doctest/doctest.h>

#include "mpigrad/core/error.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/weight_averaging.h"

using namespace mpigrad;

TEST_CASE("SWAAverager: state_dict carries the count even empty, and round-trips the average") {
  core::Generator generator(1);
  nn::Linear a(2, 2, generator), b(2, 2, generator);
  nn::SWAAverager empty;
  nn::StateDict none = empty.state_dict();
  CHECK_FALSE(none.empty());  // the count alone, so a checkpoint always holds the hook
  CHECK(none.scalar("count") == 0);

  nn::SWAAverager averager;
  averager.update(a);
  averager.update(b);
  nn::SWAAverager restored;
  restored.load_state_dict(averager.state_dict());
  CHECK(restored.count() == 2);
  nn::Linear c(2, 2, generator);
  restored.update(c);
  averager.update(c);
  const auto expected = averager.average().at("weight").to_vector<float>();
  const auto got = restored.average().at("weight").to_vector<float>();
  CHECK(got == expected);

  restored.load_state_dict(none);
  CHECK(restored.count() == 0);
  nn::StateDict broken;
  broken.set_scalar("count", 3);
  CHECK_THROWS_WITH_AS(restored.load_state_dict(broken), doctest::Contains("no averaged entries"),
                       core::Error);
}
