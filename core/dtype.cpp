#include "mpigrad/core/dtype.h"

namespace mpigrad::core {

namespace {
// Rank in the promotion lattice: bool < uint8 < int32 < int64 < 16-bit floats < float32 < float64.
int promotion_rank(DType dtype) {
  switch (dtype) {
    case kBool:
      return 0;
    case kUInt8:
      return 1;
    case kInt32:
      return 2;
    case kInt64:
      return 3;
    case kFloat16:
    case kBFloat16:
      return 4;
    case kFloat32:
      return 5;
    case kFloat64:
      return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // Neither 16-bit float holds the other exactly, so they meet in float32 (as in PyTorch).
  if ((a == kFloat16 && b == kBFloat16) || (a == kBFloat16 && b == kFloat16)) return kFloat32;
  return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

}  // namespace mpigrad::core

std::ostream& mpigrad::kernels::operator<<(std::ostream& out, DType dtype) {
  return out << mpigrad::core::dtype_name(dtype);
}
