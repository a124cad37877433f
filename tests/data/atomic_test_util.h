// Helpers for the atomic-store tests: a small Zarr v3 writer (chunks along any axis, zstd, gzip
// and crc32c codecs, little or big endian, sharding with its index at either end, chunks of fill
// values left out as Zarr does), an HDF5 writer of the same layout, and a store of recognisable
// values (atom g of the store has positions g + 0.25 k, structure s has energy -1.5 s, ...) so any
// read can be checked exactly.
#pragma once

#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data_test_util.h"
#include "mpigrad/core/crc32c.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/hdf5.h"

namespace mpigrad::data::test {

// One array of a store: its path ("core/positions"), Zarr type name, element size and extents,
// with its elements (native little-endian order), and the level of a field.
struct ArrayData {
  std::string path;
  std::string zarr_type;
  core::DType dtype = core::kFloat32;  // for HDF5 (zarr_type's DType)
  std::vector<int64_t> shape;
  std::vector<char> bytes;
  std::string level;  // "atom", "edge", "system"; empty for meta arrays
  // Bytes per stored element: from the Zarr type (uint16 is read as int32, but stored in 2).
  size_t element_size() const {
    for (const char* digits : {"64", "32", "16"}) {
      if (zarr_type.find(digits) != std::string::npos) return size_t(std::stoi(digits) / 8);
    }
    return 1;  // bool, int8, uint8
  }
};

template <typename T>
ArrayData array_of(std::string path, std::string zarr_type, core::DType dtype,
                   std::vector<int64_t> shape, const std::vector<T>& values,
                   std::string level = "") {
  ArrayData array{std::move(path), std::move(zarr_type), dtype, std::move(shape), {},
                  std::move(level)};
  array.bytes.resize(values.size() * sizeof(T));
  std::memcpy(array.bytes.data(), values.data(), array.bytes.size());
  return array;
}

// ---- Zarr v3 --------------------------------------------------------------------------------

struct ZarrLayout {
  int64_t chunk_rows = 3;       // along axis 0
  bool split_trailing = false;  // chunks of 1 along every other axis (Zarr's default for big data)
  int64_t shard_rows = 0;       // > 0: sharding_indexed, shards of this many rows
  bool index_at_start = false;  // sharding: where the index goes
  std::vector<std::string> codecs = {"zstd"};  // bytes-to-bytes codecs after "bytes"
  bool big_endian = false;
  bool skip_fill_chunks = true;  // chunks of zeros are not written (Zarr's write_empty_chunks)
  std::string key_encoding = "default";
  char separator = '/';
};

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<char>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string json_list(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

inline void append_crc(std::vector<char>& bytes) {
  const uint32_t crc = core::crc32c(bytes.data(), bytes.size());
  for (int i = 0; i < 4; ++i) bytes.push_back(char((crc >> (8 * i)) & 0xFF));
}

inline std::vector<char> encode(std::vector<char> raw, size_t element, const ZarrLayout& layout) {
  if (layout.big_endian) {
    for (size_t i = 0; i + element <= raw.size(); i += element)
      std::reverse(raw.begin() + std::ptrdiff_t(i), raw.begin() + std::ptrdiff_t(i + element));
  }
  for (const std::string& codec : layout.codecs) {
    if (codec == "zstd") {
      std::vector<char> out(ZSTD_compressBound(raw.size()));
      out.resize(ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3));
      raw = std::move(out);
    } else if (codec == "gzip") {
      z_stream stream{};
      deflateInit2(&stream, 5, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
      std::vector<char> out(deflateBound(&stream, uLong(raw.size())) + 32);
      stream.next_in = reinterpret_cast<Bytef*>(raw.data());
      stream.avail_in = uInt(raw.size());
      stream.next_out = reinterpret_cast<Bytef*>(out.data());
      stream.avail_out = uInt(out.size());
      deflate(&stream, Z_FINISH);
      out.resize(stream.total_out);
      deflateEnd(&stream);
      raw = std::move(out);
    } else if (codec == "crc32c") {
      append_crc(raw);
    }
  }
  return raw;
}

inline std::string codec_json(const ZarrLayout& layout) {
  std::string text = std::string("{\"name\": \"bytes\", \"configuration\": {\"endian\": \"") +
                     (layout.big_endian ? "big" : "little") + "\"}}";
  for (const std::string& codec : layout.codecs) {
    if (codec == "zstd") {
      text += ", {\"name\": \"zstd\", \"configuration\": {\"level\": 3, \"checksum\": false}}";
    } else if (codec == "gzip") {
      text += ", {\"name\": \"gzip\", \"configuration\": {\"level\": 5}}";
    } else {
      text += ", {\"name\": \"" + codec + "\"}";
    }
  }
  return "[" + text + "]";
}

inline std::string chunk_key(const std::vector<int64_t>& coords, const ZarrLayout& layout) {
  std::string key = layout.key_encoding == "v2" ? "" : "c";
  for (int64_t c : coords) {
    if (!key.empty()) key.push_back(layout.separator);
    key.append(std::to_string(c));
  }
  return key.empty() ? "0" : key;
}

// The chunk at `coords` of shape `chunk` (padded with zeros past the extents), raw.
inline std::vector<char> extract(const ArrayData& array, const std::vector<int64_t>& chunk,
                                 const std::vector<int64_t>& coords, bool* all_zero) {
  const size_t n = array.shape.size(), element = array.element_size();
  int64_t count = 1;
  for (int64_t extent : chunk) count *= extent;
  std::vector<char> out(size_t(count) * element, 0);
  *all_zero = true;
  std::vector<int64_t> local(n, 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, source = 0;
    bool inside = true;
    for (size_t d = n; d-- > 0;) {
      local[d] = rest % chunk[d];
      rest /= chunk[d];
    }
    for (size_t d = 0; d < n; ++d) {
      const int64_t global = coords[d] * chunk[d] + local[d];
      inside = inside && global < array.shape[d];
      source = source * array.shape[d] + global;
    }
    if (!inside) continue;
    std::memcpy(out.data() + size_t(i) * element, array.bytes.data() + size_t(source) * element,
                element);
    for (size_t b = 0; b < element; ++b) *all_zero = *all_zero && out[size_t(i) * element + b] == 0;
  }
  return out;
}

// Every chunk coordinate of a grid, in C order.
inline std::vector<std::vector<int64_t>> grid_of(const std::vector<int64_t>& shape,
                                                 const std::vector<int64_t>& chunk) {
  std::vector<int64_t> extents;
  int64_t total = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    extents.push_back((shape[d] + chunk[d] - 1) / chunk[d]);
    total *= extents.back();
  }
  std::vector<std::vector<int64_t>> coords;
  for (int64_t i = 0; i < total; ++i) {
    std::vector<int64_t> c(shape.size());
    int64_t rest = i;
    for (size_t d = shape.size(); d-- > 0;) {
      c[d] = rest % extents[d];
      rest /= extents[d];
    }
    coords.push_back(c);
  }
  return coords;
}

inline void write_zarr_array(const std::string& store, const ArrayData& array,
                             const ZarrLayout& layout) {
  const std::filesystem::path folder = std::filesystem::path(store) / array.path;
  std::vector<int64_t> chunk = array.shape;
  chunk[0] = layout.chunk_rows;
  for (size_t d = 1; d < chunk.size(); ++d) chunk[d] = layout.split_trailing ? 1 : chunk[d];
  for (int64_t& extent : chunk) extent = std::max<int64_t>(extent, 1);
  std::vector<int64_t> outer = chunk;
  if (layout.shard_rows > 0) outer[0] = layout.shard_rows;
  std::ostringstream meta;
  meta << "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": " << json_list(array.shape)
       << ", \"data_type\": \"" << array.zarr_type
       << "\", \"chunk_grid\": {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": "
       << json_list(outer) << "}}, \"chunk_key_encoding\": {\"name\": \"" << layout.key_encoding
       << "\", \"configuration\": {\"separator\": \"" << layout.separator
       << "\"}}, \"fill_value\": " << (array.zarr_type == "bool" ? "false" : "0")
       << ", \"codecs\": ";
  if (layout.shard_rows > 0) {
    meta << "[{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": "
         << json_list(chunk) << ", \"codecs\": " << codec_json(layout)
         << ", \"index_codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": "
            "\"little\"}}, {\"name\": \"crc32c\"}], \"index_location\": \""
         << (layout.index_at_start ? "start" : "end") << "\"}}]";
  } else {
    meta << codec_json(layout);
  }
  meta << ", \"attributes\": {}, \"storage_transformers\": []}";
  write_text(folder / "zarr.json", meta.str());
  if (layout.shard_rows <= 0) {
    for (const auto& coords : grid_of(array.shape, chunk)) {
      bool zero = false;
      std::vector<char> raw = extract(array, chunk, coords, &zero);
      if (zero && layout.skip_fill_chunks) continue;
      write_bytes(folder / chunk_key(coords, layout), encode(raw, array.element_size(), layout));
    }
    return;
  }
  std::vector<int64_t> per_shard(chunk.size());
  for (size_t d = 0; d < chunk.size(); ++d) per_shard[d] = outer[d] / chunk[d];
  for (const auto& shard : grid_of(array.shape, outer)) {
    std::vector<char> body;
    std::vector<uint64_t> index;
    bool any = false;
    for (const auto& within : grid_of(outer, chunk)) {  // every inner position, in C order
      std::vector<int64_t> coords(chunk.size());
      bool inside = true;
      for (size_t d = 0; d < chunk.size(); ++d) {
        coords[d] = shard[d] * per_shard[d] + within[d];
        inside = inside && coords[d] * chunk[d] < array.shape[d];
      }
      bool zero = true;
      std::vector<char> raw;
      if (inside) raw = extract(array, chunk, coords, &zero);
      if (!inside || (zero && layout.skip_fill_chunks)) {
        index.push_back(~uint64_t(0));
        index.push_back(~uint64_t(0));
        continue;
      }
      std::vector<char> encoded = encode(raw, array.element_size(), layout);
      index.push_back(body.size());
      index.push_back(encoded.size());
      body.insert(body.end(), encoded.begin(), encoded.end());
      any = true;
    }
    if (!any) continue;
    std::vector<char> index_bytes(index.size() * 8);
    std::memcpy(index_bytes.data(), index.data(), index_bytes.size());
    append_crc(index_bytes);
    std::vector<char> file;
    if (layout.index_at_start) {
      for (size_t i = 0; i < index.size(); i += 2) {  // offsets move past the index
        if (index[i] != ~uint64_t(0)) index[i] += index_bytes.size();
      }
      index_bytes.assign(index.size() * 8, 0);
      std::memcpy(index_bytes.data(), index.data(), index_bytes.size());
      append_crc(index_bytes);
      file = index_bytes;
      file.insert(file.end(), body.begin(), body.end());
    } else {
      file = body;
      file.insert(file.end(), index_bytes.begin(), index_bytes.end());
    }
    write_bytes(folder / chunk_key(shard, layout), file);
  }
}

inline void write_zarr_group(const std::filesystem::path& folder, const std::string& attributes) {
  write_text(folder / "zarr.json",
             "{\"zarr_format\": 3, \"node_type\": \"group\", "
             "\"attributes\": " +
                 attributes + "}");
}

// A store of `arrays`, with num_samples (negative: not recorded) and every field's level.
inline void write_zarr_store(const std::string& store, const std::vector<ArrayData>& arrays,
                             int64_t num_samples, const ZarrLayout& layout = {}) {
  std::string core, custom;
  for (const ArrayData& array : arrays) {
    if (array.level.empty()) continue;
    std::string& group = array.path.rfind("core/", 0) == 0 ? core : custom;
    if (!group.empty()) group.append(", ");
    group.append("\"").append(array.path.substr(array.path.find('/') + 1));
    group.append("\": \"").append(array.level).append("\"");
  }
  std::string attributes = "{\"fields\": {\"core\": {" + core + "}, \"custom\": {" + custom + "}}";
  if (num_samples >= 0) attributes += ", \"num_samples\": " + std::to_string(num_samples);
  attributes += "}";
  write_zarr_group(store, attributes);
  for (const char* group : {"meta", "core", "custom"})
    write_zarr_group(std::filesystem::path(store) / group, "{}");
  for (const ArrayData& array : arrays) write_zarr_array(store, array, layout);
}

inline void write_hdf5_store(const std::string& path, const std::vector<ArrayData>& arrays,
                             int64_t num_samples, bool levels = true) {
  core::hdf5::AtomicFileWriter writer(path);
  core::hdf5::File& file = writer.file();
  file.create_group("meta");
  file.create_group("core");
  for (const ArrayData& array : arrays) {
    core::hdf5::Dataset dataset = file.create_dataset(array.path, array.dtype, array.shape);
    if (!array.bytes.empty()) dataset.write(array.bytes.data(), array.dtype);
    if (levels && !array.level.empty()) file.write_attribute(array.path, "level", array.level);
  }
  if (num_samples >= 0) file.write_attribute("/", "num_samples", num_samples);
  writer.commit();
}

// ---- The test store ----------------------------------------------------------------------------

// Atom g (store row) of the test store: positions g + 0.25 k, atomic number 1 + g % 7, forces
// -g - 0.5 k. Structure s: energy -1.5 s, cell (s + 2) I, pbc (true, s odd, false), stress
// s + 0.1 (3 i + j). Edges: a ring over each structure's atoms (structure-local i -> i + 1), held
// as store rows, with Cartesian shifts e + 0.5 k (e the store edge row).
inline float position(int64_t g, int k) {
  return float(g) + 0.25f * float(k);
}
inline int64_t atomic_number(int64_t g) {
  return 1 + g % 7;
}
inline float force(int64_t g, int k) {
  return -float(g) - 0.5f * float(k);
}
inline float energy(int64_t s) {
  return -1.5f * float(s);
}
inline float shift(int64_t e, int k) {
  return float(e) + 0.5f * float(k);
}

struct TestStoreOptions {
  bool edges = true;
  bool cartesian_shifts = true;
  std::vector<bool> active = {};  // empty: every structure active
};

inline std::vector<ArrayData> test_store_arrays(const std::vector<int64_t>& atoms,
                                                const TestStoreOptions& options = {}) {
  const int64_t samples = int64_t(atoms.size());
  std::vector<int64_t> atoms_ptr = {0}, edges_ptr = {0};
  for (int64_t n : atoms) {
    atoms_ptr.push_back(atoms_ptr.back() + n);
    edges_ptr.push_back(edges_ptr.back() + (options.edges && n > 1 ? n : 0));
  }
  const int64_t v = atoms_ptr.back(), e = edges_ptr.back();
  std::vector<float> positions, forces, energies, cells, stresses, shifts;
  std::vector<int64_t> numbers;
  std::vector<int32_t> pairs;
  std::vector<uint8_t> pbc, mask;
  for (int64_t g = 0; g < v; ++g) {
    numbers.push_back(atomic_number(g));
    for (int k = 0; k < 3; ++k) {
      positions.push_back(position(g, k));
      forces.push_back(force(g, k));
    }
  }
  for (int64_t s = 0; s < samples; ++s) {
    energies.push_back(energy(s));
    for (int i = 0; i < 3; ++i) {
      pbc.push_back(i == 0 || (i == 1 && s % 2 == 1));
      for (int j = 0; j < 3; ++j) {
        cells.push_back(i == j ? float(s + 2) : 0.0f);
        stresses.push_back(float(s) + 0.1f * float(3 * i + j));
      }
    }
    const int64_t n = atoms[size_t(s)];
    if (options.edges && n > 1) {
      for (int64_t i = 0; i < n; ++i) {
        pairs.push_back(int32_t(atoms_ptr[size_t(s)] + i));
        pairs.push_back(int32_t(atoms_ptr[size_t(s)] + (i + 1) % n));
      }
    }
    mask.push_back(options.active.empty() || options.active[size_t(s)]);
  }
  for (int64_t r = 0; r < e; ++r) {
    for (int k = 0; k < 3; ++k) shifts.push_back(shift(r, k));
  }
  std::vector<uint8_t> atoms_mask(size_t(v), 1), edges_mask(size_t(e), 1);
  std::vector<ArrayData> arrays = {
      array_of("meta/atoms_ptr", "int64", core::kInt64, {samples + 1}, atoms_ptr),
      array_of("meta/edges_ptr", "int64", core::kInt64, {samples + 1}, edges_ptr),
      array_of("meta/samples_mask", "bool", core::kBool, {samples}, mask),
      array_of("meta/atoms_mask", "bool", core::kBool, {v}, atoms_mask),
      array_of("meta/edges_mask", "bool", core::kBool, {e}, edges_mask),
      array_of("core/positions", "float32", core::kFloat32, {v, 3}, positions, "atom"),
      array_of("core/atomic_numbers", "int64", core::kInt64, {v}, numbers, "atom"),
      array_of("core/forces", "float32", core::kFloat32, {v, 3}, forces, "atom"),
      array_of("core/energy", "float32", core::kFloat32, {samples, 1}, energies, "system"),
      array_of("core/cell", "float32", core::kFloat32, {samples, 3, 3}, cells, "system"),
      array_of("core/pbc", "bool", core::kBool, {samples, 3}, pbc, "system"),
      array_of("core/stress", "float32", core::kFloat32, {samples, 3, 3}, stresses, "system")};
  if (options.edges) {
    arrays.push_back(array_of("core/neighbor_list", "int32", core::kInt32, {e, 2}, pairs, "edge"));
    if (options.cartesian_shifts)
      arrays.push_back(array_of("core/shifts", "float32", core::kFloat32, {e, 3}, shifts, "edge"));
  }
  return arrays;
}

inline ArrayData& find_array(std::vector<ArrayData>& arrays, const std::string& path) {
  for (ArrayData& array : arrays) {
    if (array.path == path) return array;
  }
  throw std::runtime_error("no array " + path);
}

inline void remove_array(std::vector<ArrayData>& arrays, const std::string& path) {
  arrays.erase(std::remove_if(arrays.begin(), arrays.end(),
                              [&](const ArrayData& a) { return a.path == path; }),
               arrays.end());
}

}  // namespace mpigrad::data::test
