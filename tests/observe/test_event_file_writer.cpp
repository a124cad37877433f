// TensorBoard's event files: CRC32C on its standard check value, TFRecord frames that decode
// back with both CRCs checked (and fail on a flipped byte or a truncated frame), Event messages
// that an independent protobuf reader decodes to the same wall time, step, tags and values, and
// EventFileWriter's file: its name, its first (file-version) record, and a clear error when the
// file cannot be made.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "event_decoder.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/observe/event_file_writer.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/hooks/logging_hook.h"

using namespace mpigrad;
namespace fs = std::filesystem;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
fs::path scratch(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("mpigrad-tb-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}
}  // namespace

TEST_CASE("CRC32C is the Castagnoli CRC: the standard check value, and TFRecord's mask") {
  CHECK(launch::crc32c("123456789") == 0xE3069283u);
  CHECK(launch::crc32c("") == 0u);
  // 32 zero bytes: the RFC 3720 (iSCSI) test vector.
  CHECK(launch::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  const uint32_t crc = launch::crc32c("123456789");
  CHECK(launch::masked_crc32c("123456789") == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("TFRecord frames round-trip, and a damaged frame is an error naming its offset") {
  std::string file;
  const std::vector<std::string> payloads = {"first", std::string(300, 'x'), ""};
  for (const auto& payload : payloads) launch::append_tfrecord(file, payload);
  CHECK(file.size() == 3 * 16 + 5 + 300);
  CHECK(launch::read_tfrecords(file, "mem") == payloads);
  // The length is little-endian uint64 at the start of the frame.
  CHECK(uint8_t(file[0]) == 5);
  CHECK(file.substr(1, 7) == std::string(7, '\0'));

  std::string flipped = file;
  flipped[12] ^= 1;  // a byte of the first payload
  CHECK_THROWS_WITH_AS(launch::read_tfrecords(flipped, "mem"), doctest::Contains("bad data CRC"),
                       core::Error);
  std::string bad_length = file;
  bad_length[21 + 1] ^= 1;  // the second frame's length
  CHECK_THROWS_WITH_AS(launch::read_tfrecords(bad_length, "mem"),
                       doctest::Contains("bad length CRC at byte 21"), core::Error);
  CHECK_THROWS_WITH_AS(launch::read_tfrecords(file.substr(0, file.size() - 1), "mem"),
                       doctest::Contains("mem"), core::Error);
}

TEST_CASE("Event messages decode to what was encoded") {
  const auto version = test::decode_event(launch::encode_file_version_event(1234.5));
  CHECK(version.wall_time == 1234.5);
  CHECK(version.step == 0);
  CHECK(version.file_version == "brain.Event:2");
  CHECK(version.values.empty());

  const auto event = test::decode_event(launch::encode_scalars_event(
      1.75e9, 300, {{"train/loss", 0.1234567891}, {"test/accuracy", 1.0}, {"train/lr", 5e-5}}));
  CHECK(event.wall_time == 1.75e9);
  CHECK(event.step == 300);
  REQUIRE(event.values.size() == 3);
  CHECK(event.values[0].first == "train/loss");
  CHECK(event.values[0].second == float(0.1234567891));
  CHECK(event.values[1].first == "test/accuracy");
  CHECK(event.values[1].second == 1.0f);
  CHECK(event.values[2].second == float(5e-5));
  // Steps past 2^31, and negative ones (ten-byte varints), survive.
  CHECK(test::decode_event(launch::encode_scalars_event(0, int64_t(1) << 40, {})).step ==
        int64_t(1) << 40);
  CHECK(test::decode_event(launch::encode_scalars_event(0, -3, {})).step == -3);
  // A non-finite value is kept (TensorBoard draws it as such).
  const auto nan = test::decode_event(launch::encode_scalars_event(
      0, 1, {{"train/loss", std::numeric_limits<double>::quiet_NaN()}}));
  CHECK(nan.values.at(0).second != nan.values.at(0).second);
}

TEST_CASE("EventFileWriter writes TensorBoard's file name, the version record, then scalars") {
  const fs::path dir = scratch("writer");
  std::string path;
  {
    launch::EventFileWriter writer((dir / "tb").string());
    path = writer.path();
    writer.add_scalars(5, {{"train/loss", 2.5}, {"train/lr", 0.1}});
    writer.add_scalars(10, {{"train/loss", 1.5}});
    writer.add_scalars(11, {});  // nothing to write
    writer.flush();
    writer.close();
  }
  const std::string name = fs::path(path).filename().string();
  CHECK(name.starts_with("events.out.tfevents."));
  CHECK(fs::path(path).parent_path() == dir / "tb");
  const auto records = launch::read_tfrecords(read_all(path), path);
  REQUIRE(records.size() == 3);
  CHECK(test::decode_event(records[0]).file_version == "brain.Event:2");
  const auto first = test::decode_event(records[1]);
  CHECK(first.step == 5);
  CHECK(first.wall_time > 1.6e9);  // seconds since 1970
  REQUIRE(first.values.size() == 2);
  CHECK(first.values[1] == std::pair<std::string, float>{"train/lr", 0.1f});
  CHECK(test::decode_event(records[2]).values.at(0).second == 1.5f);

  // Two writers in one second get two files.
  launch::EventFileWriter a(dir.string()), b(dir.string());
  CHECK(a.path() != b.path());
  fs::remove_all(dir);
}

TEST_CASE("EventFileWriter: a folder that cannot be made is one error naming it") {
  const fs::path dir = scratch("blocked");
  fs::create_directories(dir);
  { std::ofstream(dir / "file") << "x"; }
  CHECK_THROWS_WITH_AS(launch::EventFileWriter((dir / "file" / "tb").string()),
                       doctest::Contains((dir / "file" / "tb").string().c_str()), core::Error);
  fs::remove_all(dir);
}

TEST_CASE("metrics.jsonl names map to TensorBoard tags: test_ to test/, the rest to train/") {
  CHECK(launch::tensorboard_tag("loss") == "train/loss");
  CHECK(launch::tensorboard_tag("samples_per_s") == "train/samples_per_s");
  CHECK(launch::tensorboard_tag("test_accuracy") == "test/accuracy");
  CHECK(launch::tensorboard_tag("test_precision_at_1") == "test/precision_at_1");
}
