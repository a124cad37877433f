// The profiler's recording point (core/profiler.h): nothing is recorded, and no FLOP count or
// name is computed, while no session records on the thread; nesting gives self time and carries
// FLOPs outwards; and the instrumented ops, kernels and autograd nodes record what they did.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/core/tensor.h"

namespace {

using namespace mpigrad::core;  // NOLINT

// Keeps every event, with its names copied.
struct Recorded {
  std::string name, detail;
  ProfileKind kind;
  int32_t depth;
  int64_t begin_ns, end_ns, self_ns;
  double flops;
};

class KeepAll final : public ProfileSink {
 public:
  void record(const ProfileEvent& event) noexcept override {
    events.push_back({event.name, event.detail != nullptr ? event.detail : "", event.kind,
                      event.depth, event.begin_ns, event.end_ns, event.self_ns, event.flops});
  }
  std::vector<Recorded> events;

  std::vector<const Recorded*> named(const std::string& name) const {
    std::vector<const Recorded*> found;
    for (const Recorded& event : events) {
      if (event.name == name) found.push_back(&event);
    }
    return found;
  }
};

}  // namespace

TEST_CASE("profiler: off, spans record nothing and compute no FLOPs or names") {
  REQUIRE_FALSE(profiling_anywhere());
  int flop_counts = 0, names_made = 0;
  {
    ProfileSpan plain("plain");
    ProfileSpan counted("counted", ProfileKind::Kernel, [&] { return double(++flop_counts); });
    ProfileSpan named(ProfileKind::Optimizer, [&] {
      ++names_made;
      return std::string("made");
    });
    Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).set_requires_grad();
    sum(matmul(a, a)).backward();
  }
  CHECK(flop_counts == 0);
  CHECK(names_made == 0);
  CHECK(ProfileSession::current() == nullptr);

  // A session on another thread records none of this thread's spans.
  KeepAll other;
  std::atomic<bool> started{false}, stop{false};
  std::thread recorder([&] {
    ProfileSession session(other);
    started = true;
    while (!stop) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  CHECK(profiling_anywhere());
  {
    ProfileSpan here("here", ProfileKind::Kernel, [&] { return double(++flop_counts); });
    (void)add(ones({4}), ones({4}));
  }
  stop = true;
  recorder.join();
  CHECK(flop_counts == 0);
  CHECK(other.events.empty());
  CHECK_FALSE(profiling_anywhere());
}

TEST_CASE("profiler: nested spans give self time, depth and FLOPs carried outwards") {
  KeepAll sink;
  {
    ProfileSession session(sink);
    // forward [0, 100] > node [10, 60] > kernel [20, 50] with 3000 FLOPs; add [65, 70].
    session.begin("forward", ProfileKind::Phase, nullptr, 0, 0);
    session.begin("/conv/Conv", ProfileKind::OnnxNode, "Conv", 0, 10);
    session.begin("conv2d_forward", ProfileKind::Kernel, nullptr, 3000, 20);
    session.end(50);
    session.end(60);
    session.begin("add", ProfileKind::Op, nullptr, 0, 65);
    session.end(70);
    session.end(100);
    CHECK(session.open_spans() == 0);
  }
  REQUIRE(sink.events.size() == 4);
  // Children close first.
  const Recorded& kernel = sink.events[0];
  const Recorded& node = sink.events[1];
  const Recorded& add_op = sink.events[2];
  const Recorded& forward = sink.events[3];
  CHECK(kernel.name == "conv2d_forward");
  CHECK(kernel.depth == 2);
  CHECK(kernel.self_ns == 30);
  CHECK(kernel.flops == 3000);
  CHECK(node.name == "/conv/Conv");
  CHECK(node.detail == "Conv");
  CHECK(node.depth == 1);
  CHECK(node.end_ns - node.begin_ns == 50);
  CHECK(node.self_ns == 20);
  CHECK(node.flops == 3000);
  CHECK(add_op.self_ns == 5);
  CHECK(add_op.flops == 0);
  CHECK(forward.depth == 0);
  CHECK(forward.self_ns == 100 - 50 - 5);
  CHECK(forward.flops == 3000);
}

TEST_CASE("profiler: one session per thread, and paused spans are not recorded") {
  KeepAll sink;
  ProfileSession session(sink);
  CHECK(ProfileSession::current() == &session);
  KeepAll second;
  CHECK_THROWS_WITH_AS(ProfileSession{second}, doctest::Contains("already records"), Error);
  int flop_counts = 0;
  {
    ProfilePause pause;
    CHECK(session.paused());
    ProfileSpan skipped("skipped", ProfileKind::Kernel, [&] { return double(++flop_counts); });
  }
  CHECK_FALSE(session.paused());
  CHECK(session.paused_ns() >= 0);
  { ProfileSpan kept("kept"); }
  CHECK(flop_counts == 0);
  REQUIRE(sink.events.size() == 1);
  CHECK(sink.events[0].name == "kept");
  CHECK(sink.events[0].end_ns >= sink.events[0].begin_ns);
}

TEST_CASE("profiler: interned names keep one address per text") {
  const std::string a = "SGD.step", b = std::string("SGD") + ".step";
  const char* first = intern_profile_name(a);
  CHECK(first == intern_profile_name(b));
  CHECK(std::strcmp(first, "SGD.step") == 0);
  CHECK(first != intern_profile_name("Adam.step"));
}

TEST_CASE("profiler: ops, the GEMM's FLOPs and the backward nodes are recorded") {
  KeepAll sink;
  const int64_t m = 3, k = 4, n = 5;
  Tensor a = ones({m, k}).set_requires_grad();
  Tensor b = ones({k, n}).set_requires_grad();
  {
    ProfileSession session(sink);
    Tensor loss = sum(matmul(a, b));
    loss.backward();
  }
  // Forward: the matmul op holds the GEMM kernel, whose FLOPs it carries.
  const auto matmuls = sink.named("matmul");
  REQUIRE(matmuls.size() == 1);
  CHECK(matmuls[0]->kind == ProfileKind::Op);
  CHECK(matmuls[0]->flops == doctest::Approx(2.0 * m * n * k));
  const auto gemms = sink.named("gemm");
  REQUIRE(gemms.size() == 3);  // forward, then grad_b and grad_a in backward
  for (const Recorded* gemm : gemms) {
    CHECK(gemm->kind == ProfileKind::Kernel);
    CHECK(gemm->flops == doctest::Approx(2.0 * m * n * k));
    CHECK(gemm->self_ns <= gemm->end_ns - gemm->begin_ns);
  }
  // Backward: one span per node, named by the node; MatmulBackward carries both GEMMs.
  const auto matmul_backward = sink.named("MatmulBackward");
  REQUIRE(matmul_backward.size() == 1);
  CHECK(matmul_backward[0]->kind == ProfileKind::Backward);
  CHECK(matmul_backward[0]->flops == doctest::Approx(4.0 * m * n * k));
  CHECK(sink.named("SumBackward").size() == 1);
  CHECK(sink.named("AccumulateGrad").size() == 2);
  CHECK(sink.named("sum").size() == 1);
  // Every span lies within the spans around it: self time is never negative.
  for (const Recorded& event : sink.events) {
    CHECK(event.self_ns >= 0);
    CHECK(event.self_ns <= event.end_ns - event.begin_ns);
  }
}
