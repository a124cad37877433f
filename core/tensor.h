// Tensor: a strided view (shape, strides, offset, dtype) over shared, reference-counted Storage,
// plus the autograd state of that view.
//
// Tensor is a cheap handle (one shared_ptr); copying it aliases, clone() copies data. The math
// lives in core/ops/*.h as free functions (add, matmul, softmax, ...); this header keeps what
// describes a tensor, views of it, conversions, and the entry points of autograd.
//
// Invariants:
// - A view never owns memory: it shares Storage with its base and adds shape/strides/offset.
// - In-place ops bump the Storage version; autograd checks saved tensors against it.
// - Only leaves (tensors made by the user, not by an op) hold .grad and grad-ready hooks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/storage.h"

namespace mpigrad::core {

class Node;
class Tensor;
struct AutogradMeta;

// What a new tensor is made of; chain the setters: TensorOptions().dtype(kFloat64).device(cuda()).
struct TensorOptions {
  DType dtype_ = kFloat32;
  Device device_ = kCPU;
  bool requires_grad_ = false;

  TensorOptions() = default;
  TensorOptions(DType dtype) : dtype_(dtype) {}      // NOLINT: zeros({2}, kInt64)
  TensorOptions(Device device) : device_(device) {}  // NOLINT: zeros({2}, kCPU)
  TensorOptions dtype(DType d) const {
    auto o = *this;
    o.dtype_ = d;
    return o;
  }
  TensorOptions device(Device d) const {
    auto o = *this;
    o.device_ = d;
    return o;
  }
  TensorOptions requires_grad(bool r = true) const {
    auto o = *this;
    o.requires_grad_ = r;
    return o;
  }
};

// Called with a leaf's final gradient, once per backward, while the rest of backward still runs.
using GradReadyHook = std::function<void(Tensor& grad)>;

class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<Storage> storage, const Shape& shape, const Shape& strides,
             int64_t offset, DType dtype);
  ~TensorImpl();

  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype;
  bool is_view = false;                    // made by a view op from another tensor's storage
  std::unique_ptr<AutogradMeta> autograd;  // null until the tensor takes part in autograd
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- Construction --------------------------------------------------------------------------
  // Uninitialized memory.
  static Tensor empty(const Shape& shape, TensorOptions options = {});
  // A tensor of `shape` holding `values` (converted to options.dtype); sizes must agree.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            TensorOptions options = TensorOptions(dtype_of<T>()));
  // A 0-d tensor.
  static Tensor scalar(double value, TensorOptions options = {});

  // ---- Description ---------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int dim() const { return impl().shape.size(); }
  int64_t numel() const { return impl().shape.numel(); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t element_size() const { return core::element_size(dtype()); }
  int64_t nbytes() const { return numel() * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  TensorImpl* impl_ptr() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_shared() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Address of the first element (storage + offset).
  void* data_ptr() const {
    char* base = static_cast<char*>(impl().storage->data());
    return base == nullptr ? nullptr : base + offset() * element_size();
  }
  // Typed access to the elements; throws if T does not match dtype().
  template <typename T>
  T* data() const;
  // The value of a one-element tensor, converted to T (copied to the host if needed).
  template <typename T>
  T item() const;
  // All elements in row-major order, converted to T (copied to the host if needed).
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- Views: share storage, no copy ---------------------------------------------------------
  // Requires a layout the new shape can be expressed in (else use reshape); one extent may be -1.
  Tensor view(const Shape& shape) const;
  // A view when possible, otherwise a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a 2-d tensor
  // Elements [start, end) with `step` along dim; negative start/end count from the end and are
  // clamped to the extent like Python slicing.
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;  // only removes a dim of extent 1
  Tensor squeeze() const;             // removes every dim of extent 1
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  // Repeats extent-1 dims (stride 0) up to `shape`; -1 keeps an extent.
  Tensor expand(const Shape& shape) const;

  // ---- Copies and conversions ----------------------------------------------------------------
  Tensor contiguous() const;  // this tensor itself when already contiguous
  Tensor clone() const;       // always a new contiguous copy, differentiable
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;  // this tensor itself when nothing changes
  // With non_blocking, a host <-> CUDA copy is queued on the current stream through pinned
  // memory (core/pinned.h) and returns at once; it records no autograd history.
  Tensor to(Device device, bool non_blocking) const;

  // ---- In-place (bump the version; refused on leaves that require grad) ----------------------
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& source);  // broadcasts and converts the source
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double value);
  Tensor& clamp_(double lo, double hi);
  Tensor& relu_();
  uint32_t version() const { return impl().storage->version(); }

  // ---- Autograd ------------------------------------------------------------------------------
  bool requires_grad() const;
  // Only on leaves; floating dtypes only.
  Tensor& set_requires_grad(bool requires_grad = true);
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  // The accumulated gradient of a leaf; undefined until a backward reached it.
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  // A new tensor sharing this storage, outside the graph.
  Tensor detach() const;
  // Runs backward from this tensor. `gradient` may be omitted for one-element tensors. With
  // create_graph the gradients (and .grad) can be differentiated again (core/autograd.h).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;
  // Registers a hook on a leaf; returns an id for remove_grad_ready_hook.
  int register_grad_ready_hook(GradReadyHook hook);
  void remove_grad_ready_hook(int id);

  // ---- Printing ------------------------------------------------------------------------------
  std::string str() const;

  // Shared plumbing for ops: the autograd state, created on demand.
  AutogradMeta& autograd_meta() const;
  AutogradMeta* autograd_meta_if_any() const { return impl_ ? impl_->autograd.get() : nullptr; }

 private:
  TensorImpl& impl() const {
    if (impl_ == nullptr) [[unlikely]]
      throw_undefined();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// ---- Factories ---------------------------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// [start, end) with `step`, like torch.arange; the count is ceil((end - start) / step).
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = kInt64);
Tensor arange(int64_t end, TensorOptions options = kInt64);
Tensor zeros_like(const Tensor& tensor);
Tensor ones_like(const Tensor& tensor);

// ---- Template definitions ------------------------------------------------------------------
namespace detail {
// Copies n host elements of host_dtype into a fresh tensor of `options`.
Tensor tensor_from_host(const void* values, int64_t n, DType host_dtype, const Shape& shape,
                        TensorOptions options);
// Copies a tensor's elements, converted to host_dtype, into a host buffer of numel elements.
void tensor_to_host(const Tensor& tensor, DType host_dtype, void* out);
}  // namespace detail

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape,
                           TensorOptions options) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());  // vector<bool> is packed
    return detail::tensor_from_host(bytes.data(), int64_t(bytes.size()), kBool, shape, options);
  } else {
    return detail::tensor_from_host(values.data(), int64_t(values.size()), dtype_of<T>(), shape,
                                    options);
  }
}

template <typename T>
T* Tensor::data() const {
  MPIGRAD_CHECK(dtype() == dtype_of<T>(), "Tensor::data<", dtype_of<T>(), ">: tensor holds ",
                dtype());
  return static_cast<T*>(data_ptr());
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(static_cast<size_t>(numel()));
    detail::tensor_to_host(*this, kBool, bytes.data());
    return {bytes.begin(), bytes.end()};
  } else {
    std::vector<T> values(static_cast<size_t>(numel()));
    detail::tensor_to_host(*this, dtype_of<T>(), values.data());
    return values;
  }
}

template <typename T>
T Tensor::item() const {
  MPIGRAD_CHECK(numel() == 1, "item(): tensor of shape ", shape(), " has ", numel(),
                " elements, expected 1");
  return to_vector<T>()[0];
}

}  // namespace mpigrad::core
