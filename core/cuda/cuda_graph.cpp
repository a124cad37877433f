// CUDA graph capture and replay (core/cuda_graph.h).
#include "mpigrad/core/cuda_graph.h"

#include <cuda_runtime.h>

#include <exception>

#include "mpigrad/core/cuda/cuda_backend.cuh"
#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/error.h"

namespace mpigrad::core {

namespace {

cudaGraph_t as_graph(void* handle) {
  return static_cast<cudaGraph_t>(handle);
}
cudaGraphExec_t as_exec(void* handle) {
  return static_cast<cudaGraphExec_t>(handle);
}

}  // namespace

CudaGraph::~CudaGraph() {
  reset();
}

void CudaGraph::reset() noexcept {
  if (exec_ == nullptr && graph_ == nullptr && pool_ == 0) return;
  cuda_detail::DeviceGuard guard(device_.index);
  // The last replay may still run on the pool's memory.
  if (exec_ != nullptr) (void)cudaDeviceSynchronize();
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(as_exec(exec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(as_graph(graph_));
  exec_ = graph_ = nullptr;
  if (pool_ != 0) {
    try {
      cuda_detail::cuda_backend(device_.index).caching_allocator().release_pool(pool_);
    } catch (...) {
      (void)cudaGetLastError();  // the runtime is failing; the memory stays reserved
    }
    pool_ = 0;
  }
}

bool CudaGraph::capture(StreamView stream, const std::function<void()>& work, std::string* why) {
  MPIGRAD_CHECK(stream.handle() != nullptr,
                "CudaGraph::capture: the legacy default stream cannot be captured; use a Stream");
  reset();
  device_ = stream.device();
  auto& backend = cuda_detail::cuda_backend(device_.index);
  cuda_detail::DeviceGuard guard(device_.index);
  const auto handle = static_cast<cudaStream_t>(stream.handle());

  pool_ = backend.caching_allocator().begin_capture_pool(stream.id());
  std::string failure;
  cudaError_t status = cudaStreamBeginCapture(handle, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    failure = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(status);
  } else {
    try {
      StreamGuard current(stream);
      work();
    } catch (const std::exception& error) {
      failure = error.what();
    }
    cudaGraph_t graph = nullptr;
    status = cudaStreamEndCapture(handle, &graph);
    graph_ = graph;
    if (failure.empty() && status != cudaSuccess) {
      failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(status);
    }
  }
  backend.caching_allocator().end_capture_pool(stream.id());
  if (failure.empty()) {
    cudaGraphExec_t exec = nullptr;
    status = cudaGraphInstantiate(&exec, as_graph(graph_), 0);
    if (status == cudaSuccess) {
      exec_ = exec;
      return true;
    }
    failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(status);
  }
  // A failed capture leaves its error with the runtime, not with the context: clear it, so that
  // the next call does not report it.
  (void)cudaGetLastError();
  reset();
  if (why != nullptr) *why = failure;
  return false;
}

void CudaGraph::replay(StreamView stream) const {
  MPIGRAD_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing has been captured");
  MPIGRAD_CHECK(stream.device() == device_, "CudaGraph::replay: the graph was captured on ",
                device_, ", the stream belongs to ", stream.device());
  cuda_detail::DeviceGuard guard(device_.index);
  MPIGRAD_CUDA_CHECK(cudaGraphLaunch(as_exec(exec_), static_cast<cudaStream_t>(stream.handle())));
}

}  // namespace mpigrad::core
