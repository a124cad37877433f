// The per-op profile (launch/observe/op_profile.h) on synthetic spans with known times: rows by
// name, kind and op type (whatever the name's address), calls, self and total time with nesting,
// FLOPs carried to the spans around them and GFLOP/s; the table's order, row limit, shares and
// total line; the JSON; and the spans it writes to a timeline, nested and categorized.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "json_reader.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/launch/observe/op_profile.h"
#include "mpigrad/launch/observe/timeline.h"

using namespace mpigrad;
using core::ProfileKind;
using test::JsonValue;

namespace {

// Two steps of a tiny model, in ns: forward holds an ONNX Conv node (holding the convolution
// kernel, 4000 FLOPs) and an add; backward holds Conv2dBackward (two kernels of 4000 FLOPs);
// the optimizer step holds SGD.step. Both steps' "add" names sit at different addresses.
void record_two_steps(core::ProfileSession& session) {
  static const std::string first_add = "add";
  static const std::string second_add = std::string("ad") + "d";
  for (int step = 0; step < 2; ++step) {
    const int64_t t = step * 1000;
    session.begin("forward", ProfileKind::Phase, nullptr, 0, t + 0);
    session.begin("/features.0/Conv", ProfileKind::OnnxNode, "Conv", 0, t + 10);
    session.begin("conv2d_forward", ProfileKind::Kernel, nullptr, 4000, t + 20);
    session.end(t + 60);
    session.end(t + 70);
    session.begin((step == 0 ? first_add : second_add).c_str(), ProfileKind::Op, nullptr, 0,
                  t + 80);
    session.end(t + 90);
    session.end(t + 100);
    session.begin("backward", ProfileKind::Phase, nullptr, 0, t + 200);
    session.begin("Conv2dBackward", ProfileKind::Backward, nullptr, 0, t + 210);
    session.begin("conv2d_backward_filter", ProfileKind::Kernel, nullptr, 4000, t + 220);
    session.end(t + 300);
    session.begin("conv2d_backward_data", ProfileKind::Kernel, nullptr, 4000, t + 300);
    session.end(t + 380);
    session.end(t + 400);
    session.end(t + 420);
    session.begin("optimizer step", ProfileKind::Phase, nullptr, 0, t + 500);
    session.begin("SGD.step", ProfileKind::Optimizer, nullptr, 0, t + 510);
    session.end(t + 590);
    session.end(t + 600);
  }
}

const launch::OpProfileRow& row_named(const launch::OpProfileReport& report,
                                      const std::string& name) {
  for (const launch::OpProfileRow& row : report.rows) {
    if (row.name == name) return row;
  }
  FAIL("no row named ", name);
  return report.rows.front();
}

launch::OpProfileReport synthetic_report() {
  launch::OpProfile profile;
  {
    core::ProfileSession session(profile);
    record_two_steps(session);
  }
  launch::OpProfileReport report;
  report.rows = profile.rows();
  report.wall_ns = 2000;
  report.steps = 2;
  CHECK(profile.spans() == 20);
  return report;
}

}  // namespace

TEST_CASE("op profile: rows aggregate calls, self and total time, FLOPs and GFLOP/s") {
  const launch::OpProfileReport report = synthetic_report();
  CHECK(report.rows.size() == 10);  // both "add"s are one row

  const auto& conv = row_named(report, "/features.0/Conv");
  CHECK(conv.type() == "onnx:Conv");
  CHECK(conv.calls == 2);
  CHECK(conv.total_ns == 2 * 60);
  CHECK(conv.self_ns == 2 * 20);  // less the kernel's 40 each time
  CHECK(conv.flops == 2 * 4000);
  CHECK(conv.gflops_per_second() == doctest::Approx(8000.0 / 120.0));

  const auto& kernel = row_named(report, "conv2d_forward");
  CHECK(kernel.type() == "kernel");
  CHECK(kernel.self_ns == 80);
  CHECK(kernel.total_ns == 80);
  CHECK(kernel.gflops_per_second() == doctest::Approx(8000.0 / 80.0));

  const auto& add = row_named(report, "add");
  CHECK(add.calls == 2);
  CHECK(add.self_ns == 20);
  CHECK(add.flops == 0);
  CHECK(add.gflops_per_second() == 0);

  const auto& node = row_named(report, "Conv2dBackward");
  CHECK(node.type() == "backward");
  CHECK(node.total_ns == 2 * 190);
  CHECK(node.self_ns == 2 * 30);
  CHECK(node.flops == 2 * 8000);

  const auto& forward = row_named(report, "forward");
  CHECK(forward.type() == "phase");
  CHECK(forward.total_ns == 200);
  CHECK(forward.self_ns == 2 * (100 - 60 - 10));
  CHECK(forward.flops == 8000);
  const auto& backward = row_named(report, "backward");
  CHECK(backward.self_ns == 2 * (220 - 190));
  CHECK(row_named(report, "SGD.step").type() == "optimizer");

  // Self times add up to the time inside any span: the three stages' totals.
  int64_t self_total = 0;
  for (const auto& row : report.rows) self_total += row.self_ns;
  CHECK(self_total == 2 * (100 + 220 + 100));
}

TEST_CASE("op profile: the table is sorted by self time, limited, with shares and a total") {
  const launch::OpProfileReport report = synthetic_report();
  launch::OpProfileTableOptions options;
  options.max_rows = 3;
  const std::string table = launch::format_op_profile(report, options);
  INFO(table);
  CHECK(table.find("mpigrad profile (rank 0): 0.000 s profiled, 2 optimizer steps") == 0);
  CHECK(table.find("3 of 10 rows, by self time") != std::string::npos);
  // Self: conv2d_backward_filter 160, conv2d_backward_data 160, SGD.step 160, then
  // conv2d_forward 80 (cut by the limit); equal self times keep first-seen order.
  const size_t filter = table.find("conv2d_backward_filter");
  const size_t data = table.find("conv2d_backward_data");
  const size_t sgd = table.find("SGD.step");
  REQUIRE(filter != std::string::npos);
  REQUIRE(data != std::string::npos);
  REQUIRE(sgd != std::string::npos);
  CHECK(filter < data);
  CHECK(data < sgd);
  CHECK(table.find("conv2d_forward") == std::string::npos);
  // 160 ns of 2000: 8%; its GFLOP/s 8000 / 160.
  CHECK(table.find("8.00%") != std::string::npos);
  CHECK(table.find("50.00") != std::string::npos);
  CHECK(table.find("self time total: 0.000 s of 0.000 s profiled (42.00%)") != std::string::npos);

  // Unlimited: every row; a long name keeps its end.
  launch::OpProfileReport named = report;
  named.rows.front().name = "/a/very/long/path/of/modules/that/goes/on/and/on/layer4/conv2/Conv";
  const std::string full = launch::format_op_profile(named, {.max_rows = 100, .rank = 0});
  CHECK(full.find("10 of 10 rows") != std::string::npos);
  CHECK(full.find("...") != std::string::npos);
  CHECK(full.find("layer4/conv2/Conv") != std::string::npos);
  CHECK(full.find("onnx:Conv") != std::string::npos);
}

TEST_CASE("op profile: the JSON holds every row") {
  const launch::OpProfileReport report = synthetic_report();
  const JsonValue document = test::parse_json(launch::op_profile_json(report));
  CHECK(document.find("steps")->number == 2);
  CHECK(document.find("wall_s")->number == doctest::Approx(2e-6));
  const JsonValue& rows = *document.find("rows");
  REQUIRE(rows.items.size() == 10);
  bool found_conv = false;
  for (const JsonValue& row : rows.items) {
    if (row.find("name")->text != "/features.0/Conv") continue;
    found_conv = true;
    CHECK(row.find("type")->text == "onnx:Conv");
    CHECK(row.find("op_type")->text == "Conv");
    CHECK(row.find("calls")->number == 2);
    CHECK(row.find("self_s")->number == doctest::Approx(40e-9));
    CHECK(row.find("total_share")->number == doctest::Approx(120.0 / 2000.0));
    CHECK(row.find("flops")->number == 8000);
  }
  CHECK(found_conv);
}

TEST_CASE("op profile: spans other than the loop's stages go to the timeline, nested") {
  launch::Timeline timeline;
  launch::OpProfile profile(&timeline);
  {
    core::ProfileSession session(profile);
    record_two_steps(session);
  }
  // 20 spans, less the 6 stages the loop records itself.
  REQUIRE(timeline.events().size() == 14);
  const std::string rendered = timeline.render(0);
  const std::vector<JsonValue> events = test::parse_json("[" + rendered + "]").items;
  bool saw_node = false, saw_kernel = false;
  for (const JsonValue& event : events) {
    if (event.find("ph")->text != "X") continue;
    const std::string name = event.find("name")->text;
    CHECK(name != "forward");
    if (name == "/features.0/Conv") {
      saw_node = true;
      CHECK(event.find("cat")->text == "onnx");
      CHECK(event.find("args")->find("op_type")->text == "Conv");
      CHECK(event.find("tid")->number == 1);
    }
    if (name == "conv2d_forward") {
      saw_kernel = true;
      CHECK(event.find("cat")->text == "kernel");
      CHECK(event.find("args")->find("flops")->number == 4000);
    }
  }
  CHECK(saw_node);
  CHECK(saw_kernel);
}

TEST_CASE("op profiler: a session from construction to finish, with the time it paused") {
  launch::OpProfiler profiler;
  CHECK(core::ProfileSession::current() != nullptr);
  { core::ProfileSpan span("recorded"); }
  {
    core::ProfilePause pause;
    core::ProfileSpan span("not recorded");
  }
  const launch::OpProfileReport report = profiler.finish(7);
  CHECK(core::ProfileSession::current() == nullptr);
  CHECK(report.steps == 7);
  REQUIRE(report.rows.size() == 1);
  CHECK(report.rows[0].name == "recorded");
  CHECK(report.rows[0].calls == 1);
  CHECK(report.wall_ns >= report.rows[0].total_ns);
  CHECK(report.paused_ns >= 0);
  CHECK(profiler.finish(7).rows.size() == 1);  // a second finish gives the same report
}
