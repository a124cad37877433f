// Fill dense buffers from the Philox stream of kernels/philox.h. Element i of a call with
// stream offset `offset` uses word offset + i (uniform, bernoulli) or words offset + 2i and
// offset + 2i + 1 (normal, by Box-Muller), so the caller advances its offset by n or 2n.
// All write with `=`.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

// How many stream words each kernel consumes per element.
constexpr uint64_t kWordsPerUniform = 1;
constexpr uint64_t kWordsPerNormal = 2;

namespace cpu {

// out[i] = lo + (hi - lo) * u_i with u_i in [0, 1). Float types.
void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
             double hi);

// out[i] = mean + std * z_i with z_i standard normal. Float types.
void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
            double std);

// out[i] = (u_i < p) ? 1 : 0, in any dtype.
void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double p);

}  // namespace cpu

// The same fills on a CUDA device, queued on `stream`: the stream words and uniforms are the
// CPU's bit for bit (so are uniform and bernoulli); normal agrees to about 1 ulp, because its
// log/sqrt/cos come from the CUDA math library rather than the host's libm.
namespace cuda {

void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
             double hi, void* stream);
void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
            double std, void* stream);
void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double p,
               void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
