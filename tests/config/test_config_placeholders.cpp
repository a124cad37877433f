// Keys holding Boost.Program_options' placeholder syntax ("%canonical_option%"): Boost's error
// message substitutes the key's name for the placeholder, and when the name holds the
// placeholder itself it loops forever (found by fuzz_config). Such keys, in a config text, a
// config file's section or on the command line, are one error naming the key, at once.
// Also from fuzz_config: list items ending in carriage returns, which Boost trims from a line's
// end but not from inside it, keep the resolved config.ini parsing back to itself.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "../error_message.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/config/train_config.h"

using namespace mpigrad;

using test::error_message;

TEST_CASE("a key holding a Boost placeholder is an error, not a hang") {
  for (const std::string& text :
       {std::string("[sched]\nname%canonical_option% = step\n"),
        std::string("[%canonical_option%]\nname = x\n"), std::string("[train]\n%option%\n"),
        std::string("[model]\n%original_token% = 3\n")}) {
    CAPTURE(text);
    const std::string error =
        error_message([&] { launch::parse_config_text(text, "hostile.ini"); });
    CHECK(error.find("hostile.ini") != std::string::npos);
    CHECK(error.find("'%'") != std::string::npos);
  }
  // '%' in a value or a comment is not a key's name and is left to the key's parser.
  CHECK(launch::parse_config_text("[train]\nout_dir = runs/100%canonical_option% # 5%\n", "ok.ini")
            .train.out_dir == "runs/100%canonical_option%");
}

TEST_CASE("the same on the command line and in a config file") {
  CHECK(error_message([] {
          launch::parse_train_config({"--train.%canonical_option%=1"});
        }).find("'%'") != std::string::npos);
  const std::string path = "config_placeholders_test.ini";
  std::ofstream(path) << "[data]\ntrain = a.h5\n[sched]\nname%canonical_option% = step\n";
  const std::string error = error_message([&] { launch::parse_train_config({"--config", path}); });
  CHECK(error.find(path) != std::string::npos);
  CHECK(error.find("'%'") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("list items lose the whitespace Boost trims, so config.ini round-trips") {
  const std::string text = "[data]\ntrain = a.h5\r\r, b.h5\r\n";
  const launch::TrainConfig config = launch::parse_config_text(text, "crlf.ini");
  CHECK(config.data.train == std::vector<std::string>{"a.h5", "b.h5"});
  const std::string resolved = config.resolved_text();
  CHECK(launch::parse_config_text(resolved, "resolved").resolved_text() == resolved);
}
