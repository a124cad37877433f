#include "devices_command.h"

#include <cstdio>
#include <cstring>
#include <exception>

#include "mpigrad/core/cuda.h"

namespace mpigrad::launch {

int run_devices_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: mpigrad devices\n\n"
          "Lists the GPUs this process can use. Exit status: 0 with at least one GPU, 2\n"
          "when none is visible (no device, no driver, or CUDA_VISIBLE_DEVICES hides\n"
          "them), 1 when CUDA reports any other error (a broken GPU or driver).\n");
      return 0;
    }
    std::fprintf(stderr, "mpigrad devices: unknown argument '%s' (see --help)\n", argv[i]);
    return 2;
  }
  const core::CudaVisibility& visibility = core::cuda_visibility();
  if (!visibility.has_gpu()) {
    std::printf("%s\n", visibility.describe().c_str());
    return visibility.broken ? 1 : 2;
  }
  try {
    for (int index = 0; index < visibility.device_count; ++index) {
      const core::CudaDeviceInfo info = core::cuda_device_info(core::cuda(index));
      std::printf("cuda:%d  %s  %.1f GiB  compute capability %d.%d  %d multiprocessors\n", index,
                  info.name.c_str(), double(info.total_memory_bytes) / double(1 << 30),
                  info.compute_major, info.compute_minor, info.multiprocessors);
    }
    std::printf("%s\n", core::cuda_versions().c_str());
  } catch (const std::exception& error) {
    std::printf("CUDA is broken: %s\n", error.what());
    return 1;
  }
  return 0;
}

}  // namespace mpigrad::launch
