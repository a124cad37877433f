// DistributedManager: MPI bring-up or adoption, rank topology, device choice, communicators.
#include "mpigrad/launch/job/distributed_manager.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/peer_liveness.h"
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
  core::ThreadChoice threads;  // what this rank's CPU kernels use, and why
  // The manager itself holds no CUDA handles: NcclCommunicators (from create_communicator) own
  // their NCCL comm, stream and events, release them in that order, and hold the runtime, so
  // MPI is finalized only after them.
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> node_local;
  // Names a rank that dies (peer_liveness.h); says goodbye before the communicators go.
  std::unique_ptr<PeerLiveness> liveness;
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

// This rank's threads: its share of the cores in its affinity mask among the ranks of its node
// that may run on them too (core/threads.h), from the masks of the node's ranks as MPI's
// shared-memory split groups them, never from a launcher's variables (srun -n N without
// --ntasks-per-node sets none). Simulated nodes all run on this one machine, so there the whole
// world's masks count. Applied unless the program chose a count itself.
core::ThreadChoice share_node_cores(Communicator& node) {
  const std::vector<int> mine = core::affinity_cpus();
  const std::string cores = std::to_string(mine.size()) + (mine.size() == 1 ? " core" : " cores") +
                            " in the affinity mask";
  if (node.size() == 1) {
    return core::apply_default_threads(core::default_thread_choice(double(mine.size()), cores));
  }
  core::Tensor width = core::Tensor::from_vector<int64_t>({int64_t(mine.back()) + 1}, {1});
  node.all_reduce(width, ReduceOp::Max);
  const int64_t cpus = width.item<int64_t>();
  std::vector<uint8_t> bitmap(size_t(cpus), 0);
  for (int cpu : mine) bitmap[size_t(cpu)] = 1;
  core::Tensor gathered = core::zeros({cpus * node.size()}, core::kUInt8);
  node.all_gather(core::Tensor::from_vector<uint8_t>(bitmap, {cpus}), gathered);
  const std::vector<uint8_t> all = gathered.to_vector<uint8_t>();
  std::vector<std::vector<int>> masks(size_t(node.size()));
  int sharing = 0;  // the ranks whose masks hold any of this rank's cores, this one included
  for (int r = 0; r < node.size(); ++r) {
    bool overlaps = false;
    for (int64_t cpu = 0; cpu < cpus; ++cpu) {
      if (all[size_t(r * cpus + cpu)] == 0) continue;
      masks[size_t(r)].push_back(int(cpu));
      overlaps = overlaps || bitmap[size_t(cpu)] != 0;
    }
    sharing += overlaps ? 1 : 0;
  }
  const double share = core::core_share(mine, masks);
  std::string source =
      cores + (sharing == 1 ? ", used by no other rank of the node"
                            : ", shared by " + std::to_string(sharing) + " ranks of the node");
  if (sharing > 1 && std::abs(share * sharing - double(mine.size())) > 1e-6) {
    char text[48];
    std::snprintf(text, sizeof text, " (a share of %.3g)", share);
    source += text;
  }
  return core::apply_default_threads(core::default_thread_choice(share, source));
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
  s.threads = share_node_cores(simulated_node_count() > 0 ? *s.world : *s.node_local);
  // Only where mpigrad started MPI (and handles the launcher's signals): a host code that hands
  // over its communicator keeps its process to itself.
  if (s.runtime->owns_mpi()) s.liveness = PeerLiveness::start(*s.world);
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
  state_->liveness.reset();
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
const core::ThreadChoice& DistributedManager::threads() const {
  return state().threads;
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
      << ", " << state().threads.threads
      << (state().threads.threads == 1 ? " thread (" : " threads (") << state().threads.source
      << "), " << launcher_name(launcher()) << ", " << thread_level_name(thread_level()) << ", "
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
