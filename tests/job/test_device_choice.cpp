// The device rule of launch/job/device_choice.h with given GPU counts and answers of the CUDA
// runtime, so it is checked on machines without GPUs: the automatic choice, MPIGRAD_DEVICE, a
// broken GPU, and NCCL's one GPU per rank.
#include <doctest/doctest.h>

#include <optional>
#include <string>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/job/device_choice.h"

namespace {

using mpigrad::core::CudaVisibility;
using mpigrad::core::Device;
using mpigrad::core::kCPU;
using mpigrad::launch::check_one_gpu_per_rank;
using mpigrad::launch::choose_rank_device;

CudaVisibility gpus(int count) {
  return mpigrad::core::classify_cuda_device_count(0, count, "cudaSuccess", "no error");
}

CudaVisibility no_gpu() {
  return mpigrad::core::classify_cuda_device_count(mpigrad::core::kCudaErrorNoDevice, 0,
                                                   "cudaErrorNoDevice",
                                                   "no CUDA-capable device is detected");
}

CudaVisibility broken() {
  return mpigrad::core::classify_cuda_device_count(
      803, 0, "cudaErrorSystemDriverMismatch",
      "system has unsupported display driver / cuda driver combination");
}

Device choose(std::optional<Device> requested, const char* environment, int local_rank,
              int local_size, const CudaVisibility& visibility) {
  return choose_rank_device(requested, environment, local_rank, local_size, visibility,
                            "[rank 0/1]");
}

}  // namespace

TEST_CASE("device choice: each rank of a node takes its own GPU, the CPU without GPUs") {
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    CHECK(choose(std::nullopt, "", local_rank, 4, gpus(4)) == mpigrad::core::cuda(local_rank));
    CHECK(choose(std::nullopt, "", local_rank, 4, no_gpu()) == kCPU);
  }
  // More ranks than GPUs: the automatic rule shares them (the MPI backend copes).
  CHECK(choose(std::nullopt, "", 3, 4, gpus(2)) == mpigrad::core::cuda(1));
  CudaVisibility cpu_build;
  cpu_build.built = false;
  CHECK(choose(std::nullopt, "", 1, 2, cpu_build) == kCPU);
}

TEST_CASE("device choice: the program's device, then MPIGRAD_DEVICE, override the rule") {
  CHECK(choose(kCPU, "cuda:1", 0, 1, gpus(2)) == kCPU);
  CHECK(choose(mpigrad::core::cuda(1), "cpu", 0, 1, gpus(2)) == mpigrad::core::cuda(1));
  CHECK(choose(std::nullopt, "cpu", 0, 1, gpus(2)) == kCPU);
  CHECK(choose(std::nullopt, "cuda", 1, 2, gpus(2)) == mpigrad::core::cuda(1));
  CHECK(choose(std::nullopt, "cuda:1", 0, 2, gpus(2)) == mpigrad::core::cuda(1));
  CHECK_THROWS_WITH_AS(choose(std::nullopt, "cuda:2", 0, 1, gpus(2)),
                       doctest::Contains("MPIGRAD_DEVICE=cuda:2: cuda:2 is not available: 2 CUDA "
                                         "devices visible"),
                       mpigrad::core::Error);
  CHECK_THROWS_WITH_AS(choose(std::nullopt, "cuda", 0, 1, no_gpu()),
                       doctest::Contains("MPIGRAD_DEVICE=cuda asks for a GPU, but no GPU visible: "
                                         "cudaGetDeviceCount failed with cudaErrorNoDevice"),
                       mpigrad::core::Error);
  CHECK_THROWS_WITH_AS(choose(std::nullopt, "gpu", 0, 1, gpus(1)),
                       doctest::Contains("[rank 0/1] MPIGRAD_DEVICE: unknown device 'gpu'"),
                       mpigrad::core::Error);
}

TEST_CASE("device choice: a broken GPU is an error unless the CPU is asked for") {
  CHECK_THROWS_WITH_AS(choose(std::nullopt, "", 0, 1, broken()),
                       doctest::Contains("CUDA is broken: cudaGetDeviceCount failed with "
                                         "cudaErrorSystemDriverMismatch"),
                       mpigrad::core::Error);
  CHECK_THROWS_AS(choose(std::nullopt, "cuda:0", 0, 1, broken()), mpigrad::core::Error);
  CHECK_THROWS_AS(choose(mpigrad::core::cuda(0), "", 0, 1, broken()), mpigrad::core::Error);
  CHECK(choose(std::nullopt, "cpu", 0, 1, broken()) == kCPU);
  CHECK(choose(kCPU, "", 0, 1, broken()) == kCPU);
}

TEST_CASE("NCCL needs one GPU per rank of a node: one error naming both counts") {
  CHECK_NOTHROW(check_one_gpu_per_rank(2, 2, "nccl", "[rank 1/2]"));
  CHECK_NOTHROW(check_one_gpu_per_rank(1, 8, "nccl", "[rank 0/1]"));
  CHECK_THROWS_WITH_AS(check_one_gpu_per_rank(4, 2, "nccl", "[rank 3/8]"),
                       doctest::Contains("[rank 3/8] 4 ranks run on this node but it has 2 "
                                         "visible GPUs: the nccl backend needs one GPU per rank. "
                                         "Start at most 2 ranks per node"),
                       mpigrad::core::Error);
  CHECK_THROWS_WITH_AS(check_one_gpu_per_rank(2, 1, "nccl", "[rank 0/2]"),
                       doctest::Contains("it has 1 visible GPU: "), mpigrad::core::Error);
}
