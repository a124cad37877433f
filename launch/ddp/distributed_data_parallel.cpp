#include "mpigrad/launch/ddp/distributed_data_parallel.h"

#include <algorithm>
#include <sstream>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/launch/observe/timeline.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::launch {

GradCompression parse_grad_compression(std::string_view text) {
  return core::parse_enum<GradCompression>(text, kGradCompressionNames, "gradient compression");
}

struct DistributedDataParallel::Bucket {
  core::DType dtype;
  core::Device device;
  int64_t numel = 0;
  std::vector<size_t> parameters;   // indices into parameters_
  std::vector<int64_t> offsets;     // element offset of each parameter in flat
  core::Tensor flat;                // the parameters' gradients, back to back (transport memory)
  std::vector<core::Tensor> views;  // each parameter's .grad, a view of flat
  size_t pending = 0;               // parameters not yet ready in this backward
};

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
// Elements per rank the last bucket is padded to a multiple of under carry_found_inf: a cache
// line holds 8 to 32 elements of the float dtypes, so every transport's shards stay non-empty.
constexpr int64_t kFoundInfGranule = 32;

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
    : parameters_(std::move(parameters)),
      buffers_(std::move(buffers)),
      communicator_(communicator),
      options_(options) {
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
  // Reverse registration order approximates the order backward produces gradients.
  std::vector<size_t> order(parameters_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  install_buckets(plan_buckets(order));
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
  // can be freed: each transport's destructor waits for it, under its timeout.
  transport_.reset();
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
          << " shared_memory=" << options_.shared_memory
          << " transport=" << transport_kind_name(options_.transport) << " zero=" << options_.zero
          << " carry_found_inf=" << options_.carry_found_inf << '\n';
  std::string mine = describe(parameters_, "parameter") + describe(buffers_, "buffer") +
                     describe(frozen, "frozen parameter") + options.str();
  int size = communicator_.size();
  // On the communicator's device: NCCL moves only GPU tensors.
  const core::Device device = communicator_.device();
  core::Tensor length = core::Tensor::from_vector<int64_t>({int64_t(mine.size())}, {1}).to(device);
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
                   " between ranks (communicator '", communicator_.name(), "'): entry ", i, " is '",
                   ours, "' on rank 0 but '", theirs, "' on rank ", r,
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

// Groups the parameters, taken in `order`, into buckets: one dtype and device per bucket, closed
// at its size cap (the first bucket's cap is first_bucket_cap_mb).
std::vector<std::unique_ptr<DistributedDataParallel::Bucket>> DistributedDataParallel::plan_buckets(
    const std::vector<size_t>& order) const {
  std::vector<std::unique_ptr<Bucket>> buckets;
  for (size_t k : order) {
    const core::Tensor& param = parameters_[k].tensor;
    double cap_mb = buckets.size() <= 1 ? options_.first_bucket_cap_mb : options_.bucket_cap_mb;
    bool fits = false;
    if (!buckets.empty()) {
      const Bucket& current = *buckets.back();
      int64_t bytes = (current.numel + param.numel()) * param.element_size();
      fits = current.dtype == param.dtype() && current.device == param.device() &&
             (current.numel == 0 || double(bytes) <= cap_mb * double(kMiB));
    }
    if (!fits) {
      buckets.push_back(std::make_unique<Bucket>());
      buckets.back()->dtype = param.dtype();
      buckets.back()->device = param.device();
    }
    Bucket& bucket = *buckets.back();
    bucket.parameters.push_back(k);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += param.numel();
  }
  if (options_.zero && options_.carry_found_inf && !buckets.empty()) {
    // A zero tail so that every transport gives every rank a non-empty shard of the last bucket
    // (whole cache lines per rank of at most 32 elements each; see the header).
    const int64_t granule = int64_t(communicator_.size()) * kFoundInfGranule;
    Bucket& last = *buckets.back();
    last.numel = (last.numel + granule - 1) / granule * granule;
  }
  return buckets;
}

// Collective: chooses the transport for `buckets` (launch/ddp/transport_choice.h), makes every
// gradient a view of its slot, carrying over the values it held, and replaces the current
// buckets and transport (after which the old buffers are free).
void DistributedDataParallel::install_buckets(std::vector<std::unique_ptr<Bucket>> buckets) {
  std::vector<BucketSpec> specs;
  for (const auto& bucket : buckets) {
    specs.push_back({bucket->dtype, bucket->device, bucket->numel});
  }
  TransportRequest request;
  // The rebuild after the first step keeps the transport the setup chose (and its log line
  // true): asked for by name, it fails on every rank rather than quietly falling back.
  request.kind = transport_ ? transport_kind_ : options_.transport;
  request.shared_memory = options_.shared_memory;
  if (options_.compression == GradCompression::BFloat16) request.wire = core::kBFloat16;
  if (options_.compression == GradCompression::Float16) request.wire = core::kFloat16;
  request.timeout_seconds = options_.timeout_seconds;
  TransportChoice choice = choose_bucket_transport(communicator_, specs, request);

  core::NoGradGuard no_grad;
  std::vector<Slot> slots(parameters_.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = *buckets[b];
    bucket.flat = choice.transport->buffer(b).narrow(0, 0, bucket.numel);
    for (size_t i = 0; i < bucket.parameters.size(); ++i) {
      core::Tensor& param = parameters_[bucket.parameters[i]].tensor;
      core::Tensor view =
          bucket.flat.narrow(0, bucket.offsets[i], param.numel()).view(param.shape());
      core::Tensor existing = param.grad();
      if (existing.defined()) view.copy_(existing);  // the new buffer is zero otherwise
      param.set_grad(view);
      bucket.views.push_back(std::move(view));
      slots[bucket.parameters[i]] = {uint32_t(b), uint32_t(i)};
    }
  }
  buckets_ = std::move(buckets);
  slot_of_ = std::move(slots);
  // The rebuild asks for the kind the setup chose by name, so only the setup's line says why.
  if (!transport_) transport_description_ = std::move(choice.description);
  transport_ = std::move(choice.transport);
  if (options_.zero && options_.carry_found_inf && !buckets_.empty()) {
    const size_t last = buckets_.size() - 1;
    for (int q = 0; q < communicator_.size(); ++q) {
      const auto [first, end] = transport_->shard(last, q);
      MPIGRAD_CHECK(first < end && first < buckets_[last]->numel, communicator_.world_label(),
                    " DistributedDataParallel: carry_found_inf needs every rank's shard of the "
                    "last bucket non-empty, but rank ",
                    q, "'s is [", first, ", ", end, ") of ", buckets_[last]->numel,
                    " elements (a transport with coarser shards than DDP pads for)");
    }
  }
  transport_kind_ = choice.kind;
  if (timeline_ != nullptr) name_timeline_lanes();
}

void DistributedDataParallel::set_timeline(Timeline* timeline) {
  timeline_ = timeline;
  if (timeline_ != nullptr) name_timeline_lanes();
}

void DistributedDataParallel::name_timeline_lanes() {
  bucket_started_ns_.assign(buckets_.size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    timeline_->set_lane_name(int32_t(1 + b), "bucket " + std::to_string(b) + " averaging");
  }
}

void DistributedDataParallel::record_bucket_span(size_t bucket) {
  int64_t& started = bucket_started_ns_[bucket];
  if (started < 0) return;  // not in flight: its wait returned at once
  const Bucket& b = *buckets_[bucket];
  timeline_->record(TimelineEvent{"average bucket",
                                  started,
                                  Timeline::now_ns() - started,
                                  int32_t(1 + bucket),
                                  2,
                                  {"bucket", "bytes"},
                                  {int64_t(bucket), b.numel * core::element_size(b.dtype)}});
  started = -1;
}

// After the first synced backward: rank 0's ready order, broadcast so every rank lays out (and
// so issues) its buckets alike. Collective, called at the end of a synced step on every rank.
void DistributedDataParallel::rebuild_buckets_once() {
  if (buckets_rebuilt_ || options_.find_unused_parameters || options_.zero) return;
  const size_t count = parameters_.size();
  std::vector<int64_t> order(count, -1);
  if (ready_order_.size() == count) order.assign(ready_order_.begin(), ready_order_.end());
  ready_order_.clear();
  if (count == 0) return;
  core::Tensor shared =
      core::Tensor::from_vector<int64_t>(order, {int64_t(count)}).to(communicator_.device());
  communicator_.broadcast(shared, 0);
  order = shared.to_vector<int64_t>();
  if (order[0] < 0) return;  // rank 0 had no complete order (it joined): next synced step
  buckets_rebuilt_ = true;
  std::vector<size_t> by_readiness(order.begin(), order.end());
  auto planned = plan_buckets(by_readiness);
  bool same = planned.size() == buckets_.size();
  for (size_t b = 0; same && b < planned.size(); ++b) {
    same = planned[b]->parameters == buckets_[b]->parameters;
  }
  if (!same) install_buckets(std::move(planned));
}

const core::Tensor& DistributedDataParallel::view_of(size_t index) const {
  const Slot& slot = slot_of_[index];
  return buckets_[slot.bucket]->views[slot.index];
}

// Gives parameter `index` its bucket view back as .grad, carrying over a gradient it got
// elsewhere (autograd made a fresh one after a reset) or zero.
void DistributedDataParallel::attach_gradient(size_t index) {
  core::Tensor& param = parameters_[index].tensor;
  const core::Tensor& view = view_of(index);
  core::Tensor existing = param.grad();
  if (existing.is_same(view)) return;  // the common case, on every gradient hook
  core::NoGradGuard no_grad;
  core::Tensor target = view;
  if (existing.defined()) {
    target.copy_(existing);
  } else {
    target.zero_();
  }
  param.set_grad(view);
}

void DistributedDataParallel::prepare_for_backward() {
  // A backward that ended in an exception may have left buckets in flight.
  wait_for_buckets();
  backward_in_progress_ = false;
  core::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    // zero_grad(set_to_none) resets every gradient: zero the bucket once and hand the views
    // back; gradients reset or replaced one by one are re-attached one by one.
    bool all_reset = true, any_detached = false;
    for (size_t i = 0; i < bucket->parameters.size(); ++i) {
      core::Tensor grad = parameters_[bucket->parameters[i]].tensor.grad();
      const bool attached = grad.is_same(bucket->views[i]);
      any_detached = any_detached || !attached;
      all_reset = all_reset && !grad.defined();
    }
    if (!any_detached) continue;
    if (all_reset) {
      bucket->flat.zero_();
      for (size_t i = 0; i < bucket->parameters.size(); ++i) {
        parameters_[bucket->parameters[i]].tensor.set_grad(bucket->views[i]);
      }
    } else {
      for (size_t index : bucket->parameters) attach_gradient(index);
    }
  }
  if (sync_enabled_ && options_.broadcast_buffers) broadcast_from_rank0(buffers_);
}

void DistributedDataParallel::mark_ready(size_t index) {
  // A gradient reset to none after the last prepare_for_backward() was recreated by autograd
  // outside the bucket: move it back into its slot so the averaging sees it.
  attach_gradient(index);
  if (!sync_enabled_) return;  // no_sync: gradients just accumulate in their slots
  if (!backward_in_progress_) {
    backward_in_progress_ = true;
    std::fill(ready_.begin(), ready_.end(), false);
    for (auto& bucket : buckets_) bucket->pending = bucket->parameters.size();
    next_bucket_to_launch_ = 0;
    ready_order_.clear();
    core::queue_backward_callback([this] { finish_backward(); });
  }
  if (ready_[index]) return;
  ready_[index] = true;
  // The order the rebuild uses; never taken with find_unused_parameters (no rebuild then).
  if (!buckets_rebuilt_ && !options_.find_unused_parameters) ready_order_.push_back(index);
  --buckets_[slot_of_[index].bucket]->pending;
  launch_ready_buckets();
  started_during_backward_ = int(next_bucket_to_launch_);
  // Lets a transport that needs the caller (shared memory on one node, MPI's nonblocking
  // collectives) move along; one with a thread of its own ignores it.
  transport_->progress();
}

// Starts every complete bucket from the next one in order; a complete bucket behind an
// incomplete one waits, so all ranks issue the same collectives in the same order.
void DistributedDataParallel::launch_ready_buckets() {
  while (next_bucket_to_launch_ < buckets_.size() &&
         buckets_[next_bucket_to_launch_]->pending == 0) {
    if (timeline_ != nullptr) [[unlikely]] {
      bucket_started_ns_[next_bucket_to_launch_] = Timeline::now_ns();
    }
    if (options_.zero && options_.carry_found_inf) carry_found_inf(next_bucket_to_launch_);
    transport_->start(next_bucket_to_launch_++,
                      options_.zero ? BucketCollective::ReduceScatter : BucketCollective::Average);
  }
}

// See "The found-inf flag under ZeRO-1" in the header. Runs just before `bucket` starts, when
// its local gradients are final.
void DistributedDataParallel::carry_found_inf(size_t bucket) {
  core::NoGradGuard no_grad;
  const core::Tensor& flat = buckets_[bucket]->flat;
  // Each value as the wire carries it (16 bits under compression), times the rank count, times
  // 0: 0, or NaN where a value is inf or NaN, or where a sum of that size over the ranks would
  // overflow in the reduce-scatter (it would be inf in the owner's shard only). Summed (in
  // double, so finite zeros stay 0) into one number.
  // One temporary, scaled and zeroed in place: this runs in backward, before the bucket starts.
  const double ranks = double(communicator_.size());
  core::Tensor scaled =
      options_.compression == GradCompression::None
          ? flat * ranks
          : flat.to(options_.compression == GradCompression::Float16 ? core::kFloat16
                                                                     : core::kBFloat16)
                .mul_(ranks);
  core::Tensor flag = core::sum(scaled.mul_(0.0));
  flag = flag.to(flat.dtype()).reshape({1});
  found_inf_ = bucket == 0 ? flag : found_inf_ + flag;
  if (bucket + 1 < buckets_.size()) return;
  for (int q = 0; q < communicator_.size(); ++q) {
    flat.narrow(0, transport_->shard(bucket, q).first, 1).add_(found_inf_);
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
      attach_gradient(i);
      ready_[i] = true;
      --buckets_[slot_of_[i].bucket]->pending;
    }
  }
  launch_ready_buckets();
  wait_for_buckets();
  rebuild_buckets_once();
}

void DistributedDataParallel::wait_for_buckets() {
  // Returns at once for a bucket not in flight; the shared-memory transports repeat an earlier
  // failure, and a bucket stays in flight until its wait succeeds.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    transport_->wait(b);
    if (timeline_ != nullptr) [[unlikely]]
      record_bucket_span(b);
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
  // A joined rank would also have to take part in ZeRO-1's sharded step and its all-gathers.
  MPIGRAD_CHECK(!options_.zero, communicator_.world_label(),
                " DistributedDataParallel::join_backward: uneven inputs are not supported with "
                "zero = 1");
  prepare_for_backward();
  {
    core::NoGradGuard no_grad;
    for (auto& bucket : buckets_) bucket->flat.zero_();
  }
  std::fill(ready_.begin(), ready_.end(), true);
  for (auto& bucket : buckets_) bucket->pending = 0;
  next_bucket_to_launch_ = 0;
  ready_order_.clear();  // a joined rank has no order of its own; rank 0's is used
  launch_ready_buckets();
  wait_for_buckets();
  rebuild_buckets_once();
}

const std::vector<size_t>& DistributedDataParallel::bucket_parameters(size_t bucket) const {
  return buckets_.at(bucket)->parameters;
}
const std::vector<int64_t>& DistributedDataParallel::bucket_offsets(size_t bucket) const {
  return buckets_.at(bucket)->offsets;
}
const core::Tensor& DistributedDataParallel::bucket_buffer(size_t bucket) const {
  return buckets_.at(bucket)->flat;
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
