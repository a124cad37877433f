// CUDA indexing along the middle axis: index_select, index_add, gather, scatter_add,
// scatter_reduce (mul, max, min) with scatter_winner for its backward, and the index check every
// one of them runs first.
//
// Layout: dense [outer, extent, inner] (the indexed side) and [outer, count, inner] (the other
// side); indices are Int64 in device memory. index_select and gather write with `=`; index_add
// and scatter_add add with `+=`.
// Checking: a first kernel finds the lowest bad position with atomicMin into the caller's
// workspace, and the launcher waits for the stream to read it, so a call with a bad index
// returns its position and leaves `out` untouched, as the CPU kernels do.
// Thread mapping: one thread per element of the [outer, count, inner] side. index_select and
// gather move elements by width (1, 2, 4 or 8 bytes). The adding kernels may send several
// elements to one destination, so they add atomically: hardware atomics for Float32, Float64,
// Int32 and Int64, a compare-and-swap on the enclosing 32-bit word for the 16-bit floats, UInt8
// and Bool (with the same rounding as the CPU's add). The order of the additions is therefore
// not fixed, and float results may differ from run to run in the last bits. scatter_reduce
// updates with a compare-and-swap loop on the element's 32 or 64 bits (max and min are exact;
// mul's order, and so its last bits, is not fixed), and scatter_winner takes the lowest
// position among the tied ones with atomicMin, so the winners are the CPU's on every run.
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/index.h"

namespace mpigrad::kernels::cuda {

namespace detail {

namespace {

__global__ void first_bad_kernel(const int64_t* index, int64_t n, int64_t extent,
                                 unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (uint64_t(index[i]) >= uint64_t(extent)) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
    }
  }
}

}  // namespace

int64_t first_bad_index(const int64_t* index, int64_t n, int64_t extent, void* workspace,
                        void* stream, const char* kernel) {
  if (n <= 0) return -1;
  if (workspace == nullptr) throw_invalid(kernel, "the index check needs a device workspace");
  cudaStream_t s = as_stream(stream);
  const unsigned long long none = ~0ull;
  auto* first_bad = static_cast<unsigned long long*>(workspace);
  check_cuda(cudaMemcpyAsync(first_bad, &none, sizeof(none), cudaMemcpyHostToDevice, s),
             "cudaMemcpyAsync(HostToDevice) of the index-check flag", kernel);
  first_bad_kernel<<<grid_for(n), kThreads, 0, s>>>(index, n, extent, first_bad);
  check_launch(kernel, stream);
  unsigned long long result = none;
  check_cuda(cudaMemcpyAsync(&result, first_bad, sizeof(result), cudaMemcpyDeviceToHost, s),
             "cudaMemcpyAsync(DeviceToHost) of the index-check result", kernel);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize after the index check", kernel);
  return result == none ? -1 : int64_t(result);
}

}  // namespace detail

namespace {

using detail::as_stream;
using detail::kThreads;

// ---- Atomic +=, with the CPU's add for every dtype -------------------------------------------

// The 16- and 8-bit types, added through their enclosing aligned 32-bit word.
template <typename Bits, typename Add>
__device__ void atomic_update_small(Bits* address, Add add) {
  const uintptr_t raw = reinterpret_cast<uintptr_t>(address);
  unsigned* word = reinterpret_cast<unsigned*>(raw & ~uintptr_t(3));
  const unsigned shift = unsigned(raw & 3u) * 8u;
  const unsigned mask = (sizeof(Bits) == 1 ? 0xffu : 0xffffu) << shift;
  unsigned old = *word;
  unsigned assumed;
  do {
    assumed = old;
    const Bits current = Bits((assumed & mask) >> shift);
    const unsigned updated = (assumed & ~mask) | ((unsigned(add(current)) << shift) & mask);
    old = atomicCAS(word, assumed, updated);
  } while (assumed != old);
}

template <typename T>
__device__ __forceinline__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    atomicAdd(address, value);
  } else if constexpr (std::is_same_v<T, int32_t>) {
    atomicAdd(reinterpret_cast<int*>(address), int(value));  // two's complement: wraps
  } else if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(address),
              static_cast<unsigned long long>(value));
  } else if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
    atomic_update_small(reinterpret_cast<uint16_t*>(address), [value](uint16_t bits) {
      T current;
      current.bits = bits;
      return T(float(current) + float(value)).bits;
    });
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    atomic_update_small(address, [value](uint8_t current) { return uint8_t(current + value); });
  } else {  // bool, stored as a byte: + is or
    const bool set = *reinterpret_cast<const uint8_t*>(&value) != 0;
    atomic_update_small(reinterpret_cast<uint8_t*>(address),
                        [set](uint8_t current) { return uint8_t(current != 0 || set ? 1 : 0); });
  }
}

// ---- Kernels -----------------------------------------------------------------------------------

template <typename Word>
__global__ void index_select_kernel(int64_t outer, int64_t extent, int64_t inner,
                                    const int64_t* index, int64_t count, Word* out,
                                    const Word* in) {
  const int64_t n = outer * count * inner;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = p % inner, row = p / inner;
    const int64_t i = row % count, o = row / count;
    out[p] = in[(o * extent + index[i]) * inner + j];
  }
}

template <typename Word>
__global__ void gather_kernel(int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                              int64_t count, Word* out, const Word* in) {
  const int64_t n = outer * count * inner;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = p % inner, o = p / (count * inner);
    out[p] = in[(o * extent + index[p]) * inner + j];
  }
}

template <typename T>
__global__ void index_add_kernel(int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                                 int64_t count, T* out, const T* in) {
  const int64_t n = outer * count * inner;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = p % inner, row = p / inner;
    const int64_t i = row % count, o = row / count;
    atomic_add(out + (o * extent + index[i]) * inner + j, in[p]);
  }
}

template <typename T>
__global__ void scatter_add_kernel(int64_t outer, int64_t extent, int64_t inner,
                                   const int64_t* index, int64_t count, T* out, const T* in) {
  const int64_t n = outer * count * inner;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = p % inner, o = p / (count * inner);
    atomic_add(out + (o * extent + index[p]) * inner + j, in[p]);
  }
}

// ---- scatter_reduce: mul, max and min by compare-and-swap --------------------------------------

// out = op(out, value) atomically, for the 4- and 8-byte types: a compare-and-swap loop on the
// element's bits. Max and min leave as soon as the value does not win (a NaN never does, and a
// NaN already there stays), so uncontended positions cost one read.
template <typename T>
__device__ void atomic_reduce(ScatterReduceOp op, T* address, T value) {
  using Bits = std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>;
  static_assert(sizeof(T) == sizeof(Bits));
  Bits* word = reinterpret_cast<Bits*>(address);
  Bits old = *word;
  Bits assumed;
  do {
    assumed = old;
    T current;
    memcpy(&current, &assumed, sizeof(T));
    T updated;
    if (op == ScatterReduceOp::Mul) {
      if constexpr (std::is_integral_v<T>) {
        updated = wrap_mul(current, value);
      } else {
        updated = current * value;
      }
    } else if (op == ScatterReduceOp::Max ? value > current : value < current) {
      updated = value;
    } else {
      return;
    }
    Bits bits;
    memcpy(&bits, &updated, sizeof(T));
    old = atomicCAS(word, assumed, bits);
  } while (assumed != old);
}

template <typename T>
__global__ void scatter_reduce_kernel(ScatterReduceOp op, int64_t outer, int64_t extent,
                                      int64_t inner, const int64_t* index, int64_t count, T* out,
                                      const T* in) {
  const int64_t n = outer * count * inner;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = p % inner, o = p / (count * inner);
    atomic_reduce(op, out + (o * extent + index[p]) * inner + j, in[p]);
  }
}

template <typename T>
__global__ void scatter_winner_kernel(int64_t outer, int64_t extent, int64_t inner,
                                      const int64_t* index, int64_t count, const T* out,
                                      const T* base, const T* in, int64_t* winner) {
  const int64_t n = outer * count * inner;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = p % inner, o = p / (count * inner);
    const int64_t at = (o * extent + index[p]) * inner + j;
    if (in[p] == out[at] && !(base[at] == out[at])) {
      atomicMin(reinterpret_cast<long long*>(winner + at), static_cast<long long>(p));
    }
  }
}

// Calls fn(T{}) for the dtypes scatter_reduce takes; false for any other.
template <typename Fn>
bool visit_reducible(DType dtype, Fn fn) {
  bool taken = false;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
      fn(tag);
      taken = true;
    }
  });
  return taken;
}

void check_sizes(const char* kernel, int64_t outer, int64_t extent, int64_t inner, int64_t count) {
  if (outer < 0 || extent < 0 || inner < 0 || count < 0) {
    detail::throw_invalid(kernel, "negative size");
  }
}

// Calls fn(Word{}) with the unsigned type of dtype's width.
template <typename Fn>
void visit_width(DType dtype, Fn fn) {
  switch (element_size(dtype)) {
    case 1:
      fn(uint8_t{});
      break;
    case 2:
      fn(uint16_t{});
      break;
    case 4:
      fn(uint32_t{});
      break;
    default:
      fn(uint64_t{});
      break;
  }
}

}  // namespace

int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                     const int64_t* index, int64_t count, void* out, const void* in,
                     void* workspace, void* stream) {
  check_sizes("index_select", outer, extent, inner, count);
  const int64_t bad =
      detail::first_bad_index(index, count, extent, workspace, stream, "index_select");
  if (bad >= 0) return bad;
  const int64_t n = outer * count * inner;
  if (n == 0) return -1;
  visit_width(dtype, [&](auto word) {
    using Word = decltype(word);
    index_select_kernel<Word><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        outer, extent, inner, index, count, static_cast<Word*>(out), static_cast<const Word*>(in));
  });
  detail::check_launch("index_select", stream);
  return -1;
}

int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                  int64_t count, void* out, const void* in, void* workspace, void* stream) {
  check_sizes("index_add", outer, extent, inner, count);
  const int64_t bad = detail::first_bad_index(index, count, extent, workspace, stream, "index_add");
  if (bad >= 0) return bad;
  const int64_t n = outer * count * inner;
  if (n == 0) return -1;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    index_add_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        outer, extent, inner, index, count, static_cast<T*>(out), static_cast<const T*>(in));
  });
  detail::check_launch("index_add", stream);
  return -1;
}

int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
               int64_t count, void* out, const void* in, void* workspace, void* stream) {
  check_sizes("gather", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  const int64_t bad = detail::first_bad_index(index, n, extent, workspace, stream, "gather");
  if (bad >= 0) return bad;
  if (n == 0) return -1;
  visit_width(dtype, [&](auto word) {
    using Word = decltype(word);
    gather_kernel<Word><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        outer, extent, inner, index, count, static_cast<Word*>(out), static_cast<const Word*>(in));
  });
  detail::check_launch("gather", stream);
  return -1;
}

int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, void* out, const void* in, void* workspace, void* stream) {
  check_sizes("scatter_add", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  const int64_t bad = detail::first_bad_index(index, n, extent, workspace, stream, "scatter_add");
  if (bad >= 0) return bad;
  if (n == 0) return -1;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    scatter_add_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        outer, extent, inner, index, count, static_cast<T*>(out), static_cast<const T*>(in));
  });
  detail::check_launch("scatter_add", stream);
  return -1;
}

int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                       int64_t inner, const int64_t* index, int64_t count, void* out,
                       const void* in, void* workspace, void* stream) {
  check_sizes("scatter_reduce", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  const int64_t bad =
      detail::first_bad_index(index, n, extent, workspace, stream, "scatter_reduce");
  if (bad >= 0) return bad;
  if (n == 0) return -1;
  const bool taken = visit_reducible(dtype, [&](auto tag) {
    using T = decltype(tag);
    scatter_reduce_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        op, outer, extent, inner, index, count, static_cast<T*>(out), static_cast<const T*>(in));
  });
  if (!taken) detail::throw_unsupported("scatter_reduce", "", dtype);
  detail::check_launch("scatter_reduce", stream);
  return -1;
}

void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, const void* out, const void* base, const void* in,
                    int64_t* winner, void* stream) {
  check_sizes("scatter_winner", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  if (n == 0) return;
  const bool taken = visit_reducible(dtype, [&](auto tag) {
    using T = decltype(tag);
    scatter_winner_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        outer, extent, inner, index, count, static_cast<const T*>(out), static_cast<const T*>(base),
        static_cast<const T*>(in), winner);
  });
  if (!taken) detail::throw_unsupported("scatter_winner", "", dtype);
  detail::check_launch("scatter_winner", stream);
}

}  // namespace mpigrad::kernels::cuda
