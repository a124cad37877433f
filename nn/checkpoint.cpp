#include "mpigrad/nn/checkpoint.h"

#include <algorithm>
#include <future>
#include <cstring>

#include "mpigrad/core/crc32c.h"
#include "mpigrad/core/hdf5.h"

namespace mpigrad::nn {

namespace {

namespace hdf5 = core::hdf5;

constexpr const char* kFormat = "mpigrad-checkpoint";
constexpr int64_t kFormatVersion = 1;
// CRC-32C of the content (content_checksum); files written before it existed have none.
constexpr const char* kChecksum = "checksum_crc32c";

// "a/b/c" under `root` -> (group "/root/a/b", leaf "c").
std::pair<std::string, std::string> split_key(const std::string& root, const std::string& key) {
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos) return {root, key};
  return {root + "/" + key.substr(0, slash), key.substr(slash + 1)};
}

// Writes a '/'-keyed StateDict (optimizer, scheduler, hooks): tensors as datasets, scalars as
// attributes of their group.
void write_nested(hdf5::File& file, const std::string& root, const StateDict& state) {
  file.create_group(root);
  for (const auto& [key, tensor] : state.tensors()) file.write_tensor(root + "/" + key, tensor);
  for (const auto& [key, value] : state.scalars()) {
    const auto [group, name] = split_key(root, key);
    file.create_group(group);
    file.write_attribute(group, name, value);
  }
}

// Writes a dotted StateDict (the model): one dataset per entry directly under root.
void write_flat(hdf5::File& file, const std::string& root, const StateDict& state) {
  file.create_group(root);
  for (const auto& [key, tensor] : state.tensors()) {
    MPIGRAD_CHECK(key.find('/') == std::string::npos, "save_checkpoint: model key '", key,
                  "' contains '/'");
    file.write_tensor(root + "/" + key, tensor);
  }
  for (const auto& [key, value] : state.scalars()) file.write_attribute(root, key, value);
}

void read_group(const hdf5::File& file, const std::string& root, const std::string& prefix,
                core::Device device, StateDict& out) {
  for (const std::string& name : file.list_attributes(root)) {
    out.set_scalar(prefix + name, file.read_double_attribute(root, name));
  }
  for (const std::string& member : file.list(root)) {
    const std::string path = root + "/" + member;
    switch (file.kind(path)) {
      case hdf5::ObjectKind::Dataset:
        out.set(prefix + member, file.read_tensor(path).to(device));
        break;
      case hdf5::ObjectKind::Group:
        read_group(file, path, prefix + member + "/", device, out);
        break;
      default:
        core::fail("load_checkpoint: ", file.path(), ": unexpected object ", path);
    }
  }
}

// Every tensor's key, dtype, shape and bytes, in key order (the file lists members by name, so
// the order a StateDict was filled in must not matter), and the epoch and step.
uint32_t add_tensors(uint32_t crc, const std::string& root, const StateDict& state) {
  std::vector<const std::pair<std::string, core::Tensor>*> entries;
  for (const auto& entry : state.tensors()) entries.push_back(&entry);
  std::sort(entries.begin(), entries.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  for (const auto* entry : entries) {
    const std::string key = root + "/" + entry->first;
    crc = core::crc32c(key.data(), key.size() + 1, crc);
    const core::Tensor cpu = entry->second.to(core::kCPU).contiguous();
    const int64_t dtype = static_cast<int64_t>(cpu.dtype());
    crc = core::crc32c(&dtype, sizeof(dtype), crc);
    for (int64_t extent : cpu.shape()) crc = core::crc32c(&extent, sizeof(extent), crc);
    if (cpu.nbytes() > 0)
      crc = core::crc32c(cpu.data_ptr(), static_cast<size_t>(cpu.nbytes()), crc);
  }
  return crc;
}

int64_t content_checksum(const CheckpointData& data) {
  uint32_t crc = 0;
  crc = core::crc32c(&data.epoch, sizeof(data.epoch), crc);
  crc = core::crc32c(&data.step, sizeof(data.step), crc);
  crc = add_tensors(crc, "/model", data.model);
  crc = add_tensors(crc, "/optimizer", data.optimizer);
  crc = add_tensors(crc, "/scheduler", data.scheduler);
  for (const auto& [name, state] : data.hooks) crc = add_tensors(crc, "/hooks/" + name, state);
  return crc;
}

StateDict read_optional(const hdf5::File& file, const std::string& root, core::Device device) {
  StateDict out;
  if (file.kind(root) == hdf5::ObjectKind::Group) read_group(file, root, "", device, out);
  return out;
}

// Whether every tensor of the checkpoint is in host memory.
bool all_on_cpu(const CheckpointData& data) {
  const auto on_cpu = [](const StateDict& state) {
    for (const auto& [key, tensor] : state.tensors()) {
      if (!tensor.device().is_cpu()) return false;
    }
    return true;
  };
  if (!on_cpu(data.model) || !on_cpu(data.optimizer) || !on_cpu(data.scheduler)) return false;
  for (const auto& [name, state] : data.hooks) {
    if (!on_cpu(state)) return false;
  }
  return true;
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointData& data) {
  // The content checksum reads every byte once more. On a thread of its own it runs while HDF5
  // writes (it makes no HDF5 call and only reads the tensors): GPT-2 124M with its AdamW state,
  // 1.4 GiB, 0.42-0.47 s a write with the checksum first, 0.31-0.32 s beside it, against
  // 0.29-0.46 s for the bare bytes (mpigrad-bench-core --checkpoint-mb 1424, 2-core VM, idle).
  // Device tensors would be copied from that thread without its device set: those stay serial.
  std::future<int64_t> checksum =
      std::async(all_on_cpu(data) ? std::launch::async : std::launch::deferred,
                 [&data] { return content_checksum(data); });
  hdf5::AtomicFileWriter writer(path);
  hdf5::File& file = writer.file();
  file.write_attribute("/", "format", kFormat);
  file.write_attribute("/", "format_version", kFormatVersion);
  file.write_attribute("/", "epoch", data.epoch);
  file.write_attribute("/", "step", data.step);
  file.write_attribute("/", "world_size", data.world_size);
  file.write_attribute("/", "config", data.config);
  file.write_attribute("/", "batch_in_epoch", data.batch_in_epoch);
  file.write_attribute("/", "micro_batches", data.micro_batches);
  file.write_attribute("/", "epoch_batches", data.epoch_batches);
  file.write_attribute("/", "epoch_order_crc32c", data.epoch_order_crc32c);
  write_flat(file, "/model", data.model);
  write_nested(file, "/optimizer", data.optimizer);
  write_nested(file, "/scheduler", data.scheduler);
  for (const auto& [name, state] : data.hooks) {
    MPIGRAD_CHECK(!name.empty() && name.find('/') == std::string::npos,
                  "save_checkpoint: hook name '", name, "' must be non-empty and without '/'");
    write_nested(file, "/hooks/" + name, state);
  }
  file.create_group("/rng");
  for (const auto& [name, generator] : data.rng) {
    // Int64 holds the uint64 bit patterns: HDF5 via h5py reads them as int64 either way.
    const uint64_t raw[2] = {generator.seed(), generator.offset()};
    std::vector<int64_t> bits(2);
    std::memcpy(bits.data(), raw, sizeof(raw));
    file.write_tensor("/rng/" + name, core::Tensor::from_vector(bits, {2}));
  }
  file.write_attribute("/", kChecksum, checksum.get());
  writer.commit();
}

CheckpointData load_checkpoint(const std::string& path, core::Device device) {
  hdf5::File file = hdf5::File::open(path);
  MPIGRAD_CHECK(
      file.has_attribute("/", "format") && file.read_string_attribute("/", "format") == kFormat,
      "load_checkpoint: ", path,
      " is an HDF5 file but not an mpigrad checkpoint (no "
      "format attribute '",
      kFormat, "')");
  const int64_t version = file.read_int_attribute("/", "format_version");
  MPIGRAD_CHECK(version == kFormatVersion, "load_checkpoint: ", path, " has format version ",
                version, ", this build reads version ", kFormatVersion);
  CheckpointData data;
  data.epoch = file.read_int_attribute("/", "epoch");
  data.step = file.read_int_attribute("/", "step");
  data.world_size = file.read_int_attribute("/", "world_size");
  // Absent from checkpoints written before mid-epoch saving: those are all at an epoch's end.
  for (auto [name, field] : {std::pair{"batch_in_epoch", &data.batch_in_epoch},
                             std::pair{"micro_batches", &data.micro_batches},
                             std::pair{"epoch_batches", &data.epoch_batches},
                             std::pair{"epoch_order_crc32c", &data.epoch_order_crc32c}}) {
    if (file.has_attribute("/", name)) *field = file.read_int_attribute("/", name);
  }
  data.config = file.read_string_attribute("/", "config");
  MPIGRAD_CHECK(file.kind("/model") == hdf5::ObjectKind::Group, "load_checkpoint: ", path,
                " has no /model group");
  for (const std::string& name : file.list("/model")) {
    data.model.set(name, file.read_tensor("/model/" + name).to(device));
  }
  data.optimizer = read_optional(file, "/optimizer", device);
  data.scheduler = read_optional(file, "/scheduler", device);
  if (file.kind("/hooks") == hdf5::ObjectKind::Group) {
    for (const std::string& name : file.list("/hooks")) {
      data.hooks[name] = read_optional(file, "/hooks/" + name, device);
    }
  }
  if (file.kind("/rng") == hdf5::ObjectKind::Group) {
    for (const std::string& name : file.list("/rng")) {
      core::Tensor t = file.read_tensor("/rng/" + name);
      MPIGRAD_CHECK(t.dtype() == core::kInt64 && t.numel() == 2, "load_checkpoint: ", path,
                    ": /rng/", name, " must be Int64 [2] (seed, offset), found ", t.dtype(), " ",
                    t.shape());
      const std::vector<int64_t> bits = t.to_vector<int64_t>();
      uint64_t raw[2];
      std::memcpy(raw, bits.data(), sizeof(raw));
      data.rng.emplace_back(name, core::Generator(raw[0], raw[1]));
    }
  }
  if (file.has_attribute("/", kChecksum)) {
    const int64_t stored = file.read_int_attribute("/", kChecksum);
    const int64_t computed = content_checksum(data);
    MPIGRAD_CHECK(stored == computed, "load_checkpoint: ", path,
                  ": the content does not match its checksum (stored ", kChecksum, " ", stored,
                  ", computed ", computed, "): the file is corrupt");
  }
  return data;
}

void save_checkpoint(const std::string& path, const Module& model, const Optimizer* optimizer,
                     const LRScheduler* scheduler, int64_t epoch, int64_t step, int64_t world_size,
                     const std::string& config) {
  CheckpointData data;
  data.model = model.state_dict();
  if (optimizer) data.optimizer = optimizer->state_dict();
  if (scheduler) data.scheduler = scheduler->state_dict();
  for (const auto& [name, generator] : model.named_generators()) {
    data.rng.emplace_back("model." + name, *generator);
  }
  data.epoch = epoch;
  data.step = step;
  data.world_size = world_size;
  data.config = config;
  save_checkpoint(path, data);
}

CheckpointData load_checkpoint_into(const std::string& path, Module& model, Optimizer* optimizer,
                                    LRScheduler* scheduler) {
  CheckpointData data = load_checkpoint(path);
  apply_checkpoint(data, path, model, optimizer, scheduler);
  return data;
}

void apply_checkpoint(const CheckpointData& data, const std::string& path, Module& model,
                      Optimizer* optimizer, LRScheduler* scheduler) {
  // Dtypes must match exactly here: a checkpoint resumes the same run.
  for (const auto& [key, target] : model.state_dict().tensors()) {
    const core::Tensor* stored = data.model.find(key);
    if (stored == nullptr) continue;  // reported by load_state_dict below
    MPIGRAD_CHECK(stored->shape() == target.shape(), "load_checkpoint: ", path, ": '/model/", key,
                  "' has shape ", stored->shape(), ", the model expects ", target.shape());
    MPIGRAD_CHECK(stored->dtype() == target.dtype(), "load_checkpoint: ", path, ": '/model/", key,
                  "' has dtype ", stored->dtype(), ", the model expects ", target.dtype());
  }
  model.load_state_dict(data.model, true);
  if (optimizer && !data.optimizer.empty()) optimizer->load_state_dict(data.optimizer);
  if (scheduler && !data.scheduler.empty()) scheduler->load_state_dict(data.scheduler);
  for (const auto& [name, generator] : model.named_generators()) {
    for (const auto& [stored_name, stored] : data.rng) {
      if (stored_name == "model." + name) generator->set_state(stored.seed(), stored.offset());
    }
  }
}

}  // namespace mpigrad::nn
