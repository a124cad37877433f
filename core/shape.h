// Shape: a small, inline list of up to kMaxDims extents (also used for strides).
//
// Shapes are built and copied on every op, so they live inline instead of on the heap: creating a
// tensor's metadata costs no allocation beyond the TensorImpl itself.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "mpigrad/kernels/elementwise.h"

namespace mpigrad::core {

using kernels::kMaxDims;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);  // NOLINT: Shape s = {2, 3};
  explicit Shape(const std::vector<int64_t>& dims);
  Shape(const int64_t* dims, int ndim);

  int size() const { return ndim_; }
  bool empty() const { return ndim_ == 0; }
  int64_t operator[](int d) const { return dims_[d]; }
  int64_t& operator[](int d) { return dims_[d]; }
  const int64_t* begin() const { return dims_; }
  const int64_t* end() const { return dims_ + ndim_; }
  const int64_t* data() const { return dims_; }

  void push_back(int64_t extent);
  void insert(int position, int64_t extent);
  void erase(int position);
  int64_t back() const { return dims_[ndim_ - 1]; }

  // Product of the extents; 1 for a 0-d shape.
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "[2, 3]"

  friend bool operator==(const Shape& a, const Shape& b);

 private:
  int64_t dims_[kMaxDims] = {};
  int ndim_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

// Row-major strides of a dense tensor with this shape.
Shape contiguous_strides(const Shape& shape);

// The NumPy broadcast of two shapes; throws core::Error naming both when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Wraps a possibly negative axis into [0, ndim); throws core::Error naming the op when outside.
int wrap_dim(int64_t dim, int ndim, const char* op);

}  // namespace mpigrad::core
