// The all-pairs radius graph on a CUDA device (kernels/neighbor_list.h): one thread per target
// atom runs the search the CPU version runs, so both write the same edges in the same order.
// A first kernel flags the lowest atom with a coordinate that is not finite (atomicMin into the
// caller's workspace) and the launcher reads it back before counting, as the index kernels do.
#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/neighbor_list.h"

namespace mpigrad::kernels::cuda {

namespace {

using detail::as_stream;

// Targets per block: each thread loops over its whole structure, so small blocks spread the
// atoms over more multiprocessors.
constexpr int kSearchThreads = 128;

__global__ void first_bad_atom_kernel(const float* positions, int64_t n,
                                      unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (!isfinite(positions[i])) atomicMin(first_bad, static_cast<unsigned long long>(i / 3));
  }
}

__global__ void count_kernel(RadiusGraphArgs args, int64_t* counts) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < args.atoms;
       t += int64_t(gridDim.x) * blockDim.x) {
    int64_t n = 0;
    neighbor_detail::search_target(args, t, [&n](int64_t, const int64_t*, double) { ++n; });
    counts[t] = n;
  }
}

__global__ void write_kernel(RadiusGraphArgs args, RadiusGraphOutput out) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < args.atoms;
       t += int64_t(gridDim.x) * blockDim.x) {
    neighbor_detail::write_target(args, out, t);
  }
}

}  // namespace

int64_t radius_graph_count(const RadiusGraphArgs& args, int64_t* counts, void* workspace,
                           void* stream) {
  const char* kernel = "radius_graph_count";
  if (args.atoms < 0 || args.structures < 0) detail::throw_invalid(kernel, "negative size");
  if (args.atoms == 0) return -1;
  if (workspace == nullptr) detail::throw_invalid(kernel, "the position check needs a workspace");
  cudaStream_t s = as_stream(stream);
  const unsigned long long none = ~0ull;
  auto* first_bad = static_cast<unsigned long long*>(workspace);
  detail::check_cuda(cudaMemcpyAsync(first_bad, &none, sizeof(none), cudaMemcpyHostToDevice, s),
                     "cudaMemcpyAsync(HostToDevice) of the position-check flag", kernel);
  first_bad_atom_kernel<<<detail::grid_for(3 * args.atoms), detail::kThreads, 0, s>>>(
      args.positions, 3 * args.atoms, first_bad);
  detail::check_launch(kernel, stream);
  unsigned long long result = none;
  detail::check_cuda(cudaMemcpyAsync(&result, first_bad, sizeof(result), cudaMemcpyDeviceToHost, s),
                     "cudaMemcpyAsync(DeviceToHost) of the position-check result", kernel);
  detail::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize after the position check",
                     kernel);
  if (result != none) return int64_t(result);
  count_kernel<<<detail::grid_for(args.atoms, kSearchThreads), kSearchThreads, 0, s>>>(args,
                                                                                       counts);
  detail::check_launch(kernel, stream);
  return -1;
}

void radius_graph_write(const RadiusGraphArgs& args, const RadiusGraphOutput& out, void* stream) {
  if (args.atoms <= 0) return;
  write_kernel<<<detail::grid_for(args.atoms, kSearchThreads), kSearchThreads, 0,
                 as_stream(stream)>>>(args, out);
  detail::check_launch("radius_graph_write", stream);
}

}  // namespace mpigrad::kernels::cuda
