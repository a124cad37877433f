// run_isolated: the child's result and errors come back; its crash, early exit or hang becomes one
// core::Error naming the context and the last step it reported.
#include <doctest/doctest.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "../error_message.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/isolated.h"

using namespace mpigrad;
using namespace std::chrono_literals;

using test::error_message;

TEST_CASE("run_isolated returns the child's result, large ones whole") {
  CHECK(core::run_isolated([](core::IsolatedProgress&) { return std::string("done"); }, 10s, "t") ==
        "done");
  // Over the pipe's buffer, with progress frames before it.
  const std::string big(1 << 20, 'x');
  CHECK(core::run_isolated(
            [&](core::IsolatedProgress& progress) {
              for (int i = 0; i < 100; ++i) progress.at("step " + std::to_string(i));
              return big;
            },
            10s, "t") == big);
  CHECK(
      core::run_isolated([](core::IsolatedProgress&) { return std::string(); }, 10s, "t").empty());
}

TEST_CASE("run_isolated re-throws the child's error with its message") {
  CHECK(error_message([] {
          core::run_isolated(
              [](core::IsolatedProgress&) -> std::string { core::fail("bad field x"); }, 10s,
              "inspect a.h5");
        }) == "bad field x");
  CHECK(error_message([] {
          core::run_isolated(
              [](core::IsolatedProgress&) -> std::string { throw std::runtime_error("boom"); }, 10s,
              "ctx");
        }) == "unexpected error: boom");
}

TEST_CASE("a child that crashes or exits early is one error with its last step") {
  const std::string crashed = error_message([] {
    core::run_isolated(
        [](core::IsolatedProgress& progress) -> std::string {
          progress.at("reading attribute @units");
          std::raise(SIGABRT);
          return "unreachable";
        },
        10s, "inspect a.h5");
  });
  // Under AddressSanitizer the child reports the signal and exits with a status instead.
  CHECK(crashed.starts_with("inspect a.h5 crashed ("));
  CHECK(crashed.ends_with(", while reading attribute @units"));

  const std::string exited = error_message([] {
    core::run_isolated([](core::IsolatedProgress&) -> std::string { ::_exit(3); }, 10s, "ctx");
  });
  CHECK(exited == "ctx crashed (it exited with status 3 before its result)");
}

TEST_CASE("a child that hangs is killed at the timeout") {
  const std::string hung = error_message([] {
    core::run_isolated(
        [](core::IsolatedProgress& progress) -> std::string {
          progress.at("decoding the global heap");
          for (;;) ::pause();
        },
        200ms, "inspect b.h5");
  });
  CHECK(hung ==
        "inspect b.h5 did not finish within 0.2 s (killed), while decoding the global heap");
}

TEST_CASE("the child's crash ends it even where the host handles the signal") {
  // A host handler that returns (as a test framework's or a runtime's may) would let the crashed
  // child run on; the child resets the crash signals to their default action.
  auto previous = std::signal(SIGABRT, [](int) {});
  const std::string crashed = error_message([] {
    core::run_isolated(
        [](core::IsolatedProgress&) -> std::string {
          std::raise(SIGABRT);
          return "ran on after the crash";
        },
        10s, "ctx");
  });
  std::signal(SIGABRT, previous);
  CHECK(crashed == "ctx crashed (signal 6, Aborted)");
}
