// Tensor: construction, description, copies and conversions, in-place ops, autograd accessors and
// printing. View ops (view, permute, slice, ...) live in core/ops/view.cpp.
#include "mpigrad/core/tensor.h"

#include <cmath>
#include <cstdio>
#include <new>
#include <sstream>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/pinned.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage_, const Shape& shape_,
                       const Shape& strides_, int64_t offset_, DType dtype_)
    : storage(std::move(storage_)),
      shape(shape_),
      strides(strides_),
      offset(offset_),
      dtype(dtype_) {}

TensorImpl::~TensorImpl() = default;

void Tensor::throw_undefined() {
  fail("operation on an undefined tensor");
}

// ---- Construction ----------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, TensorOptions options) {
  for (int64_t extent : shape) {
    MPIGRAD_CHECK(extent >= 0, "empty: negative extent in shape ", shape);
  }
  Backend& backend = backend_for(options.device_);
  const int64_t bytes =
      checked_mul(shape.numel(), int64_t(core::element_size(options.dtype_)), "empty: bytes of a ",
                  options.dtype_, " tensor of shape ", shape);
  std::shared_ptr<Storage> storage;
  try {
    storage = std::make_shared<Storage>(size_t(bytes), options.device_, backend.allocator());
  } catch (const std::bad_alloc&) {
    throw AllocationError(detail::concat("cannot allocate ", bytes, " bytes for a ", options.dtype_,
                                         " tensor of shape ", shape, " on ", options.device_),
                          bytes);
  }
  Tensor tensor(std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape),
                                             0, options.dtype_));
  if (options.requires_grad_) tensor.set_requires_grad(true);
  return tensor;
}

Tensor Tensor::scalar(double value, TensorOptions options) {
  return full(Shape{}, value, options);
}

Tensor empty(const Shape& shape, TensorOptions options) {
  return Tensor::empty(shape, options);
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  bool requires_grad = options.requires_grad_;
  Tensor tensor = Tensor::empty(shape, options.requires_grad(false));
  backend_for(options.device_).fill(options.dtype_, tensor.numel(), tensor.data_ptr(), value);
  if (requires_grad) tensor.set_requires_grad(true);
  return tensor;
}

Tensor zeros(const Shape& shape, TensorOptions options) {
  return full(shape, 0.0, options);
}
Tensor ones(const Shape& shape, TensorOptions options) {
  return full(shape, 1.0, options);
}
Tensor zeros_like(const Tensor& tensor) {
  return zeros(tensor.shape(), TensorOptions(tensor.dtype()).device(tensor.device()));
}
Tensor ones_like(const Tensor& tensor) {
  return ones(tensor.shape(), TensorOptions(tensor.dtype()).device(tensor.device()));
}

Tensor arange(double start, double end, double step, TensorOptions options) {
  MPIGRAD_CHECK(step != 0.0, "arange: step must be nonzero");
  MPIGRAD_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
                "arange: start, end and step must be finite");
  double count = std::ceil((end - start) / step);
  int64_t n = count > 0 ? int64_t(count) : 0;
  Tensor tensor = Tensor::empty({n}, options.requires_grad(false));
  backend_for(options.device_).arange(options.dtype_, n, tensor.data_ptr(), start, step);
  return tensor;
}

Tensor arange(int64_t end, TensorOptions options) {
  return arange(0.0, double(end), 1.0, options);
}

namespace detail {

Tensor tensor_from_host(const void* values, int64_t n, DType host_dtype, const Shape& shape,
                        TensorOptions options) {
  MPIGRAD_CHECK(n == shape.numel(), "from_vector: ", n, " values do not fill shape ", shape, " (",
                shape.numel(), " elements)");
  // Stage in the host dtype, then convert on the host, then move to the device.
  Tensor staged = Tensor::empty(shape, TensorOptions(host_dtype));
  backend_for(kCPU).copy_from_host(staged.data_ptr(), values, n * core::element_size(host_dtype));
  Tensor result = staged.to(options.device_, options.dtype_);
  if (options.requires_grad_) result.set_requires_grad(true);
  return result;
}

void tensor_to_host(const Tensor& tensor, DType host_dtype, void* out) {
  NoGradGuard no_grad;
  Tensor converted = tensor.to(host_dtype).contiguous();
  backend_for(tensor.device())
      .copy_to_host(out, converted.data_ptr(), converted.numel() * core::element_size(host_dtype));
}

}  // namespace detail

// ---- Description -----------------------------------------------------------------------------

int64_t Tensor::size(int64_t dim) const {
  return shape()[wrap_dim(dim, this->dim(), "size")];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int d = dim() - 1; d >= 0; --d) {
    if (shape()[d] != 1 && strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

// ---- Copies and conversions ------------------------------------------------------------------

namespace {

// Gradient of clone/contiguous: unchanged.
struct CloneBackward final : Node {
  const char* name() const override { return "CloneBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override { grads[0] = grad; }
};

// Gradient of a dtype or device conversion: converted back.
struct ToBackward final : Node {
  Device device;
  DType dtype;
  ToBackward(Device device_, DType dtype_) : device(device_), dtype(dtype_) {}
  const char* name() const override { return "ToBackward"; }
  bool differentiable_backward() const override { return true; }  // a conversion, recorded
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    grads[0] = grad.to(device, dtype);
  }
};

// A dense copy of `source` converted to `dtype`, on source's device.
Tensor convert_same_device(const Tensor& source, DType dtype) {
  ProfileSpan span("copy");
  Tensor out = detail::empty_on(source.shape(), dtype, source.device());
  if (out.numel() > 0) {
    StridedLoop loop = detail::make_loop(out.shape(), {&out, &source});
    backend_for(source.device())
        .copy(dtype, source.dtype(), loop, out.data_ptr(), source.data_ptr());
  }
  return out;
}

}  // namespace

namespace detail {
Tensor copy_as(const Tensor& source, DType dtype) {
  return convert_same_device(source, dtype);
}
}  // namespace detail

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  Tensor out = convert_same_device(*this, dtype());
  detail::record<CloneBackward>(out, {this});
  return out;
}

Tensor Tensor::to(Device device) const {
  return to(device, dtype());
}
Tensor Tensor::to(DType dtype) const {
  return to(device(), dtype);
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  bool crosses_host = target.is_cpu() != device().is_cpu();
  return non_blocking && crosses_host ? to_async(*this, target) : to(target);
}

Tensor Tensor::to(Device target, DType target_dtype) const {
  if (target == device() && target_dtype == dtype()) return *this;
  ProfileSpan span("to");
  Tensor out;
  if (target == device()) {
    out = convert_same_device(*this, target_dtype);
  } else {
    // Convert where the data is, then move the dense bytes across.
    Tensor dense = convert_same_device(*this, target_dtype);
    out = detail::empty_on(shape(), target_dtype, target);
    if (device().is_cpu()) {
      backend_for(target).copy_from_host(out.data_ptr(), dense.data_ptr(), dense.nbytes());
    } else if (target.is_cpu()) {
      backend_for(device()).copy_to_host(out.data_ptr(), dense.data_ptr(), dense.nbytes());
    } else {
      Tensor staged = dense.to(kCPU);
      backend_for(target).copy_from_host(out.data_ptr(), staged.data_ptr(), staged.nbytes());
    }
  }
  if (is_floating(dtype()) && is_floating(target_dtype)) {
    detail::record<ToBackward>(out, {this}, device(), dtype());
  }
  return out;
}

// ---- In-place --------------------------------------------------------------------------------

namespace {

// Writes `value` (already computed, same shape) into `self`, and when autograd recorded `value`'s
// history, makes it self's history: self is now the result of that op.
void assign_result(Tensor& self, const Tensor& value) {
  {
    NoGradGuard no_grad;
    StridedLoop loop = detail::make_loop(self.shape(), {&self, &value});
    backend_for(self.device())
        .copy(self.dtype(), value.dtype(), loop, self.data_ptr(), value.data_ptr());
  }
  self.storage()->bump_version();
  if (value.grad_fn()) {
    AutogradMeta& meta = self.autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = value.grad_fn();
  }
}

// Runs `op` as self = op(self, ...) in place. Without autograd the kernel writes into self
// directly; with autograd the op runs on a differentiable clone (so saved tensors stay intact)
// and its result and history are moved into self.
template <typename Op>
Tensor& inplace(Tensor& self, const char* name, std::initializer_list<const Tensor*> others,
                Op op) {
  check_inplace(self, name);
  bool track = grad_enabled() && (self.requires_grad() || any_requires_grad(others));
  if (track) {
    Tensor value = op(self.clone());
    MPIGRAD_CHECK(value.shape() == self.shape(), name, ": result shape ", value.shape(),
                  " does not match the in-place target ", self.shape());
    assign_result(self, value);
    return self;
  }
  NoGradGuard no_grad;
  Tensor value = op(self);
  MPIGRAD_CHECK(value.shape() == self.shape(), name, ": result shape ", value.shape(),
                " does not match the in-place target ", self.shape());
  assign_result(self, value);
  return self;
}

}  // namespace

Tensor& Tensor::fill_(double value) {
  ProfileSpan span("fill_");
  check_inplace(*this, "fill_");
  NoGradGuard no_grad;
  if (is_contiguous()) {
    // One flat fill (a memset for zeros): zero_grad of every gradient goes through here.
    backend_for(device()).fill(dtype(), numel(), data_ptr(), value);
  } else {
    Tensor source = scalar_like(value, *this);
    StridedLoop loop = detail::make_loop(shape(), {this, &source});
    backend_for(device()).copy(dtype(), dtype(), loop, data_ptr(), source.data_ptr());
  }
  storage()->bump_version();
  if (AutogradMeta* meta = autograd_meta_if_any(); meta && meta->grad_fn) {
    meta->grad_fn = nullptr;  // constant now: no gradient flows to what it was computed from
    meta->requires_grad = false;
  }
  return *this;
}

Tensor& Tensor::copy_(const Tensor& source) {
  return inplace(*this, "copy_", {&source}, [&](const Tensor&) {
    Tensor converted = source.to(device(), dtype());
    return converted.shape() == shape() ? converted : converted.expand(shape());
  });
}

namespace {

// self = self op other. Untracked, the kernel writes straight into self; tracked, it goes through
// the out-of-place op so the history is recorded.
Tensor& inplace_binary(Tensor& self, const char* name, BinaryOp op, const Tensor& other) {
  ProfileSpan span(name);
  check_inplace(self, name);
  if (grad_enabled() && (self.requires_grad() || other.requires_grad())) {
    return inplace(self, name, {&other}, [&](const Tensor& value) {
      switch (op) {
        case BinaryOp::Add:
          return add(value, other);
        case BinaryOp::Sub:
          return sub(value, other);
        case BinaryOp::Mul:
          return mul(value, other);
        default:
          return div(value, other);
      }
    });
  }
  detail::binary_into(op, self, self, other, name);
  self.storage()->bump_version();
  return self;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (alpha == 1.0) return inplace_binary(*this, "add_", BinaryOp::Add, other);
  return inplace_binary(*this, "add_", BinaryOp::Add, mul(other, scalar_like(alpha, other)));
}
Tensor& Tensor::add_(double value) {
  return inplace_binary(*this, "add_", BinaryOp::Add, scalar_like(value, *this));
}
Tensor& Tensor::sub_(const Tensor& other) {
  return inplace_binary(*this, "sub_", BinaryOp::Sub, other);
}
Tensor& Tensor::mul_(const Tensor& other) {
  return inplace_binary(*this, "mul_", BinaryOp::Mul, other);
}
Tensor& Tensor::mul_(double value) {
  return inplace_binary(*this, "mul_", BinaryOp::Mul, scalar_like(value, *this));
}
Tensor& Tensor::div_(const Tensor& other) {
  return inplace_binary(*this, "div_", BinaryOp::Div, other);
}
Tensor& Tensor::div_(double value) {
  return inplace_binary(*this, "div_", BinaryOp::Div, scalar_like(value, *this));
}
Tensor& Tensor::clamp_(double lo, double hi) {
  return inplace(*this, "clamp_", {}, [&](const Tensor& self) { return clamp(self, lo, hi); });
}
Tensor& Tensor::relu_() {
  return inplace(*this, "relu_", {}, [&](const Tensor& self) { return relu(self); });
}

// ---- Autograd accessors ----------------------------------------------------------------------

AutogradMeta& Tensor::autograd_meta() const {
  TensorImpl& self = impl();
  if (!self.autograd) self.autograd = std::make_unique<AutogradMeta>();
  return *self.autograd;
}

bool Tensor::requires_grad() const {
  AutogradMeta* meta = autograd_meta_if_any();
  return meta != nullptr && meta->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  MPIGRAD_CHECK(is_leaf(),
                "set_requires_grad: only leaf tensors can change requires_grad; this "
                "tensor was computed by ",
                grad_fn()->name(), " (use detach() first)");
  MPIGRAD_CHECK(!requires_grad || is_floating(dtype()),
                "set_requires_grad: only floating-point tensors can require gradients, got ",
                dtype());
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  AutogradMeta* meta = autograd_meta_if_any();
  return meta == nullptr || meta->grad_fn == nullptr;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> kNone;
  AutogradMeta* meta = autograd_meta_if_any();
  return meta ? meta->grad_fn : kNone;
}

Tensor Tensor::grad() const {
  AutogradMeta* meta = autograd_meta_if_any();
  return meta ? meta->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    MPIGRAD_CHECK(grad.shape() == shape(), "set_grad: gradient shape ", grad.shape(),
                  " does not match tensor shape ", shape());
    MPIGRAD_CHECK(grad.dtype() == dtype() && grad.device() == device(), "set_grad: gradient is ",
                  grad.dtype(), " on ", grad.device(), ", tensor is ", dtype(), " on ", device());
  }
  autograd_meta().grad = grad;
}

Tensor Tensor::detach() const {
  const TensorImpl& self = impl();
  auto alias =
      std::make_shared<TensorImpl>(self.storage, self.shape, self.strides, self.offset, self.dtype);
  alias->is_view = self.is_view;
  return Tensor(std::move(alias));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  core::backward(*this, gradient, retain_graph, create_graph);
}

int Tensor::register_grad_ready_hook(GradReadyHook hook) {
  MPIGRAD_CHECK(is_leaf() && requires_grad(),
                "register_grad_ready_hook: only leaves that require grad get grad-ready hooks");
  AutogradMeta& meta = autograd_meta();
  int id = meta.next_hook_id++;
  meta.hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_grad_ready_hook(int id) {
  AutogradMeta* meta = autograd_meta_if_any();
  if (meta == nullptr) return;
  std::erase_if(meta->hooks, [id](const auto& entry) { return entry.first == id; });
}

// ---- Printing --------------------------------------------------------------------------------

namespace {

constexpr int64_t kSummarizeAbove = 1000;  // elements; larger tensors print their edges only
constexpr int64_t kEdgeItems = 3;

void print_value(std::ostream& out, DType dtype, double value) {
  char buffer[64];
  if (dtype == kBool) {
    out << (value != 0 ? "true" : "false");
    return;
  }
  if (!is_floating(dtype)) {
    std::snprintf(buffer, sizeof(buffer), "%lld", static_cast<long long>(value));
  } else {
    double magnitude = std::fabs(value);
    bool scientific = std::isfinite(value) && value != 0 && (magnitude >= 1e5 || magnitude < 1e-4);
    std::snprintf(buffer, sizeof(buffer), scientific ? "%.4e" : "%.4f", value);
  }
  out << buffer;
}

void print_nested(std::ostream& out, const std::vector<double>& values, const Shape& shape,
                  DType dtype, int dim, int64_t base, bool summarize, int indent) {
  int64_t extent = shape[dim];
  int64_t block = 1;
  for (int d = dim + 1; d < shape.size(); ++d) block *= shape[d];
  out << '[';
  for (int64_t i = 0; i < extent; ++i) {
    if (summarize && extent > 2 * kEdgeItems && i == kEdgeItems) {
      out << "...";
      i = extent - kEdgeItems - 1;
      out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
      continue;
    }
    if (dim + 1 == shape.size()) {
      print_value(out, dtype, values[size_t(base + i)]);
    } else {
      print_nested(out, values, shape, dtype, dim + 1, base + i * block, summarize, indent + 1);
    }
    if (i + 1 < extent) {
      out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
    }
  }
  out << ']';
}

}  // namespace

std::string Tensor::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  if (!tensor.defined()) return out << "tensor(undefined)";
  std::vector<double> values = tensor.to_vector<double>();
  out << "tensor(";
  if (tensor.dim() == 0) {
    print_value(out, tensor.dtype(), values[0]);
  } else if (tensor.numel() == 0) {
    out << "[], shape=" << tensor.shape();
  } else {
    print_nested(out, values, tensor.shape(), tensor.dtype(), 0, 0,
                 tensor.numel() > kSummarizeAbove, 7);
  }
  out << ", dtype=" << tensor.dtype();
  if (!tensor.device().is_cpu()) out << ", device=" << tensor.device();
  if (tensor.grad_fn()) {
    out << ", grad_fn=" << tensor.grad_fn()->name();
  } else if (tensor.requires_grad()) {
    out << ", requires_grad=true";
  }
  return out << ')';
}

}  // namespace mpigrad::core
