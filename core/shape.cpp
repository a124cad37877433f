#include "mpigrad/core/shape.h"

#include <sstream>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"

namespace mpigrad::core {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(dims.begin(), int(dims.size())) {}

Shape::Shape(const std::vector<int64_t>& dims) : Shape(dims.data(), int(dims.size())) {}

Shape::Shape(const int64_t* dims, int ndim) {
  MPIGRAD_CHECK(ndim <= kMaxDims, "tensors have at most ", kMaxDims, " dims, got ", ndim);
  for (int d = 0; d < ndim; ++d) dims_[d] = dims[d];
  ndim_ = ndim;
}

void Shape::push_back(int64_t extent) {
  insert(ndim_, extent);
}

void Shape::insert(int position, int64_t extent) {
  MPIGRAD_CHECK(ndim_ < kMaxDims, "tensors have at most ", kMaxDims, " dims");
  for (int d = ndim_; d > position; --d) dims_[d] = dims_[d - 1];
  dims_[position] = extent;
  ++ndim_;
}

void Shape::erase(int position) {
  for (int d = position; d + 1 < ndim_; ++d) dims_[d] = dims_[d + 1];
  --ndim_;
}

int64_t Shape::numel() const {
  // Extents come from files and configs: a product past int64 is an error, not a wrapped count.
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) {
    if (__builtin_mul_overflow(n, dims_[d], &n)) [[unlikely]] {
      fail("shape ", *this, ": the element count overflows int64 (more than 9.2e18 elements)");
    }
  }
  return n;
}

std::string Shape::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.ndim_ != b.ndim_) return false;
  for (int d = 0; d < a.ndim_; ++d) {
    if (a.dims_[d] != b.dims_[d]) return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  out << '[';
  for (int d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  return out << ']';
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  int64_t stride = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    strides[d] = stride;
    stride = checked_mul(stride, shape[d] > 1 ? shape[d] : 1, "strides of shape ", shape);
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  if (a == b) return a;
  int ndim = a.size() > b.size() ? a.size() : b.size();
  Shape out;
  for (int d = 0; d < ndim; ++d) {
    int da = d - (ndim - a.size());
    int db = d - (ndim - b.size());
    int64_t ea = da >= 0 ? a[da] : 1;
    int64_t eb = db >= 0 ? b[db] : 1;
    MPIGRAD_CHECK(ea == eb || ea == 1 || eb == 1, op, ": shapes ", a, " and ", b,
                  " cannot be broadcast together (dim ", d, ": ", ea, " vs ", eb, ")");
    out.push_back(ea == 1 ? eb : ea);
  }
  return out;
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  int64_t wrapped = dim < 0 ? dim + ndim : dim;
  // A 0-d tensor accepts dim 0 and -1, as in PyTorch.
  int64_t limit = ndim == 0 ? 1 : ndim;
  if (ndim == 0 && (dim == 0 || dim == -1)) return 0;
  MPIGRAD_CHECK(wrapped >= 0 && wrapped < limit, op, ": dim ", dim, " is out of range for a ", ndim,
                "-d tensor (expected [", -ndim, ", ", ndim - 1, "])");
  return int(wrapped);
}

}  // namespace mpigrad::core
