// Everything a training program needs to know about its place in the job: rank and world size,
// its rank and the rank count on its node, the node count, the device it should use, and the
// communicators over the world and over its node.
//
// Two ways in:
// - DistributedManager::initialize(&argc, &argv): starts MPI (MPI_Init_thread asking for
//   MPI_THREAD_MULTIPLE) unless it is already running, and finalizes it at the end only if it
//   started it. A plain ./program with no launcher is a world of size 1.
// - adopt_communicator(MPI_Comm) from mpi_interop.h: a host code that owns MPI hands over a
//   communicator; the manager works on a duplicate of it and never touches MPI_COMM_WORLD.
//
// There is no global instance: the program owns the manager and passes it (or its
// communicators) down. Destruction order is explicit: an NcclCommunicator releases its NCCL
// comm first, then its CUDA stream and events, then its MPI communicators; MPI itself is
// finalized only when the last communicator anyone still holds is gone, because each one keeps
// the runtime alive.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "mpigrad/core/device.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/mpi_runtime.h"
#include "mpigrad/launch/job/launcher.h"

namespace mpigrad::launch {

struct MpiCommHandle;

struct DistributedOptions {
  // Overrides the automatic device choice, as MPIGRAD_DEVICE=cpu|cuda|cuda:N in the environment
  // does when this is unset (launch/job/device_choice.h has the whole rule).
  std::optional<core::Device> device;
  CollectiveConfig collectives = CollectiveConfig::from_environment();
};

class DistributedManager {
 public:
  // Starts or attaches to MPI and builds the world and node-local communicators.
  static DistributedManager initialize(int* argc = nullptr, char*** argv = nullptr,
                                       DistributedOptions options = {});
  // Used by adopt_communicator (mpi_interop.h): builds a manager over a communicator the
  // manager already owns (a duplicate of the host's) on an attached runtime.
  DistributedManager(std::shared_ptr<MpiRuntime> runtime, MpiCommHandle&& world,
                     DistributedOptions options);

  DistributedManager(DistributedManager&&) noexcept;
  DistributedManager& operator=(DistributedManager&&) noexcept;
  ~DistributedManager();

  int rank() const;
  int world_size() const;
  // Which ranks share a node: MPI's shared-memory split, or MPIGRAD_SIMULATE_NODES's blocks
  // (communicator.h, simulated_node_count).
  int local_rank() const;
  int local_size() const;
  int node_count() const;
  bool is_main_process() const { return rank() == 0; }

  // Chosen once, when the manager is built (launch/job/device_choice.h): CUDA local_rank %
  // device_count when GPUs are visible, otherwise the CPU; options.device or MPIGRAD_DEVICE
  // override it. A GPU chosen there is made the process's home device (core/cuda.h), so nothing
  // of this rank creates a context on another GPU. When no device can be had (MPIGRAD_DEVICE=cuda:3
  // with 2 GPUs, a broken GPU), the manager is still built and device() throws that core::Error.
  core::Device device() const;
  // Changes what device() reports (the home GPU stays as chosen at start-up).
  void set_device(core::Device device);

  // This rank's CPU threads and where the count came from: its share of the cores in its
  // affinity mask among the ranks of its node that may run on them too (core/threads.h), applied
  // when the manager is built unless the program called core::set_num_threads.
  const core::ThreadChoice& threads() const;

  Launcher launcher() const;
  bool owns_mpi() const;
  ThreadLevel thread_level() const;
  const CollectiveConfig& collective_config() const;
  // Applies to communicators created from now on (create_communicator, split); the world and
  // node-local ones keep the configuration they were built with.
  void set_collective_config(const CollectiveConfig& config);

  // The world (a duplicate of MPI_COMM_WORLD, or of the adopted communicator) and the ranks
  // sharing this node (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED).
  Communicator& world();
  Communicator& node_local();

  // One line for logs: "rank 0/4 (local 0/2, 2 nodes), device cpu, 1 thread (2 cores in the
  // affinity mask, shared by 2 ranks of the node), Open MPI (mpirun), MPI_THREAD_MULTIPLE, owns
  // MPI" ("2 simulated nodes" under MPIGRAD_SIMULATE_NODES).
  std::string describe() const;

  // Ends the whole job with `exit_code` after a failure on this rank, without waiting for the
  // other ranks (MPI_Abort over the world; launch/comm/mpi_handle.h's abort_job says how it
  // also ends mpirun --enable-recovery). Never returns.
  [[noreturn]] void abort_job(int exit_code);

  // Releases the manager's communicators now and, if it started MPI and nothing else holds a
  // communicator, finalizes MPI. The destructor does the same; calling it twice is harmless.
  void finalize();

 private:
  struct State;
  std::unique_ptr<State> state_;
  State& state() const;
};

// A new communicator over the same ranks as manager.world() for tensors on `device`:
// Backend::Auto picks NCCL for CUDA devices and MPI for the CPU. Backend::Nccl with a CPU
// `device` uses the GPU this rank would (manager.device() if it is one, else
// cuda(local_rank % device_count)); it needs one GPU per rank of the node, and more ranks than
// GPUs on a node is one error naming both counts. NCCL communicators
// (launch/comm/nccl_communicator.h) are
// stream-ordered: Work::wait() makes the caller's current CUDA stream wait, not the host.
// Without the CUDA/NCCL backend, asking for NCCL (or Auto with a CUDA device) throws a clear
// core::Error, and so does a CUDA build when no CUDA device is visible.
std::unique_ptr<Communicator> create_communicator(DistributedManager& manager, Backend backend,
                                                  core::Device device = core::kCPU,
                                                  std::string name = "world");

}  // namespace mpigrad::launch
