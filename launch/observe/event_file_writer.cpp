#include "mpigrad/launch/observe/event_file_writer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "mpigrad/core/crc32c.h"
#include "mpigrad/core/error.h"

namespace mpigrad::launch {

namespace {

// Little-endian whatever the host's byte order.
void append_fixed(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((value >> (8 * i)) & 0xff));
}

uint64_t read_fixed(std::string_view bytes, size_t at, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) value |= uint64_t(uint8_t(bytes[at + size_t(i)])) << (8 * i);
  return value;
}

// ---- The protobuf wire format: a tag is (field << 3) | wire type ------------------------------

constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(char((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(char(value));
}

void append_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  append_varint(out, (uint64_t(field) << 3) | wire_type);
}

void append_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  append_tag(out, field, kLengthDelimited);
  append_varint(out, bytes.size());
  out.append(bytes);
}

void append_double_field(std::string& out, uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  append_tag(out, field, kFixed64);
  append_fixed(out, bits, 8);
}

void append_float_field(std::string& out, uint32_t field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  append_tag(out, field, kFixed32);
  append_fixed(out, bits, 4);
}

// int64 is encoded as the varint of its two's complement (ten bytes when negative).
void append_int64_field(std::string& out, uint32_t field, int64_t value) {
  append_tag(out, field, kVarint);
  append_varint(out, static_cast<uint64_t>(value));
}

// Event fields.
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// Summary.value, and Value's fields.
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  return core::crc32c(bytes.data(), bytes.size());
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void append_tfrecord(std::string& out, std::string_view payload) {
  std::string length;
  append_fixed(length, payload.size(), 8);
  out.append(length);
  append_fixed(out, masked_crc32c(length), 4);
  out.append(payload);
  append_fixed(out, masked_crc32c(payload), 4);
}

std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& origin) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    MPIGRAD_CHECK(bytes.size() - at >= 12, origin, ": truncated record header at byte ", at);
    const uint64_t length = read_fixed(bytes, at, 8);
    MPIGRAD_CHECK(read_fixed(bytes, at + 8, 4) == masked_crc32c(bytes.substr(at, 8)), origin,
                  ": bad length CRC at byte ", at);
    MPIGRAD_CHECK(bytes.size() - at - 12 >= length + 4, origin, ": record at byte ", at, " holds ",
                  length, " bytes, past the end of the data");
    std::string_view payload = bytes.substr(at + 12, length);
    MPIGRAD_CHECK(read_fixed(bytes, at + 12 + length, 4) == masked_crc32c(payload), origin,
                  ": bad data CRC in the record at byte ", at);
    records.emplace_back(payload);
    at += 12 + length + 4;
  }
  return records;
}

std::string encode_file_version_event(double wall_time) {
  std::string event;
  append_double_field(event, kWallTime, wall_time);
  append_int64_field(event, kStep, 0);
  append_bytes_field(event, kFileVersion, "brain.Event:2");
  return event;
}

std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<TensorBoardScalar>& scalars) {
  std::string summary;
  for (const TensorBoardScalar& scalar : scalars) {
    std::string value;
    append_bytes_field(value, kValueTag, scalar.tag);
    append_float_field(value, kValueSimpleValue, static_cast<float>(scalar.value));
    append_bytes_field(summary, kSummaryValue, value);
  }
  std::string event;
  append_double_field(event, kWallTime, wall_time);
  append_int64_field(event, kStep, step);
  append_bytes_field(event, kSummary, summary);
  return event;
}

EventFileWriter::EventFileWriter(const std::string& directory) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(directory, error);
  MPIGRAD_CHECK(!error, "TensorBoard: cannot create directory '", directory,
                "': ", error.message());
  // The counter keeps two writers of one process apart within the same second.
  static std::atomic<int> writers{0};
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  path_ =
      (fs::path(directory) / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() +
                              "." + std::to_string(getpid()) + "." + std::to_string(writers++)))
          .string();
  file_ = std::fopen(path_.c_str(), "wbx");  // exclusive: never appends to another's file
  MPIGRAD_CHECK(file_ != nullptr, "TensorBoard: cannot create event file '", path_,
                "': ", std::strerror(errno));
  write(encode_file_version_event(now_seconds()));
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFileWriter::write(std::string_view payload) {
  MPIGRAD_CHECK(file_ != nullptr, "TensorBoard: event file '", path_, "' is closed");
  std::string frame;
  append_tfrecord(frame, payload);
  MPIGRAD_CHECK(std::fwrite(frame.data(), 1, frame.size(), file_) == frame.size(),
                "TensorBoard: cannot write to '", path_, "': ", std::strerror(errno));
}

void EventFileWriter::add_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  if (scalars.empty()) return;
  write(encode_scalars_event(now_seconds(), step, scalars));
}

void EventFileWriter::flush() {
  MPIGRAD_CHECK(file_ != nullptr && std::fflush(file_) == 0, "TensorBoard: cannot write to '",
                path_, "': ", std::strerror(errno));
}

void EventFileWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* file = file_;
  file_ = nullptr;
  MPIGRAD_CHECK(std::fclose(file) == 0, "TensorBoard: cannot close '", path_,
                "': ", std::strerror(errno));
}

}  // namespace mpigrad::launch
