// TensorBoard event files: scalars written in the format TensorBoard's own reader reads, with no
// TensorFlow, protobuf or Python.
//
// An event file is a sequence of TFRecord frames, each
//   uint64 length | uint32 masked CRC32C(length bytes) | data | uint32 masked CRC32C(data)
// (little-endian, mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8), whose data is one
// serialized tensorflow.Event: wall_time (double, field 1), step (int64, field 2), and either
// file_version (string, field 3; "brain.Event:2" in the first record) or summary (field 5), a
// Summary { repeated Value value = 1 } of Value { string tag = 1; float simple_value = 2 }.
//
// What is written by hand, and why:
// - CRC32C is core/crc32c.h's (Boost.CRC's, which checkpoints use too; Debian has no CRC32C
//   library package); tests check it on the standard check value.
// - The protobuf wire encoding of those five fields (varints, fixed64, fixed32 and
//   length-delimited strings) is written here instead of using libprotobuf: libprotobuf would
//   need protoc code generation in the build, a copy of TensorFlow's event.proto and
//   summary.proto, and a large runtime library, for about forty lines of an encoding that the
//   protobuf specification fixes and that cannot change under us.
//
// The file is append-only and written directly (not through a temporary file): TensorBoard
// reads a file while it grows, and ignores a truncated last record, so a crash leaves every
// earlier record readable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mpigrad::launch {

// CRC32C (Castagnoli) of `bytes`; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view bytes);
// The masked CRC32C of TFRecord frames.
uint32_t masked_crc32c(std::string_view bytes);

// Appends one TFRecord frame holding `payload` to `out`.
void append_tfrecord(std::string& out, std::string_view payload);
// The payloads of every frame in `bytes`, after checking both CRCs of each; throws core::Error
// naming `origin` and the byte offset of a bad or truncated frame.
std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& origin);

struct TensorBoardScalar {
  std::string tag;  // "train/loss"
  double value;     // stored as float32, TensorBoard's simple_value
};

// Serialized tensorflow.Event messages.
std::string encode_file_version_event(double wall_time);
std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<TensorBoardScalar>& scalars);

class EventFileWriter {
 public:
  // Creates `directory` and events.out.tfevents.<seconds>.<host>.<pid> in it (TensorBoard's
  // naming), opened exclusively, and writes the file-version record. Throws core::Error naming
  // the path when either cannot be made.
  explicit EventFileWriter(const std::string& directory);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One event holding every scalar, at `step`, stamped with the current time.
  void add_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars);
  // Hands what was written to the operating system; throws core::Error naming the file.
  void flush();
  // Flushes and closes; throws core::Error naming the file. The destructor closes quietly.
  void close();
  const std::string& path() const { return path_; }

 private:
  void write(std::string_view payload);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mpigrad::launch
