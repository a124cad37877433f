#include "mpigrad/data/zarr_array.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::data {

namespace fs = std::filesystem;
using nlohmann::json;
using zarr::BytesCodec;

namespace {

// Decoding one chunk needs its bytes at once: a chunk larger than this is refused up front.
constexpr int64_t kMaxChunkBytes = int64_t(1) << 30;
// A zarr.json is a few KB; one of megabytes is not metadata.
constexpr int64_t kMaxMetadataBytes = 16 << 20;

// ---- Files --------------------------------------------------------------------------------------

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens `path` for reading; nullopt when it does not exist (a chunk never written).
std::optional<int> open_if_present(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) return fd;
  if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
  core::fail(what, ": cannot open ", path, ": ", std::strerror(errno));
}

int64_t size_of(int fd, const std::string& path, const std::string& what) {
  struct stat info {};
  MPIGRAD_CHECK(::fstat(fd, &info) == 0, what, ": cannot stat ", path, ": ", std::strerror(errno));
  MPIGRAD_CHECK(S_ISREG(info.st_mode), what, ": ", path, " is not a regular file");
  return int64_t(info.st_size);
}

void read_at(int fd, int64_t offset, int64_t size, char* out, const std::string& path,
             const std::string& what) {
  int64_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, out + done, size_t(size - done), off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    MPIGRAD_CHECK(got >= 0, what, ": reading ", path, ": ", std::strerror(errno));
    MPIGRAD_CHECK(got > 0, what, ": ", path, " ends at byte ", offset + done, ", before the ",
                  offset + size, " it should hold (truncated file)");
    done += got;
  }
}

json read_json(const std::string& path, const std::string& what) {
  std::optional<int> fd = open_if_present(path, what);
  MPIGRAD_CHECK(fd.has_value(), what, ": ", path, " does not exist");
  FileDescriptor file(*fd);
  const int64_t size = size_of(file.get(), path, what);
  MPIGRAD_CHECK(size <= kMaxMetadataBytes, what, ": ", path, " is ", size,
                " bytes, too large to be Zarr metadata");
  std::string text(static_cast<size_t>(size), '\0');
  read_at(file.get(), 0, size, text.data(), path, what);
  try {
    return json::parse(text);
  } catch (const json::exception& error) {
    core::fail(what, ": ", path, " is not valid JSON: ", error.what());
  }
}

// ---- Metadata fields ----------------------------------------------------------------------------

const json& member(const json& object, const char* key, const std::string& what) {
  MPIGRAD_CHECK(object.is_object() && object.contains(key), what, ": metadata has no '", key, "'");
  return object.at(key);
}

std::vector<int64_t> extents(const json& value, const char* key, int64_t low,
                             const std::string& what) {
  MPIGRAD_CHECK(value.is_array(), what, ": '", key, "' must be a list of integers, got ",
                value.dump());
  std::vector<int64_t> result;
  for (const json& item : value) {
    MPIGRAD_CHECK(item.is_number_integer() && item.get<int64_t>() >= low, what, ": '", key,
                  "' must hold integers >= ", low, ", got ", value.dump());
    result.push_back(item.get<int64_t>());
  }
  return result;
}

// A codec entry: its name and configuration (a bare string is a codec without configuration).
std::pair<std::string, json> codec_of(const json& entry, const std::string& what) {
  if (entry.is_string()) return {entry.get<std::string>(), json::object()};
  MPIGRAD_CHECK(entry.is_object() && entry.contains("name") && entry.at("name").is_string(), what,
                ": codec entry ", entry.dump(), " has no name");
  return {entry.at("name").get<std::string>(),
          entry.contains("configuration") ? entry.at("configuration") : json::object()};
}

bool big_endian_of(const json& configuration, const std::string& what) {
  if (!configuration.is_object() || !configuration.contains("endian")) return false;
  const json& endian = configuration.at("endian");
  MPIGRAD_CHECK(endian.is_string() && (endian == "little" || endian == "big"), what,
                ": bytes codec endian must be \"little\" or \"big\", got ", endian.dump());
  return endian == "big";
}

constexpr const char* kSupportedCodecs = "bytes, zstd, gzip, crc32c and sharding_indexed";

// The element types, what each is read as, and how (kind: 0 copy, 1 sign-extend, 2 zero-extend,
// 3 uint64 checked into int64).
struct ElementType {
  const char* name;
  size_t size;
  core::DType read_as;
  int kind;
};
constexpr ElementType kElementTypes[] = {
    {"bool", 1, core::kBool, 0},         {"uint8", 1, core::kUInt8, 0},
    {"int8", 1, core::kInt32, 1},        {"int16", 2, core::kInt32, 1},
    {"uint16", 2, core::kInt32, 2},      {"int32", 4, core::kInt32, 0},
    {"uint32", 4, core::kInt64, 2},      {"int64", 8, core::kInt64, 0},
    {"uint64", 8, core::kInt64, 3},      {"float16", 2, core::kFloat16, 0},
    {"bfloat16", 2, core::kBFloat16, 0}, {"float32", 4, core::kFloat32, 0},
    {"float64", 8, core::kFloat64, 0}};

// Widens `count` stored elements (native byte order) into dtype elements.
void widen(const char* in, size_t stored_size, int kind, char* out, size_t out_size, size_t count,
           const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const char* from = in + i * stored_size;
    int64_t value = 0;
    if (kind == 1) {
      if (stored_size == 1) value = int8_t(*from);
      if (stored_size == 2) {
        int16_t v;
        std::memcpy(&v, from, 2);
        value = v;
      }
    } else {
      uint64_t v = 0;
      std::memcpy(&v, from, stored_size);  // little-endian host: the low bytes
      MPIGRAD_CHECK(kind != 3 || v <= uint64_t(std::numeric_limits<int64_t>::max()), what,
                    ": uint64 value ", v, " does not fit the int64 it is read as");
      value = int64_t(v);
    }
    if (out_size == 4) {
      const int32_t narrow = int32_t(value);
      std::memcpy(out + i * 4, &narrow, 4);
    } else {
      std::memcpy(out + i * 8, &value, 8);
    }
  }
}

// One element of `dtype` holding the fill value.
std::vector<char> fill_element(const json& value, core::DType dtype, const std::string& what) {
  std::vector<char> element(core::element_size(dtype), 0);
  if (value.is_null()) return element;
  double number = 0;
  if (value.is_boolean()) {
    number = value.get<bool>() ? 1 : 0;
  } else if (value.is_number_integer() && !core::is_floating(dtype)) {
    const int64_t integer = value.is_number_unsigned()
                                ? int64_t(std::min<uint64_t>(value.get<uint64_t>(), INT64_MAX))
                                : value.get<int64_t>();
    if (dtype == core::kInt64) {
      std::memcpy(element.data(), &integer, 8);
    } else if (dtype == core::kInt32) {
      const int32_t narrow = int32_t(integer);
      std::memcpy(element.data(), &narrow, 4);
    } else {
      element[0] = char(integer != 0 && dtype == core::kBool ? 1 : integer);
    }
    return element;
  } else if (value.is_number()) {
    number = value.get<double>();
  } else if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (text == "NaN") {
      number = std::numeric_limits<double>::quiet_NaN();
    } else if (text == "Infinity") {
      number = std::numeric_limits<double>::infinity();
    } else if (text == "-Infinity") {
      number = -std::numeric_limits<double>::infinity();
    } else {
      core::fail(what, ": fill_value ", value.dump(), " is not supported");
    }
  } else {
    core::fail(what, ": fill_value ", value.dump(), " is not supported");
  }
  core::Tensor one = core::full({1}, number, dtype);
  std::memcpy(element.data(), one.data_ptr(), element.size());
  return element;
}

}  // namespace

// ---- Nodes --------------------------------------------------------------------------------------

ZarrNode zarr_node_kind(const std::string& path) {
  const std::string what = "Zarr path " + path;
  MPIGRAD_CHECK(!fs::exists(fs::path(path) / ".zarray") && !fs::exists(fs::path(path) / ".zgroup"),
                what,
                ": Zarr v2 metadata (.zarray/.zgroup); only Zarr v3 stores are read "
                "(nvalchemi-toolkit writes v3)");
  if (!fs::is_regular_file(fs::path(path) / "zarr.json")) return ZarrNode::Missing;
  const json metadata = read_json((fs::path(path) / "zarr.json").string(), what);
  const json& format = member(metadata, "zarr_format", what);
  MPIGRAD_CHECK(format.is_number_integer() && format.get<int>() == 3, what, ": zarr_format is ",
                format.dump(), "; only Zarr v3 is read");
  const json& type = member(metadata, "node_type", what);
  if (type == "group") return ZarrNode::Group;
  if (type == "array") return ZarrNode::Array;
  core::fail(what, ": node_type ", type.dump(), " is neither \"group\" nor \"array\"");
}

std::string zarr_group_attributes(const std::string& path) {
  const json metadata = read_json((fs::path(path) / "zarr.json").string(), "Zarr group " + path);
  if (!metadata.contains("attributes")) return "{}";
  return metadata.at("attributes").dump();
}

// ---- Opening ------------------------------------------------------------------------------------

ZarrArray::ZarrArray(std::string store, std::string name, std::shared_ptr<ChunkCache> cache)
    : store_(std::move(store)), cache_(std::move(cache)) {
  name_ = std::move(name);
  directory_ = (fs::path(store_) / name_).string();
  const std::string where = what();
  const json metadata = read_json((fs::path(directory_) / "zarr.json").string(), where);
  const json& format = member(metadata, "zarr_format", where);
  MPIGRAD_CHECK(format == 3, where, ": zarr_format is ", format.dump(), ", not 3");
  MPIGRAD_CHECK(member(metadata, "node_type", where) == "array", where, ": is not an array");

  shape_ = extents(member(metadata, "shape", where), "shape", 0, where);
  MPIGRAD_CHECK(!shape_.empty() && int(shape_.size()) <= 8, where, ": has ", shape_.size(),
                " dimensions; a field needs 1 to 8 (rows first)");

  const json& type = member(metadata, "data_type", where);
  MPIGRAD_CHECK(type.is_string(), where, ": data_type ", type.dump(), " is not supported");
  const ElementType* element = nullptr;
  for (const ElementType& candidate : kElementTypes) {
    if (type == candidate.name) element = &candidate;
  }
  MPIGRAD_CHECK(element != nullptr, where, ": data_type ", type.dump(),
                " is not supported (bool, int8..int64, uint8..uint64, float16, bfloat16, float32, "
                "float64)");
  stored_type_ = element->name;
  dtype_ = element->read_as;
  stored_size_ = element->size;
  stored_kind_ = element->kind;
  fill_ = fill_element(metadata.value("fill_value", json()), dtype_, where);

  const json& grid = member(metadata, "chunk_grid", where);
  MPIGRAD_CHECK(member(grid, "name", where) == "regular", where, ": chunk_grid ",
                grid.value("name", json()).dump(), " is not supported (only \"regular\")");
  chunk_shape_ = extents(member(member(grid, "configuration", where), "chunk_shape", where),
                         "chunk_shape", 1, where);
  MPIGRAD_CHECK(chunk_shape_.size() == shape_.size(), where, ": chunk_shape has ",
                chunk_shape_.size(), " dimensions but shape has ", shape_.size());

  if (metadata.contains("chunk_key_encoding")) {
    const json& encoding = metadata.at("chunk_key_encoding");
    const json name_value = encoding.value("name", json("default"));
    MPIGRAD_CHECK(name_value == "default" || name_value == "v2", where, ": chunk_key_encoding ",
                  name_value.dump(), " is not supported (\"default\" or \"v2\")");
    v2_keys_ = name_value == "v2";
    separator_ = v2_keys_ ? '.' : '/';
    if (encoding.contains("configuration") && encoding.at("configuration").contains("separator")) {
      const json& separator = encoding.at("configuration").at("separator");
      MPIGRAD_CHECK(separator == "/" || separator == ".", where, ": chunk key separator ",
                    separator.dump(), " is not \"/\" or \".\"");
      separator_ = separator.get<std::string>()[0];
    }
  }
  if (metadata.contains("storage_transformers")) {
    const json& transformers = metadata.at("storage_transformers");
    MPIGRAD_CHECK(transformers.is_array() && transformers.empty(), where, ": storage_transformers ",
                  transformers.dump(), " are not supported");
  }

  // The codecs: [array-to-bytes] [bytes-to-bytes...]; sharding nests one more such chain.
  auto parse_chain = [&](const json& codecs, bool allow_sharding, Chain& chain,
                         const json** sharding) {
    MPIGRAD_CHECK(codecs.is_array() && !codecs.empty(), where, ": codecs must be a non-empty list");
    bool seen_array_to_bytes = false;
    for (const json& entry : codecs) {
      auto [codec, configuration] = codec_of(entry, where);
      if (!seen_array_to_bytes) {
        if (codec == "bytes") {
          chain.big_endian = big_endian_of(configuration, where);
        } else if (codec == "sharding_indexed" && allow_sharding) {
          *sharding = &entry;
        } else {
          core::fail(where, ": codec '", codec, "' is not supported",
                     codec == "sharding_indexed" ? " inside a shard" : "", " (this reader knows ",
                     kSupportedCodecs, ")");
        }
        seen_array_to_bytes = true;
        continue;
      }
      if (codec == "zstd") {
        chain.codecs.push_back(BytesCodec::Zstd);
      } else if (codec == "gzip") {
        chain.codecs.push_back(BytesCodec::Gzip);
      } else if (codec == "crc32c") {
        chain.codecs.push_back(BytesCodec::Crc32c);
      } else {
        core::fail(where, ": codec '", codec, "' is not supported (this reader knows ",
                   kSupportedCodecs, ")");
      }
    }
  };
  const json* sharding = nullptr;
  parse_chain(member(metadata, "codecs", where), true, chain_, &sharding);
  read_shape_ = chunk_shape_;
  if (sharding != nullptr) {
    sharded_ = true;
    MPIGRAD_CHECK(chain_.codecs.empty(), where,
                  ": bytes-to-bytes codecs after sharding_indexed are not supported");
    const json& configuration = member(*sharding, "configuration", where);
    read_shape_ =
        extents(member(configuration, "chunk_shape", where), "sharding chunk_shape", 1, where);
    MPIGRAD_CHECK(read_shape_.size() == shape_.size(), where, ": inner chunk_shape has ",
                  read_shape_.size(), " dimensions but shape has ", shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) {
      MPIGRAD_CHECK(chunk_shape_[d] % read_shape_[d] == 0, where, ": shard shape ",
                    json(chunk_shape_).dump(), " is not a multiple of the inner chunk shape ",
                    json(read_shape_).dump());
    }
    const json* nested = nullptr;
    parse_chain(member(configuration, "codecs", where), false, inner_, &nested);
    Chain index;
    if (configuration.contains("index_codecs")) {
      parse_chain(configuration.at("index_codecs"), false, index, &nested);
    }
    index_big_endian_ = index.big_endian;
    index_checksum_ = index.codecs.size() == 1 && index.codecs[0] == BytesCodec::Crc32c;
    MPIGRAD_CHECK(index.codecs.empty() || index_checksum_, where,
                  ": shard index_codecs other than bytes and crc32c are not supported");
    const json location = configuration.value("index_location", json("end"));
    MPIGRAD_CHECK(location == "end" || location == "start", where, ": index_location ",
                  location.dump(), " is neither \"start\" nor \"end\"");
    index_at_end_ = location == "end";
  }

  int64_t elements = 1;
  for (int64_t extent : read_shape_) {
    elements = core::checked_mul(elements, extent, where, ": chunk shape");
  }
  unit_bytes_ = core::checked_mul(elements, int64_t(core::element_size(dtype_)), where, ": chunk");
  stored_bytes_ = core::checked_mul(elements, int64_t(stored_size_), where, ": chunk");
  MPIGRAD_CHECK(std::max(unit_bytes_, stored_bytes_) <= kMaxChunkBytes, where, ": a chunk of ",
                json(read_shape_).dump(), " elements holds ", std::max(unit_bytes_, stored_bytes_),
                " bytes, more than the 1 GiB this reader decodes at once");
}

std::string ZarrArray::what() const {
  return "Zarr store " + store_ + ": array " + name_;
}

std::string ZarrArray::key_of(const std::vector<int64_t>& chunk) const {
  std::string key = v2_keys_ ? "" : "c";
  for (size_t d = 0; d < chunk.size(); ++d) {
    if (!key.empty()) key += separator_;
    key += std::to_string(chunk[d]);
  }
  return key.empty() ? "0" : key;
}

// ---- Reading ------------------------------------------------------------------------------------

ChunkCache::Block ZarrArray::fill_block() const {
  std::lock_guard<std::mutex> lock(fill_mutex_);
  if (!fill_block_) {
    auto block = std::make_shared<std::vector<char>>(static_cast<size_t>(unit_bytes_));
    for (int64_t i = 0; i < unit_bytes_; i += int64_t(fill_.size()))
      std::memcpy(block->data() + i, fill_.data(), fill_.size());
    fill_block_ = std::move(block);
  }
  return fill_block_;
}

ChunkCache::Block ZarrArray::decode(std::vector<char> encoded, const Chain& chain,
                                    const std::string& where) const {
  std::vector<char> raw =
      zarr::decode_bytes(std::move(encoded), chain.codecs, size_t(stored_bytes_), where);
  const size_t count = size_t(stored_bytes_) / stored_size_;
  if (chain.big_endian) zarr::swap_bytes(raw.data(), count, stored_size_);
  if (stored_kind_ == 0) return std::make_shared<const std::vector<char>>(std::move(raw));
  auto widened = std::make_shared<std::vector<char>>(static_cast<size_t>(unit_bytes_));
  widen(raw.data(), stored_size_, stored_kind_, widened->data(), core::element_size(dtype_), count,
        where);
  return widened;
}

std::vector<zarr::ShardEntry> ZarrArray::shard_index(const std::string& path,
                                                     uint64_t shard_bytes) const {
  int64_t chunks = 1;
  for (size_t d = 0; d < shape_.size(); ++d) chunks *= chunk_shape_[d] / read_shape_[d];
  const int64_t index_bytes = zarr::shard_index_bytes(chunks, index_checksum_);
  const std::string where = what() + ": shard " + path;
  MPIGRAD_CHECK(int64_t(shard_bytes) >= index_bytes, where, ": ", shard_bytes,
                " bytes cannot hold its ", index_bytes, "-byte index (truncated shard)");
  std::optional<int> fd = open_if_present(path, where);
  MPIGRAD_CHECK(fd.has_value(), where, ": disappeared while being read");
  FileDescriptor file(*fd);
  std::vector<char> bytes(static_cast<size_t>(index_bytes));
  read_at(file.get(), index_at_end_ ? int64_t(shard_bytes) - index_bytes : 0, index_bytes,
          bytes.data(), path, where);
  return zarr::decode_shard_index(bytes, chunks, index_big_endian_, index_checksum_, shard_bytes,
                                  where);
}

ChunkCache::Block ZarrArray::unit(const std::vector<int64_t>& coords) const {
  const size_t n = shape_.size();
  int64_t linear = 0;
  for (size_t d = 0; d < n; ++d) {
    const int64_t grid = core::ceil_div(shape_[d], read_shape_[d]);
    linear = linear * grid + coords[d];
  }
  const ChunkCache::Key key{this, linear};
  if (ChunkCache::Block cached = cache_->find(key)) return cached;

  ChunkCache::Block block;
  if (!sharded_) {
    const std::string path = (fs::path(directory_) / key_of(coords)).string();
    const std::string where = what() + ": chunk " + path;
    std::optional<int> fd = open_if_present(path, where);
    if (!fd) return fill_block();
    FileDescriptor file(*fd);
    const int64_t size = size_of(file.get(), path, where);
    MPIGRAD_CHECK(size <= kMaxChunkBytes + 65536, where, ": ", size,
                  " bytes, more than any encoding of its chunk (corrupt chunk)");
    std::vector<char> encoded(static_cast<size_t>(size));
    read_at(file.get(), 0, size, encoded.data(), path, where);
    block = decode(std::move(encoded), chain_, where);
  } else {
    std::vector<int64_t> shard(n), within(n);
    int64_t inner_index = 0;
    for (size_t d = 0; d < n; ++d) {
      const int64_t per_shard = chunk_shape_[d] / read_shape_[d];
      shard[d] = coords[d] / per_shard;
      within[d] = coords[d] % per_shard;
      inner_index = inner_index * per_shard + within[d];
    }
    const std::string path = (fs::path(directory_) / key_of(shard)).string();
    const std::string where = what() + ": shard " + path;
    std::optional<int> fd = open_if_present(path, where);
    if (!fd) return fill_block();
    FileDescriptor file(*fd);
    const uint64_t shard_bytes = uint64_t(size_of(file.get(), path, where));
    // The shard's index is cached beside its chunks (negative numbers).
    int64_t shard_linear = 0;
    for (size_t d = 0; d < n; ++d)
      shard_linear = shard_linear * core::ceil_div(shape_[d], chunk_shape_[d]) + shard[d];
    const ChunkCache::Key index_key{this, -1 - shard_linear};
    ChunkCache::Block index_block = cache_->find(index_key);
    if (!index_block) {
      std::vector<zarr::ShardEntry> entries = shard_index(path, shard_bytes);
      auto bytes = std::make_shared<std::vector<char>>(entries.size() * sizeof(zarr::ShardEntry));
      std::memcpy(bytes->data(), entries.data(), bytes->size());
      index_block = bytes;
      cache_->insert(index_key, index_block);
    }
    zarr::ShardEntry entry;
    MPIGRAD_CHECK(size_t(inner_index + 1) * sizeof(entry) <= index_block->size(), where,
                  ": index has no entry for inner chunk ", inner_index);
    std::memcpy(&entry, index_block->data() + size_t(inner_index) * sizeof(entry), sizeof(entry));
    if (entry.empty()) return fill_block();
    MPIGRAD_CHECK(entry.offset + entry.size <= shard_bytes, where, ": inner chunk ", inner_index,
                  " lies past the shard's ", shard_bytes, " bytes (truncated shard)");
    MPIGRAD_CHECK(int64_t(entry.size) <= kMaxChunkBytes + 65536, where, ": inner chunk ",
                  inner_index, " of ", entry.size, " bytes is larger than any encoding of it");
    std::vector<char> encoded(static_cast<size_t>(entry.size));
    read_at(file.get(), int64_t(entry.offset), int64_t(entry.size), encoded.data(), path, where);
    block =
        decode(std::move(encoded), inner_, where + " inner chunk " + std::to_string(inner_index));
  }
  cache_->insert(key, block);
  return block;
}

void ZarrArray::read_rows(int64_t begin, int64_t count, void* out) const {
  MPIGRAD_CHECK(begin >= 0 && count >= 0 && begin <= shape_[0] - count, what(), ": rows [", begin,
                ", ", begin + count, ") outside its ", shape_[0], " rows");
  const size_t n = shape_.size();
  const size_t element = core::element_size(dtype_);
  int64_t row_elements = 1;
  for (size_t d = 1; d < n; ++d) row_elements *= shape_[d];
  if (count == 0 || row_elements == 0) return;
  char* output = static_cast<char*>(out);

  // Chunks spanning every trailing axis exactly hold whole rows: one copy per chunk.
  bool whole_rows = true;
  for (size_t d = 1; d < n; ++d) whole_rows = whole_rows && read_shape_[d] == shape_[d];
  const int64_t end = begin + count;
  std::vector<int64_t> coords(n, 0);
  for (int64_t c0 = begin / read_shape_[0]; c0 * read_shape_[0] < end; ++c0) {
    const int64_t lo = std::max(begin, c0 * read_shape_[0]);
    const int64_t hi = std::min(end, (c0 + 1) * read_shape_[0]);
    coords.assign(n, 0);
    coords[0] = c0;
    if (whole_rows) {
      ChunkCache::Block block = unit(coords);
      const int64_t row_bytes = row_elements * int64_t(element);
      std::memcpy(output + (lo - begin) * row_bytes,
                  block->data() + (lo - c0 * read_shape_[0]) * row_bytes,
                  size_t((hi - lo) * row_bytes));
      continue;
    }
    // Every chunk of this band of rows, trailing axes in order (an odometer over coords[1..]).
    while (true) {
      ChunkCache::Block block = unit(coords);
      std::vector<int64_t> low(n), high(n);
      low[0] = lo;
      high[0] = hi;
      for (size_t d = 1; d < n; ++d) {
        low[d] = coords[d] * read_shape_[d];
        high[d] = std::min(shape_[d], low[d] + read_shape_[d]);
      }
      // Copy the intersection run by run along the last axis.
      std::vector<int64_t> index = low;
      const int64_t run = high[n - 1] - low[n - 1];
      while (true) {
        int64_t source = 0, target = 0;
        for (size_t d = 0; d < n; ++d) {
          source = source * read_shape_[d] + (index[d] - coords[d] * read_shape_[d]);
          target = target * (d == 0 ? count : shape_[d]) + (d == 0 ? index[0] - begin : index[d]);
        }
        std::memcpy(output + target * int64_t(element), block->data() + source * int64_t(element),
                    size_t(run) * element);
        int d = int(n) - 2;
        for (; d >= 0; --d) {
          if (++index[size_t(d)] < high[size_t(d)]) break;
          index[size_t(d)] = low[size_t(d)];
        }
        if (d < 0) break;
      }
      int d = int(n) - 1;
      for (; d >= 1; --d) {
        if (++coords[size_t(d)] * read_shape_[size_t(d)] < shape_[size_t(d)]) break;
        coords[size_t(d)] = 0;
      }
      if (d < 1) break;
    }
  }
}

}  // namespace mpigrad::data
