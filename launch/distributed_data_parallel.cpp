#include "mpigrad/launch/distributed_data_parallel.h"

#include <algorithm>
#include <sstream>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::launch {

GradCompression parse_grad_compression(std::string_view text) {
  return core::parse_enum<GradCompression>(text, kGradCompressionNames, "gradient compression");
}

struct DistributedDataParallel::Bucket {
  core::DType dtype;
  core::Device device;
  core::Tensor flat;                // the parameters' gradients, back to back
  std::vector<size_t> parameters;   // indices into parameters_
  std::vector<int64_t> offsets;     // element offset of each parameter in flat
  size_t pending = 0;               // parameters not yet ready in this backward
  core::Tensor wire;                // what goes over the network (flat or its 16-bit copy)
  WorkPtr work;                     // the communicator's all-reduce, until wait_for_buckets
};

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

// One line per tensor: "name dtype [shape]", the model's signature compared across ranks.
std::string describe(const std::vector<NamedTensor>& tensors, const char* kind) {
  std::ostringstream out;
  for (const auto& [name, tensor] : tensors) {
    out << kind << ' ' << name << ' ' << tensor.dtype() << ' ' << tensor.shape() << '\n';
  }
  return out.str();
}

std::vector<NamedTensor> module_parameters(const nn::Module& module, bool trainable) {
  std::vector<NamedTensor> out;
  for (auto& [name, tensor] : module.named_parameters()) {
    if (tensor.requires_grad() == trainable) out.push_back({name, tensor});
  }
  return out;
}

std::vector<NamedTensor> all_buffers(const nn::Module& module) {
  std::vector<NamedTensor> out;
  for (auto& [name, tensor] : module.named_buffers()) out.push_back({name, tensor});
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::vector<NamedTensor> parameters,
                                                 std::vector<NamedTensor> buffers,
                                                 Communicator& communicator, DdpOptions options)
    : DistributedDataParallel(std::move(parameters), std::move(buffers), {}, communicator,
                              options) {}

DistributedDataParallel::DistributedDataParallel(std::vector<NamedTensor> parameters,
                                                 std::vector<NamedTensor> buffers,
                                                 const std::vector<NamedTensor>& frozen,
                                                 Communicator& communicator, DdpOptions options)
    : parameters_(std::move(parameters)), buffers_(std::move(buffers)),
      communicator_(communicator), options_(options) {
  MPIGRAD_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
                "DistributedDataParallel: bucket_cap_mb and first_bucket_cap_mb must be positive");
  for (const auto& [name, tensor] : parameters_) {
    MPIGRAD_CHECK(tensor.defined() && tensor.is_leaf() && tensor.requires_grad(),
                  "DistributedDataParallel: parameter '", name,
                  "' must be a leaf tensor that requires grad");
    MPIGRAD_CHECK(tensor.is_contiguous(), "DistributedDataParallel: parameter '", name,
                  "' must be contiguous");
  }
  verify_same_model_across_ranks(frozen);
  broadcast_from_rank0(parameters_);
  broadcast_from_rank0(frozen);
  broadcast_from_rank0(buffers_);
  build_buckets();
  ready_.assign(parameters_.size(), false);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    hook_ids_.push_back(parameters_[i].tensor.register_grad_ready_hook(
        [this, i](core::Tensor&) { mark_ready(i); }));
  }
}

DistributedDataParallel::DistributedDataParallel(nn::Module& module, Communicator& communicator,
                                                 DdpOptions options)
    : DistributedDataParallel(module_parameters(module, true), all_buffers(module),
                              module_parameters(module, false), communicator, options) {
  module_ = &module;
}

core::Tensor DistributedDataParallel::forward(const core::Tensor& input) {
  prepare_for_backward();
  return module().forward(input);
}

nn::Module& DistributedDataParallel::module() {
  MPIGRAD_CHECK(module_ != nullptr,
                "DistributedDataParallel::module: this instance was built from tensors, not a "
                "module");
  return *module_;
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameters_[i].tensor.remove_grad_ready_hook(hook_ids_[i]);
  }
  // A bucket still in flight (an exception left backward early) must finish before its buffer
  // can be freed; Work's destructor waits, under the communicator's timeout, and so does the
  // shared-memory averaging's.
  for (auto& bucket : buckets_) bucket->work.reset();
}

void DistributedDataParallel::verify_same_model_across_ranks(
    const std::vector<NamedTensor>& frozen) {
  // The options decide the buckets and the transport, so they must agree too.
  std::ostringstream options;
  options << "options bucket_cap_mb=" << options_.bucket_cap_mb
          << " first_bucket_cap_mb=" << options_.first_bucket_cap_mb
          << " find_unused_parameters=" << options_.find_unused_parameters
          << " broadcast_buffers=" << options_.broadcast_buffers
          << " compression=" << int(options_.compression)
          << " shared_memory=" << options_.shared_memory << '\n';
  std::string mine = describe(parameters_, "parameter") + describe(buffers_, "buffer") +
                     describe(frozen, "frozen parameter") + options.str();
  int size = communicator_.size();
  // On the communicator's device: NCCL moves only GPU tensors.
  const core::Device device = communicator_.device();
  core::Tensor length =
      core::Tensor::from_vector<int64_t>({int64_t(mine.size())}, {1}).to(device);
  core::Tensor lengths = core::zeros({size}, core::TensorOptions(core::kInt64).device(device));
  communicator_.all_gather(length, lengths);
  std::vector<int64_t> counts = lengths.to_vector<int64_t>();
  int64_t total = 0;
  for (int64_t count : counts) total += count;
  core::Tensor local = core::Tensor::from_vector<uint8_t>(
                           std::vector<uint8_t>(mine.begin(), mine.end()), {int64_t(mine.size())})
                           .to(device);
  core::Tensor all = core::zeros({total}, core::TensorOptions(core::kUInt8).device(device));
  communicator_.all_gather_v(local, all, counts);
  std::vector<uint8_t> bytes = all.to_vector<uint8_t>();

  // Every rank compares every rank with rank 0, so all of them raise the same error.
  std::vector<std::string> reference;
  int64_t start = 0;
  for (int r = 0; r < size; ++r) {
    std::string text(bytes.begin() + start, bytes.begin() + start + counts[size_t(r)]);
    start += counts[size_t(r)];
    std::vector<std::string> lines = split_lines(text);
    if (r == 0) {
      reference = lines;
      continue;
    }
    for (size_t i = 0; i < std::max(lines.size(), reference.size()); ++i) {
      std::string theirs = i < lines.size() ? lines[i] : "(nothing)";
      std::string ours = i < reference.size() ? reference[i] : "(nothing)";
      if (theirs != ours) {
        const bool options_differ = ours.starts_with("options") && theirs.starts_with("options");
        core::fail("DistributedDataParallel: the ",
                   options_differ ? "DDP options differ" : "model differs",
                   " between ranks (communicator '", communicator_.name(), "'): entry ", i,
                   " is '", ours, "' on rank 0 but '", theirs, "' on rank ", r,
                   options_differ ? "; every rank must pass the same DdpOptions"
                                  : "; every rank must build the same model");
      }
    }
  }
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<NamedTensor>& tensors) {
  core::NoGradGuard no_grad;
  for (const auto& [name, tensor] : tensors) {
    if (tensor.numel() == 0) continue;
    MPIGRAD_CHECK(tensor.is_contiguous(), "DistributedDataParallel: '", name,
                  "' must be contiguous to be broadcast");
    communicator_.broadcast(tensor, 0);
    tensor.storage()->bump_version();
  }
}

void DistributedDataParallel::build_buckets() {
  bucket_of_.assign(parameters_.size(), 0);
  // Reverse registration order approximates the order backward produces gradients. A bucket
  // holds one dtype on one device and closes at its size cap.
  std::vector<int64_t> sizes;
  for (size_t k = parameters_.size(); k-- > 0;) {
    const core::Tensor& param = parameters_[k].tensor;
    double cap_mb = buckets_.size() <= 1 ? options_.first_bucket_cap_mb : options_.bucket_cap_mb;
    bool fits = false;
    if (!buckets_.empty()) {
      Bucket& current = *buckets_.back();
      int64_t bytes = (sizes.back() + param.numel()) * param.element_size();
      fits = current.dtype == param.dtype() && current.device == param.device() &&
             (sizes.back() == 0 || double(bytes) <= cap_mb * double(kMiB));
    }
    if (!fits) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->dtype = param.dtype();
      buckets_.back()->device = param.device();
      sizes.push_back(0);
    }
    Bucket& bucket = *buckets_.back();
    bucket.parameters.push_back(k);
    bucket.offsets.push_back(sizes.back());
    sizes.back() += param.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  create_shared_buckets(sizes);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    bucket.flat = shared_ ? shared_->buffer(b)
                          : core::zeros({sizes[b]},
                                        core::TensorOptions(bucket.dtype).device(bucket.device));
  }
  for (size_t i = 0; i < parameters_.size(); ++i) attach_gradient(i, /*zero=*/false);
}

// Puts the buckets in shared memory when every condition holds; the decision is the same on
// every rank (the options and the model are).
void DistributedDataParallel::create_shared_buckets(const std::vector<int64_t>& sizes) {
  bool on_host = std::all_of(buckets_.begin(), buckets_.end(),
                             [](const auto& bucket) { return bucket->device.is_cpu(); });
  if (!options_.shared_memory) {
    why_not_shared_memory_ = "shared_memory is off";
  } else if (communicator_.size() == 1) {
    why_not_shared_memory_ = "a single rank has nothing to average";
  } else if (!on_host) {
    why_not_shared_memory_ = "the gradients are on a GPU";
  } else if (communicator_.backend() != Backend::Mpi) {
    why_not_shared_memory_ = "the communicator is not an MPI one";
  } else if (options_.compression != GradCompression::None) {
    why_not_shared_memory_ = "gradient compression goes through the communicator";
  } else {
    std::vector<SharedBufferSpec> specs;
    for (size_t b = 0; b < buckets_.size(); ++b) specs.push_back({buckets_[b]->dtype, sizes[b]});
    shared_ = SharedMemoryAllReduce::create(communicator_, specs, options_.timeout_seconds,
                                            &why_not_shared_memory_);
  }
}

// Makes parameter i's .grad the view of its bucket slot, keeping an existing gradient's values
// unless `zero`.
void DistributedDataParallel::attach_gradient(size_t index, bool zero) {
  core::NoGradGuard no_grad;
  Bucket& bucket = *buckets_[bucket_of_[index]];
  size_t slot = size_t(std::find(bucket.parameters.begin(), bucket.parameters.end(), index) -
                       bucket.parameters.begin());
  core::Tensor& param = parameters_[index].tensor;
  core::Tensor view =
      bucket.flat.narrow(0, bucket.offsets[slot], param.numel()).view(param.shape());
  core::Tensor existing = param.grad();
  if (existing.defined() && existing.storage() == bucket.flat.storage()) return;
  if (existing.defined() && !zero) {
    view.copy_(existing);
  } else {
    view.zero_();
  }
  param.set_grad(view);
}

void DistributedDataParallel::prepare_for_backward() {
  // A backward that ended in an exception may have left buckets in flight.
  wait_for_buckets();
  backward_in_progress_ = false;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    // A grad that zero_grad reset to undefined (or replaced) is re-attached as a zeroed view.
    core::Tensor grad = parameters_[i].tensor.grad();
    if (!grad.defined() || grad.storage() != buckets_[bucket_of_[i]]->flat.storage()) {
      attach_gradient(i, /*zero=*/!grad.defined());
    }
  }
  if (sync_enabled_ && options_.broadcast_buffers) broadcast_from_rank0(buffers_);
}

void DistributedDataParallel::mark_ready(size_t index) {
  // A gradient reset to none after the last prepare_for_backward() was recreated by autograd
  // outside the bucket: move it back into its slot so the all-reduce sees it.
  const core::Tensor& grad = parameters_[index].tensor.grad();
  if (grad.defined() && grad.storage() != buckets_[bucket_of_[index]]->flat.storage()) {
    attach_gradient(index, /*zero=*/false);
  }
  if (!sync_enabled_) return;  // no_sync: gradients just accumulate in their slots
  if (!backward_in_progress_) {
    backward_in_progress_ = true;
    std::fill(ready_.begin(), ready_.end(), false);
    for (auto& bucket : buckets_) bucket->pending = bucket->parameters.size();
    next_bucket_to_launch_ = 0;
    core::queue_backward_callback([this] { finish_backward(); });
  }
  if (ready_[index]) return;
  ready_[index] = true;
  --buckets_[bucket_of_[index]]->pending;
  launch_ready_buckets();
  started_during_backward_ = int(next_bucket_to_launch_);
  // Averaging advances only when someone calls in: at every gradient, this rank does its share
  // of the shared buckets all ranks have finished, or pokes MPI's nonblocking collectives.
  if (shared_) {
    shared_->progress();
    return;
  }
  for (size_t b = 0; b < next_bucket_to_launch_; ++b) {
    if (buckets_[b]->work && !buckets_[b]->work->test()) break;  // the later ones are behind
  }
}

// Starts every complete bucket from the next one in order; a complete bucket behind an
// incomplete one waits, so all ranks issue the same collectives in the same order.
void DistributedDataParallel::launch_ready_buckets() {
  while (next_bucket_to_launch_ < buckets_.size() &&
         buckets_[next_bucket_to_launch_]->pending == 0) {
    Bucket& bucket = *buckets_[next_bucket_to_launch_];
    if (shared_) {
      shared_->start(next_bucket_to_launch_++);
      continue;
    }
    switch (options_.compression) {
      case GradCompression::None: bucket.wire = bucket.flat; break;
      case GradCompression::BFloat16: bucket.wire = bucket.flat.to(core::kBFloat16); break;
      case GradCompression::Float16: bucket.wire = bucket.flat.to(core::kFloat16); break;
    }
    bucket.work = communicator_.all_reduce_async(bucket.wire, ReduceOp::Avg);
    ++next_bucket_to_launch_;
  }
}

void DistributedDataParallel::finish_backward() {
  backward_in_progress_ = false;
  std::vector<std::string> unused;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!ready_[i]) unused.push_back(parameters_[i].name);
  }
  if (!unused.empty() && !options_.find_unused_parameters) {
    std::ostringstream names;
    for (size_t i = 0; i < unused.size(); ++i) names << (i ? ", " : "") << unused[i];
    // Finish what is in flight before raising, so no collective is left dangling.
    wait_for_buckets();
    core::fail("DistributedDataParallel: ", unused.size(),
               " parameter(s) received no gradient in this backward: ", names.str(),
               ". Make every parameter take part in the loss, or set find_unused_parameters "
               "(they are then reduced as zero gradients)");
  }
  // find_unused_parameters: their slots hold zeros (or what no_sync steps accumulated).
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!ready_[i]) {
      core::Tensor grad = parameters_[i].tensor.grad();
      if (!grad.defined() || grad.storage() != buckets_[bucket_of_[i]]->flat.storage()) {
        attach_gradient(i, /*zero=*/!grad.defined());
      }
      ready_[i] = true;
      --buckets_[bucket_of_[i]]->pending;
    }
  }
  launch_ready_buckets();
  wait_for_buckets();
}

// Waits for every bucket's all-reduce and brings compressed results back into the buckets.
void DistributedDataParallel::wait_for_buckets() {
  core::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    if (shared_) {
      // Returns at once for a bucket not in flight; after a failure it repeats the error.
      shared_->wait(b);
      continue;
    }
    if (!bucket.work) continue;  // not in flight
    bucket.work->wait();
    bucket.work.reset();
    if (!bucket.wire.is_same(bucket.flat)) bucket.flat.copy_(bucket.wire);
    bucket.wire = core::Tensor();
  }
}

int DistributedDataParallel::ranks_with_data(bool has_batch) {
  core::Tensor flag =
      core::Tensor::from_vector<int32_t>({has_batch ? 1 : 0}, {1}).to(communicator_.device());
  communicator_.all_reduce(flag, ReduceOp::Sum);
  return flag.item<int32_t>();
}

void DistributedDataParallel::join_backward() {
  MPIGRAD_CHECK(sync_enabled_, "DistributedDataParallel::join_backward inside no_sync()");
  prepare_for_backward();
  for (auto& bucket : buckets_) bucket->flat.zero_();
  std::fill(ready_.begin(), ready_.end(), true);
  for (auto& bucket : buckets_) bucket->pending = 0;
  next_bucket_to_launch_ = 0;
  launch_ready_buckets();
  wait_for_buckets();
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : buckets_) {
    layout.emplace_back();
    for (size_t index : bucket->parameters) layout.back().push_back(parameters_[index].name);
  }
  return layout;
}

}  // namespace mpigrad::launch
