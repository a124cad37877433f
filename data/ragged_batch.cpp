#include "mpigrad/data/ragged_batch.h"

#include <cstring>
#include <numeric>

#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"

namespace mpigrad::data {

core::Tensor offsets_from_counts(std::span<const int64_t> counts) {
  core::Tensor offsets = empty_batch_tensor({int64_t(counts.size()) + 1}, core::kInt64);
  int64_t* out = offsets.data<int64_t>();
  out[0] = 0;
  for (size_t i = 0; i < counts.size(); ++i) out[i + 1] = out[i] + counts[i];
  return offsets;
}

core::Tensor sample_of_rows(std::span<const int64_t> counts) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  core::Tensor rows = empty_batch_tensor({total}, core::kInt64);
  int64_t* out = rows.data<int64_t>();
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int64_t k = 0; k < counts[i]; ++k) *out++ = int64_t(i);
  }
  return rows;
}

namespace {

// One part's view of a level: the first row of each of its structures (B + 1 entries).
std::vector<int64_t> pointer_of(const Batch& part, const std::vector<FieldInfo>& fields,
                                FieldLevel pointer_level, size_t part_index) {
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].level != pointer_level) continue;
    core::Tensor pointer = part.fields[f].second.contiguous();
    MPIGRAD_CHECK(pointer.dtype() == core::kInt64 && pointer.shape().size() == 1 &&
                      pointer.numel() == part.size() + 1,
                  "gather_structures: part ", part_index, " field '", fields[f].name, "' is ",
                  pointer.dtype(), " ", pointer.shape(), "; a pointer is int64 [", part.size() + 1,
                  "]");
    const int64_t* values = pointer.data<int64_t>();
    return std::vector<int64_t>(values, values + pointer.numel());
  }
  return {};
}

}  // namespace

Batch gather_structures(std::span<const Batch> parts, std::span<const StructurePick> picks,
                        const std::vector<FieldInfo>& fields) {
  const int64_t n = int64_t(picks.size());
  bool has_atoms = false, has_edges = false;
  for (const FieldInfo& field : fields) {
    has_atoms |= field.level == FieldLevel::Atom || field.level == FieldLevel::AtomSample ||
                 field.level == FieldLevel::EdgeAtoms;
    has_edges |= field.level == FieldLevel::Edge || field.level == FieldLevel::EdgeAtoms;
  }
  std::vector<std::vector<int64_t>> atoms_ptr(parts.size()), edges_ptr(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    MPIGRAD_CHECK(parts[p].fields.size() == fields.size(), "gather_structures: part ", p, " has ",
                  parts[p].fields.size(), " fields, expected ", fields.size());
    for (size_t f = 0; f < fields.size(); ++f) {
      MPIGRAD_CHECK(parts[p].fields[f].first == fields[f].name, "gather_structures: part ", p,
                    " field ", f, " is '", parts[p].fields[f].first, "', expected '",
                    fields[f].name, "'");
    }
    atoms_ptr[p] = pointer_of(parts[p], fields, FieldLevel::AtomPointer, p);
    edges_ptr[p] = pointer_of(parts[p], fields, FieldLevel::EdgePointer, p);
    MPIGRAD_CHECK(!has_atoms || !atoms_ptr[p].empty(), "gather_structures: part ", p,
                  " has atom fields but no atom pointer field");
    MPIGRAD_CHECK(!has_edges || !edges_ptr[p].empty(), "gather_structures: part ", p,
                  " has edge fields but no edge pointer field");
  }
  std::vector<int64_t> atom_counts, edge_counts;
  for (const StructurePick& pick : picks) {
    MPIGRAD_CHECK(
        pick.part < parts.size() && pick.position >= 0 && pick.position < parts[pick.part].size(),
        "gather_structures: pick (part ", pick.part, ", structure ", pick.position,
        ") is out of range");
    const size_t s = size_t(pick.position);
    if (has_atoms) atom_counts.push_back(atoms_ptr[pick.part][s + 1] - atoms_ptr[pick.part][s]);
    if (has_edges) edge_counts.push_back(edges_ptr[pick.part][s + 1] - edges_ptr[pick.part][s]);
  }
  const core::Tensor new_atoms = offsets_from_counts(atom_counts);
  const int64_t* atom_first = new_atoms.data<int64_t>();
  const int64_t total_atoms = has_atoms ? atom_first[n] : 0;
  const int64_t total_edges = std::accumulate(edge_counts.begin(), edge_counts.end(), int64_t(0));

  Batch batch;
  for (size_t f = 0; f < fields.size(); ++f) {
    const FieldInfo& info = fields[f];
    if (info.level == FieldLevel::AtomPointer) {
      batch.fields.emplace_back(info.name, offsets_from_counts(atom_counts));
      continue;
    }
    if (info.level == FieldLevel::EdgePointer) {
      batch.fields.emplace_back(info.name, offsets_from_counts(edge_counts));
      continue;
    }
    if (info.level == FieldLevel::AtomSample) {
      batch.fields.emplace_back(info.name, sample_of_rows(atom_counts));
      continue;
    }
    const int64_t row_bytes = info.sample_bytes();
    core::Shape shape = info.sample_shape;
    if (info.level == FieldLevel::EdgeAtoms) {
      shape = {2, total_edges};
    } else {
      shape.insert(0, info.level == FieldLevel::Atom   ? total_atoms
                      : info.level == FieldLevel::Edge ? total_edges
                                                       : n);
    }
    core::Tensor out = empty_batch_tensor(shape, info.dtype);
    char* to = static_cast<char*>(out.data_ptr());
    std::vector<core::Tensor> sources;
    for (size_t p = 0; p < parts.size(); ++p) {
      core::Tensor source = parts[p].fields[f].second.contiguous();
      MPIGRAD_CHECK(source.dtype() == info.dtype, "gather_structures: part ", p, " field '",
                    info.name, "' is ", source.dtype(), ", expected ", info.dtype);
      sources.push_back(std::move(source));
    }
    int64_t written = 0;  // rows (edges for EdgeAtoms) written so far
    for (int64_t i = 0; i < n; ++i) {
      const StructurePick& pick = picks[size_t(i)];
      const size_t s = size_t(pick.position);
      const core::Tensor& source = sources[pick.part];
      const char* from = static_cast<const char*>(source.data_ptr());
      if (info.level == FieldLevel::EdgeAtoms) {
        const int64_t part_edges = source.shape().size() == 2 ? source.shape()[1] : -1;
        MPIGRAD_CHECK(source.shape().size() == 2 && source.shape()[0] == 2,
                      "gather_structures: ", "field '", info.name, "' has shape ", source.shape(),
                      ", expected [2, E]");
        const int64_t first = edges_ptr[pick.part][s], count = edges_ptr[pick.part][s + 1] - first;
        const int64_t shift = atom_first[i] - atoms_ptr[pick.part][s];
        const int64_t* values = reinterpret_cast<const int64_t*>(from);
        int64_t* target = out.data<int64_t>();
        for (int row = 0; row < 2; ++row) {
          for (int64_t e = 0; e < count; ++e) {
            target[row * total_edges + written + e] = values[row * part_edges + first + e] + shift;
          }
        }
        written += count;
        continue;
      }
      int64_t first = int64_t(s), count = 1;
      if (info.level == FieldLevel::Atom || info.level == FieldLevel::Edge) {
        const std::vector<int64_t>& ptr =
            info.level == FieldLevel::Atom ? atoms_ptr[pick.part] : edges_ptr[pick.part];
        first = ptr[s];
        count = ptr[s + 1] - first;
      }
      MPIGRAD_CHECK((first + count) * row_bytes <= source.nbytes(), "gather_structures: field '",
                    info.name, "' of part ", pick.part, " has shape ", source.shape(),
                    ", too few rows for its pointers");
      std::memcpy(to + written * row_bytes, from + first * row_bytes, size_t(count * row_bytes));
      written += count;
    }
    batch.fields.emplace_back(info.name, std::move(out));
  }
  return batch;
}

}  // namespace mpigrad::data
