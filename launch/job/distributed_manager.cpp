// DistributedManager: MPI bring-up or adoption, rank topology, device choice, communicators.
#include "mpigrad/launch/job/distributed_manager.h"

#include <cstdlib>
#include <sstream>
#include <string_view>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"
#include "mpigrad/launch/job/device_choice.h"
#if MPIGRAD_WITH_NCCL
#include "mpigrad/launch/comm/nccl_communicator.h"
#endif

namespace mpigrad::launch {

// Member order is destruction order, reversed: communicators first, then the runtime (which
// finalizes MPI if this process started it and no other communicator still holds it).
struct DistributedManager::State {
  std::shared_ptr<MpiRuntime> runtime;
  Launcher launcher = Launcher::SingleProcess;
  CollectiveConfig config;
  core::Device device;
  // Why no device could be chosen ("" when one was): raised by device(), so that a program
  // reports it through its usual error path instead of from the constructor.
  std::string device_error;
  int node_count = 1;
  // The manager itself holds no CUDA handles: NcclCommunicators (from create_communicator) own
  // their NCCL comm, stream and events, release them in that order, and hold the runtime, so
  // MPI is finalized only after them.
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> node_local;
};

namespace {

// The rank's device (launch/job/device_choice.h), made the process's home GPU once, here, so that
// no thread of this rank ever creates a context on another GPU.
core::Device choose_device(const DistributedOptions& options, int rank, int size, int local_rank,
                           int local_size) {
  const char* environment = std::getenv("MPIGRAD_DEVICE");
  const bool wants_cpu =
      (options.device && options.device->is_cpu()) ||
      (!options.device && environment != nullptr && std::string_view(environment) == "cpu");
  // `cpu` never asks CUDA anything, so it works even where the driver is broken.
  const core::CudaVisibility visibility =
      wants_cpu ? core::CudaVisibility{} : core::cuda_visibility();
  const core::Device device =
      choose_rank_device(options.device, environment != nullptr ? environment : "", local_rank,
                         local_size, visibility, rank_label(rank, size));
  if (device.is_cuda()) core::set_cuda_home_device(device);
  return device;
}

}  // namespace

DistributedManager::DistributedManager(std::shared_ptr<MpiRuntime> runtime, MpiCommHandle&& world,
                                       DistributedOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.runtime = std::move(runtime);
  s.launcher = detect_launcher();
  s.config = options.collectives;
  s.world = std::make_unique<MpiCommunicator>(std::move(world), s.runtime, "world", s.config);
  s.node_local = s.world->split_node_local("node-local");
  // Node count: the number of node leaders (local rank 0). Through the world, so numbered and
  // watched like every collective (the world's collective #0).
  core::Tensor leaders =
      core::Tensor::from_vector<int32_t>({s.node_local->rank() == 0 ? 1 : 0}, {1});
  s.world->all_reduce(leaders);
  s.node_count = leaders.item<int32_t>();
  try {
    s.device = choose_device(options, s.world->rank(), s.world->size(), s.node_local->rank(),
                             s.node_local->size());
  } catch (const core::Error& error) {
    s.device_error = error.what();
  }
}

DistributedManager DistributedManager::initialize(int* argc, char*** argv,
                                                  DistributedOptions options) {
  std::shared_ptr<MpiRuntime> runtime = MpiRuntime::start(argc, argv);
  // Only a manager that started MPI may work on MPI_COMM_WORLD; it still works on a duplicate.
  MpiCommHandle world = duplicate_communicator(MPI_COMM_WORLD, "MPI_COMM_WORLD");
  return DistributedManager(std::move(runtime), std::move(world), std::move(options));
}

DistributedManager::DistributedManager(DistributedManager&&) noexcept = default;
DistributedManager& DistributedManager::operator=(DistributedManager&&) noexcept = default;
DistributedManager::~DistributedManager() {
  finalize();
}

void DistributedManager::finalize() {
  if (!state_) return;
  state_->node_local.reset();
  state_->world.reset();
  state_.reset();  // drops the runtime last
}

DistributedManager::State& DistributedManager::state() const {
  MPIGRAD_CHECK(state_ != nullptr,
                "DistributedManager: used after finalize() or after being moved from");
  return *state_;
}

int DistributedManager::rank() const {
  return state().world->rank();
}
int DistributedManager::world_size() const {
  return state().world->size();
}
int DistributedManager::local_rank() const {
  return state().node_local->rank();
}
int DistributedManager::local_size() const {
  return state().node_local->size();
}
int DistributedManager::node_count() const {
  return state().node_count;
}
core::Device DistributedManager::device() const {
  MPIGRAD_CHECK(state().device_error.empty(), state().device_error);
  return state().device;
}
void DistributedManager::set_device(core::Device device) {
  state().device = device;
  state().device_error.clear();
}
Launcher DistributedManager::launcher() const {
  return state().launcher;
}
void DistributedManager::abort_job(int exit_code) {
  launch::abort_job(state().world->handle().comm, exit_code);
}
bool DistributedManager::owns_mpi() const {
  return state().runtime->owns_mpi();
}
ThreadLevel DistributedManager::thread_level() const {
  return state().runtime->thread_level();
}
const CollectiveConfig& DistributedManager::collective_config() const {
  return state().config;
}
void DistributedManager::set_collective_config(const CollectiveConfig& config) {
  state().config = config;
}
Communicator& DistributedManager::world() {
  return *state().world;
}
Communicator& DistributedManager::node_local() {
  return *state().node_local;
}

std::string DistributedManager::describe() const {
  std::ostringstream out;
  out << "rank " << rank() << "/" << world_size() << " (local " << local_rank() << "/"
      << local_size() << ", " << node_count() << (simulated_node_count() > 0 ? " simulated" : "")
      << (node_count() == 1 ? " node" : " nodes") << "), device "
      << (state().device_error.empty() ? device().str()
                                       : "unavailable (" + state().device_error + ")")
      << ", " << launcher_name(launcher()) << ", " << thread_level_name(thread_level()) << ", "
      << (owns_mpi() ? "owns MPI" : "adopted MPI");
  return out.str();
}

std::unique_ptr<Communicator> create_communicator(DistributedManager& manager, Backend backend,
                                                  core::Device device, std::string name) {
  if (backend == Backend::Auto) backend = device.is_cuda() ? Backend::Nccl : Backend::Mpi;
  auto& world = dynamic_cast<MpiCommunicator&>(manager.world());
  if (backend == Backend::Nccl) {
#if MPIGRAD_WITH_NCCL
    const int count = core::cuda_device_count();
    MPIGRAD_CHECK(count > 0, world.world_label(),
                  " create_communicator: the nccl backend was requested",
                  device.is_cuda() ? " (for " + device.str() + " tensors)" : std::string(),
                  " but no CUDA device is visible; use --backend mpi with host tensors");
    check_one_gpu_per_rank(manager.local_size(), count, "nccl", world.world_label());
    // A CPU device means "the GPU this rank would use": the manager's, or local_rank % count.
    core::Device gpu = device.is_cuda()             ? device
                       : manager.device().is_cuda() ? manager.device()
                                                    : core::cuda(manager.local_rank() % count);
    // A duplicate of the world: its ranks are the world's, numbered the same.
    return std::make_unique<NcclCommunicator>(
        duplicate_communicator(world.handle().comm, name, world.world_label()), world.runtime(),
        gpu, std::move(name), manager.collective_config(), world.world_ranks());
#else
    core::fail(world.world_label(), " create_communicator: the nccl backend was requested",
               device.is_cuda() ? " (auto, for " + device.str() + " tensors)" : std::string(),
               " but mpigrad was built without CUDA/NCCL; use --backend mpi with host tensors");
#endif
  }
  return std::make_unique<MpiCommunicator>(
      duplicate_communicator(world.handle().comm, name, world.world_label()), world.runtime(),
      std::move(name), manager.collective_config(), world.world_ranks());
}

}  // namespace mpigrad::launch
