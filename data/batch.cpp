#include "mpigrad/data/batch.h"

#include "mpigrad/core/error.h"
#include "mpigrad/data/dataset.h"

namespace mpigrad::data {

namespace {
std::string field_names(const std::vector<std::pair<std::string, core::Tensor>>& fields) {
  std::string names;
  for (const auto& [name, tensor] : fields) names += (names.empty() ? "" : ", ") + name;
  return names.empty() ? "none" : names;
}
}  // namespace

std::string_view field_level_name(FieldLevel level) {
  switch (level) {
    case FieldLevel::Sample:
      return "sample";
    case FieldLevel::Atom:
      return "atom";
    case FieldLevel::Edge:
      return "edge";
    case FieldLevel::AtomPointer:
      return "atom pointer";
    case FieldLevel::EdgePointer:
      return "edge pointer";
    case FieldLevel::AtomSample:
      return "atom sample";
    case FieldLevel::EdgeAtoms:
      return "edge atoms";
  }
  return "unknown";
}

bool Batch::has(const std::string& name) const {
  for (const auto& field : fields) {
    if (field.first == name) return true;
  }
  return false;
}

const core::Tensor& Batch::operator[](const std::string& name) const {
  for (const auto& field : fields) {
    if (field.first == name) return field.second;
  }
  core::fail("Batch: no field '", name, "' (fields: ", field_names(fields), ")");
}

core::Tensor& Batch::operator[](const std::string& name) {
  for (auto& field : fields) {
    if (field.first == name) return field.second;
  }
  core::fail("Batch: no field '", name, "' (fields: ", field_names(fields), ")");
}

void Batch::set(const std::string& name, core::Tensor tensor) {
  for (auto& field : fields) {
    if (field.first == name) {
      field.second = std::move(tensor);
      return;
    }
  }
  fields.emplace_back(name, std::move(tensor));
}

const FieldInfo& Dataset::field(const std::string& name) const {
  std::string names;
  for (const auto& info : fields()) {
    if (info.name == name) return info;
    names += (names.empty() ? "" : ", ") + info.name;
  }
  core::fail(describe(), ": no field '", name, "' (fields: ", names, ")");
}

void check_indices(std::span<const int64_t> indices, int64_t size, const std::string& what) {
  for (int64_t index : indices) {
    MPIGRAD_CHECK(index >= 0 && index < size, what, ": index ", index, " out of range [0, ", size,
                  ")");
  }
}

}  // namespace mpigrad::data
