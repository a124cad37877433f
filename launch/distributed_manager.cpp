// DistributedManager: MPI bring-up or adoption, rank topology, device choice, communicators.
#include "mpigrad/launch/distributed_manager.h"

#include <cstdlib>
#include <sstream>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/mpi_communicator.h"
#include "mpigrad/launch/mpi_interop.h"

namespace mpigrad::launch {

// Member order is destruction order, reversed: communicators first, then the runtime (which
// finalizes MPI if this process started it and no other communicator still holds it).
struct DistributedManager::State {
  std::shared_ptr<MpiRuntime> runtime;
  Launcher launcher = Launcher::SingleProcess;
  CollectiveConfig config;
  core::Device device;
  int node_count = 1;
  // (Future) CUDA streams/events of the manager would sit here, between the runtime and the
  // communicators, so they are destroyed after the NCCL communicators and before MPI.
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> node_local;
};

namespace {

// The device hook. With the CUDA backend this becomes cuda(local_rank % device_count) when
// device_count > 0; mpigrad has no CUDA backend yet, so it is always the CPU and nothing here
// calls CUDA.
core::Device default_device(int /*local_rank*/) { return core::kCPU; }

core::Device choose_device(const DistributedOptions& options, int local_rank) {
  if (options.device) return *options.device;
  if (const char* text = std::getenv("MPIGRAD_DEVICE"); text != nullptr && *text) {
    return core::Device::parse(text);
  }
  return default_device(local_rank);
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
  // Node count: the number of node leaders (local rank 0).
  int leader = s.node_local->rank() == 0 ? 1 : 0;
  int leaders = 0;
  check_mpi(MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, s.world->handle().comm),
            "MPI_Allreduce", "node count on 'world'");
  s.node_count = leaders;
  s.device = choose_device(options, s.node_local->rank());
}

DistributedManager DistributedManager::initialize(int* argc, char*** argv, DistributedOptions options) {
  std::shared_ptr<MpiRuntime> runtime = MpiRuntime::start(argc, argv);
  // Only a manager that started MPI may work on MPI_COMM_WORLD; it still works on a duplicate.
  MpiCommHandle world = duplicate_communicator(MPI_COMM_WORLD, "MPI_COMM_WORLD");
  return DistributedManager(std::move(runtime), std::move(world), std::move(options));
}

DistributedManager adopt_communicator(MPI_Comm comm, DistributedOptions options) {
  std::shared_ptr<MpiRuntime> runtime = MpiRuntime::attach();
  MpiCommHandle world = duplicate_communicator(comm, "adopted communicator");
  return DistributedManager(std::move(runtime), std::move(world), std::move(options));
}

DistributedManager adopt_communicator_fortran(MPI_Fint comm, DistributedOptions options) {
  return adopt_communicator(MPI_Comm_f2c(comm), std::move(options));
}

DistributedManager::DistributedManager(DistributedManager&&) noexcept = default;
DistributedManager& DistributedManager::operator=(DistributedManager&&) noexcept = default;
DistributedManager::~DistributedManager() { finalize(); }

void DistributedManager::finalize() {
  if (!state_) return;
  state_->node_local.reset();
  state_->world.reset();
  state_.reset();  // drops the runtime last
}

DistributedManager::State& DistributedManager::state() const {
  MPIGRAD_CHECK(state_ != nullptr, "DistributedManager: used after finalize() or after being moved from");
  return *state_;
}

int DistributedManager::rank() const { return state().world->rank(); }
int DistributedManager::world_size() const { return state().world->size(); }
int DistributedManager::local_rank() const { return state().node_local->rank(); }
int DistributedManager::local_size() const { return state().node_local->size(); }
int DistributedManager::node_count() const { return state().node_count; }
core::Device DistributedManager::device() const { return state().device; }
void DistributedManager::set_device(core::Device device) { state().device = device; }
Launcher DistributedManager::launcher() const { return state().launcher; }
bool DistributedManager::owns_mpi() const { return state().runtime->owns_mpi(); }
ThreadLevel DistributedManager::thread_level() const { return state().runtime->thread_level(); }
const CollectiveConfig& DistributedManager::collective_config() const { return state().config; }
Communicator& DistributedManager::world() { return *state().world; }
Communicator& DistributedManager::node_local() { return *state().node_local; }

std::string DistributedManager::describe() const {
  std::ostringstream out;
  out << "rank " << rank() << "/" << world_size() << " (local " << local_rank() << "/"
      << local_size() << ", " << node_count() << (node_count() == 1 ? " node" : " nodes")
      << "), device " << device() << ", " << launcher_name(launcher()) << ", "
      << thread_level_name(thread_level()) << ", " << (owns_mpi() ? "owns MPI" : "adopted MPI");
  return out.str();
}

std::unique_ptr<Communicator> create_communicator(DistributedManager& manager, Backend backend,
                                                  core::Device device, std::string name) {
  if (backend == Backend::Auto) backend = device.is_cuda() ? Backend::Nccl : Backend::Mpi;
  MPIGRAD_CHECK(backend != Backend::Nccl, "create_communicator: the nccl backend was requested",
                device.is_cuda() ? " (auto, for " + device.str() + " tensors)" : std::string(),
                " but mpigrad was built without CUDA/NCCL; use --backend mpi with host tensors");
  auto& world = dynamic_cast<MpiCommunicator&>(manager.world());
  return std::make_unique<MpiCommunicator>(
      duplicate_communicator(world.handle().comm, name), world.runtime(), std::move(name),
      manager.collective_config());
}

}  // namespace mpigrad::launch
