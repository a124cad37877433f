// The device rule of launch/job/device_choice.h.
#include "mpigrad/launch/job/device_choice.h"

#include "mpigrad/core/error.h"

namespace mpigrad::launch {

namespace {

core::Device automatic_gpu(int local_rank, const core::CudaVisibility& visibility,
                           const std::string& where, const char* why) {
  MPIGRAD_CHECK(!visibility.broken, where, " ", why, ": ", visibility.describe(),
                "; fix the driver or run on the CPU with MPIGRAD_DEVICE=cpu");
  MPIGRAD_CHECK(visibility.has_gpu(), where, " ", why, " asks for a GPU, but ",
                visibility.describe(), "; use MPIGRAD_DEVICE=cpu to run on the CPU");
  return core::cuda(local_rank % visibility.device_count);
}

}  // namespace

core::Device choose_rank_device(const std::optional<core::Device>& requested,
                                std::string_view environment, int local_rank, int local_size,
                                const core::CudaVisibility& visibility, const std::string& where) {
  MPIGRAD_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, where,
                " device choice: local rank ", local_rank, " of ", local_size,
                " ranks on the node is impossible");
  std::optional<core::Device> chosen = requested;
  std::string source = "the program's DistributedOptions::device";
  if (!chosen && !environment.empty()) {
    source = "MPIGRAD_DEVICE=" + std::string(environment);
    if (environment == "cuda") return automatic_gpu(local_rank, visibility, where, source.c_str());
    try {
      chosen = core::Device::parse(environment);
    } catch (const core::Error& error) {
      core::fail(where, " MPIGRAD_DEVICE: ", error.what());
    }
  }
  if (!chosen) {
    if (visibility.broken) return automatic_gpu(local_rank, visibility, where, "device choice");
    return visibility.has_gpu() ? core::cuda(local_rank % visibility.device_count) : core::kCPU;
  }
  if (chosen->is_cpu()) return *chosen;
  MPIGRAD_CHECK(!visibility.broken, where, " ", source, ": ", visibility.describe());
  MPIGRAD_CHECK(chosen->index < visibility.device_count, where, " ", source, ": ", *chosen,
                " is not available: ", visibility.describe());
  return *chosen;
}

void check_one_gpu_per_rank(int local_size, int device_count, const std::string& backend,
                            const std::string& where) {
  MPIGRAD_CHECK(local_size <= device_count, where, " ", local_size,
                " ranks run on this node but it has ", device_count, " visible GPU",
                device_count == 1 ? "" : "s", ": the ", backend,
                " backend needs one GPU per rank. Start at most ", device_count, " rank",
                device_count == 1 ? "" : "s", " per node (e.g. mpirun --map-by ppr:", device_count,
                ":node), make more GPUs visible, or use the mpi backend");
}

}  // namespace mpigrad::launch
