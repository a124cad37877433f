// MpiCommunicator: each collective's description (collective.h) in MPI's terms, the blocking and
// nonblocking MPI calls, the debug agreement check, and the world ranks of a split.
#include "mpigrad/launch/comm/mpi_communicator.h"

#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/kernels/dtype.h"
#include "mpigrad/launch/comm/collective_check.h"
#include "mpigrad/launch/comm/collective_watchdog.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

struct MpiCommunicator::State {
  std::shared_ptr<MpiRuntime> runtime;  // destroyed last: MPI outlives the communicators
  MpiCommHandle comm;                   // the collectives' traffic
  MpiCommHandle control;                // watchdog queries and debug checks only
  std::string name;
  int rank = 0;
  int size = 1;
  std::shared_ptr<const WorldRanks> world;  // this communicator's ranks in mpigrad's world
  int world_rank = 0;
  CollectiveConfig config;
  // Each dtype's MPI datatype and reduction operators, looked up once at construction so a
  // call does not (MPI_OP_NULL: not supported; the slow path says why).
  std::array<MPI_Datatype, kernels::kNumDTypes> types{};
  std::array<std::array<MPI_Op, 4>, kernels::kNumDTypes> ops{};
  std::unique_ptr<CollectiveWatchdog> watchdog;  // destroyed first: its thread uses `control`

  ~State() { watchdog.reset(); }

  // "[rank r/w]" in world numbers: what every message of this communicator starts with.
  std::string label() const { return rank_label(world_rank, world->size); }
};

namespace {

using Kind = CollectiveKind;

// "[rank 3/4] all_reduce on communicator 'world inter-node': "
std::string where(const MpiCommunicator::State& state, const char* op) {
  return state.label() + " " + op + " on communicator '" + state.name + "': ";
}

// The MPI backend's own limit; Communicator has checked everything else.
[[noreturn, gnu::cold, gnu::noinline]] void count_too_large(const MpiCommunicator::State& state,
                                                            int64_t count, const char* op) {
  core::fail(where(state, op), count, " elements exceed MPI's int count limit (", INT_MAX,
             "); split the tensor");
}

inline int to_int_count(int64_t count, const char* op, const MpiCommunicator::State& state) {
  if (count > INT_MAX) [[unlikely]]
    count_too_large(state, count, op);
  return int(count);
}

// Why a dtype has no reduction op in the table (bool): the runtime's lookup raises the reason.
[[noreturn, gnu::cold, gnu::noinline]] void unsupported_reduction(
    const MpiCommunicator::State& state, Kind kind, core::DType dtype, ReduceOp op) {
  const char* name = collective_kind_name(kind);
  try {
    state.runtime->reduction_ops().find(dtype, op);
  } catch (const core::Error& error) {
    core::fail(where(state, name), error.what());
  }
  core::fail(where(state, name), "no MPI reduction for ", dtype);
}

// One collective in MPI's terms: its description (collective.h, which Communicator has checked)
// with the datatype and reduction operator looked up and the counts as MPI's ints, which is
// all that is left to check here.
struct Call {
  Collective what;  // its tensors borrowed (an MpiWork points them at its own references)
  MPI_Datatype type = MPI_BYTE;
  MPI_Op mpi_op = MPI_SUM;
  int count = 0;
  std::vector<int> counts, displs;  // the v forms; MPI reads them until an async one completes
  const void* send = nullptr;       // MPI_IN_PLACE when in place
  void* recv = nullptr;
};

Call translate(const MpiCommunicator::State& state, const Collective& collective) {
  Call call;
  call.what = collective;
  const char* name = collective_kind_name(collective.kind);
  call.type = state.types[size_t(collective.dtype)];
  call.count = to_int_count(collective.count, name, state);
  if (collective.is_reduction()) {
    call.mpi_op = state.ops[size_t(collective.dtype)][size_t(collective.op)];
    if (call.mpi_op == MPI_OP_NULL) [[unlikely]]
      unsupported_reduction(state, collective.kind, collective.dtype, collective.op);
  }
  if (collective.is_v()) {
    int64_t offset = 0;
    for (int64_t count : collective.counts) {
      call.counts.push_back(to_int_count(count, name, state));
      call.displs.push_back(to_int_count(offset, name, state));
      offset += count;
    }
  }
  call.send = collective.in_place           ? MPI_IN_PLACE
              : collective.input != nullptr ? collective.input->data_ptr()
                                            : nullptr;
  call.recv = collective.output != nullptr ? collective.output->data_ptr() : nullptr;
  return call;
}

// Issues `call` on `comm`: the blocking MPI collective when `request` is null, otherwise its
// nonblocking MPI_I* form. Returns MPI's code; `what` names the call for an error.
int issue(const Call& c, MPI_Comm comm, MPI_Request* request, const char*& what) {
  const bool blocking = request == nullptr;
  const int root = c.what.root;
  switch (c.what.kind) {
    case Kind::AllReduce:
      what = blocking ? "MPI_Allreduce" : "MPI_Iallreduce";
      return blocking ? MPI_Allreduce(c.send, c.recv, c.count, c.type, c.mpi_op, comm)
                      : MPI_Iallreduce(c.send, c.recv, c.count, c.type, c.mpi_op, comm, request);
    case Kind::Broadcast:
      what = blocking ? "MPI_Bcast" : "MPI_Ibcast";
      return blocking ? MPI_Bcast(c.recv, c.count, c.type, root, comm)
                      : MPI_Ibcast(c.recv, c.count, c.type, root, comm, request);
    case Kind::AllGather:
      what = blocking ? "MPI_Allgather" : "MPI_Iallgather";
      return blocking
                 ? MPI_Allgather(c.send, c.count, c.type, c.recv, c.count, c.type, comm)
                 : MPI_Iallgather(c.send, c.count, c.type, c.recv, c.count, c.type, comm, request);
    case Kind::AllGatherV:
      what = blocking ? "MPI_Allgatherv" : "MPI_Iallgatherv";
      return blocking ? MPI_Allgatherv(c.send, c.count, c.type, c.recv, c.counts.data(),
                                       c.displs.data(), c.type, comm)
                      : MPI_Iallgatherv(c.send, c.count, c.type, c.recv, c.counts.data(),
                                        c.displs.data(), c.type, comm, request);
    case Kind::ReduceScatter:
      what = blocking ? "MPI_Reduce_scatter_block" : "MPI_Ireduce_scatter_block";
      return blocking ? MPI_Reduce_scatter_block(c.send, c.recv, c.count, c.type, c.mpi_op, comm)
                      : MPI_Ireduce_scatter_block(c.send, c.recv, c.count, c.type, c.mpi_op, comm,
                                                  request);
    case Kind::Gather:
      what = blocking ? "MPI_Gather" : "MPI_Igather";
      return blocking ? MPI_Gather(c.send, c.count, c.type, c.recv, c.count, c.type, root, comm)
                      : MPI_Igather(c.send, c.count, c.type, c.recv, c.count, c.type, root, comm,
                                    request);
    case Kind::GatherV:
      what = blocking ? "MPI_Gatherv" : "MPI_Igatherv";
      return blocking ? MPI_Gatherv(c.send, c.count, c.type, c.recv, c.counts.data(),
                                    c.displs.data(), c.type, root, comm)
                      : MPI_Igatherv(c.send, c.count, c.type, c.recv, c.counts.data(),
                                     c.displs.data(), c.type, root, comm, request);
    case Kind::Barrier:
      what = blocking ? "MPI_Barrier" : "MPI_Ibarrier";
      return blocking ? MPI_Barrier(comm) : MPI_Ibarrier(comm, request);
  }
  what = "?";
  return MPI_ERR_OTHER;
}

// Avg = sum / size, applied to the output after the sum completes.
void divide_by(const core::Tensor& tensor, int divisor) {
  kernels::visit_floating(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using C = kernels::compute_t<T>;
    T* data = static_cast<T*>(tensor.data_ptr());
    C scale = C(1) / C(divisor);
    for (int64_t i = 0, n = tensor.numel(); i < n; ++i) data[i] = T(C(data[i]) * scale);
  });
}

void finish(const Collective& collective, int size) {
  if (collective.is_reduction() && collective.op == ReduceOp::Avg && size > 1) {
    divide_by(*collective.output, size);
  }
}

// Numbers the collective and, with MPIGRAD_DEBUG_COLLECTIVES, checks it against every rank's;
// returns its sequence number.
uint64_t begin(const MpiCommunicator::State& state, const Collective& collective) {
  uint64_t seq = state.watchdog->next_sequence();
  if (state.config.debug_collectives) {
    check_collective_agreement(state.control, *state.world,
                               state.label() + " communicator '" + state.name + "'", state.name,
                               collective, seq);
  }
  return seq;
}

// Kept out of line, so that run_collective stays a thin dispatch for the all-reduce's path.
[[gnu::noinline]] void run_blocking(MpiCommunicator::State& state, const Collective& collective) {
  const Call call = translate(state, collective);
  const uint64_t seq = begin(state, call.what);
  const char* what = "";
  int rc = MPI_SUCCESS;
  {
    CollectiveWatchdog::WaitScope scope(*state.watchdog, seq, collective_kind_name(call.what.kind),
                                        call.what.bytes);
    rc = issue(call, state.comm.comm, nullptr, what);
  }
  if (rc != MPI_SUCCESS) [[unlikely]] {
    check_mpi(rc, what, "communicator '" + state.name + "', collective #" + std::to_string(seq),
              state.label());
  }
  finish(call.what, state.size);
}

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiCommunicator::State> state, Call call, uint64_t seq)
      : state_(std::move(state)), call_(std::move(call)), seq_(seq) {
    if (call_.what.input != nullptr) input_ = *call_.what.input;
    if (call_.what.output != nullptr) output_ = *call_.what.output;
    call_.what.input = &input_;
    call_.what.output = &output_;
    call_.what.counts = {};  // the caller's, gone once the call returns; MPI reads call_.counts
  }

  ~MpiWork() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "%s\n", error.what());
    }
  }

  // Issues the nonblocking call. The Work owns the Call because MPI reads the buffers and the
  // v forms' count and displacement arrays until the operation completes.
  void start() {
    const char* what = "";
    const int rc = issue(call_, state_->comm.comm, &request_, what);
    if (rc != MPI_SUCCESS) done_ = true;  // nothing in flight to wait for in the destructor
    check(rc, what);
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) complete();
    return done_;
  }

  void wait() override {
    if (done_) return;
    CollectiveWatchdog::WaitScope scope(*state_->watchdog, seq_, name(), call_.what.bytes);
    check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    complete();
  }

  // A fixed 50 us nap: over a 2 Gbit/s link that is 12 KB of data, far less than a socket
  // buffer, so the link never waits for the poll, and the thread costs a few percent of a core
  // instead of all of it (HierarchicalAllReduce's header has the measurements).
  void wait_sleeping() override {
    if (done_) return;
    CollectiveWatchdog::WaitScope scope(*state_->watchdog, seq_, name(), call_.what.bytes);
    while (true) {
      int flag = 0;
      check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (flag) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    complete();
  }

 private:
  const char* name() const { return collective_kind_name(call_.what.kind); }
  // The message is only built on failure: test() runs in tight polling loops.
  void check(int rc, const char* what) const {
    if (rc != MPI_SUCCESS) [[unlikely]]
      check_mpi(rc, what, context(), state_->label());
  }
  std::string context() const {
    return std::string(name()) + " #" + std::to_string(seq_) + " on communicator '" + state_->name +
           "'";
  }
  void complete() {
    done_ = true;
    finish(call_.what, state_->size);
    input_ = core::Tensor();  // release the buffers as soon as MPI is done with them
    output_ = core::Tensor();
  }

  std::shared_ptr<MpiCommunicator::State> state_;
  Call call_;
  core::Tensor input_, output_;
  uint64_t seq_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

}  // namespace

// ---- MpiCommunicator ----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MpiCommHandle&& comm, std::shared_ptr<MpiRuntime> runtime,
                                 std::string name, CollectiveConfig config,
                                 std::shared_ptr<const WorldRanks> world)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.runtime = std::move(runtime);
  s.comm = std::move(comm);
  s.name = std::move(name);
  s.config = config;
  check_mpi(MPI_Comm_set_errhandler(s.comm.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
            s.name);
  check_mpi(MPI_Comm_rank(s.comm.comm, &s.rank), "MPI_Comm_rank", s.name);
  check_mpi(MPI_Comm_size(s.comm.comm, &s.size), "MPI_Comm_size", s.name);
  s.world = world ? std::move(world) : gather_world_ranks(s.comm.comm, s.name);
  MPIGRAD_CHECK(int(s.world->of_member.size()) == s.size, "MpiCommunicator '", s.name,
                "': world ranks for ", s.world->of_member.size(), " ranks, but it has ", s.size);
  s.world_rank = s.world->of_member[size_t(s.rank)];
  place_in_world(s.world);
  for (int d = 0; d < kernels::kNumDTypes; ++d) {
    const auto dtype = core::DType(d);
    s.types[size_t(d)] = mpi_datatype(dtype);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      MPI_Op& slot = s.ops[size_t(d)][size_t(op)];
      try {
        slot = s.runtime->reduction_ops().find(dtype, op);
      } catch (const core::Error&) {
        slot = MPI_OP_NULL;  // reduce_call asks again, for the message
      }
    }
  }
  s.control =
      duplicate_communicator(s.comm.comm, "control communicator of '" + s.name + "'", s.label());
  s.watchdog =
      std::make_unique<CollectiveWatchdog>(s.control, s.name, s.world, config.timeout_seconds,
                                           s.runtime->thread_level() == ThreadLevel::Multiple);
}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const {
  return state_->rank;
}
int MpiCommunicator::size() const {
  return state_->size;
}
const std::string& MpiCommunicator::name() const {
  return state_->name;
}
const MpiCommHandle& MpiCommunicator::handle() const {
  return state_->comm;
}
const std::shared_ptr<MpiRuntime>& MpiCommunicator::runtime() const {
  return state_->runtime;
}
uint64_t MpiCommunicator::collectives_started() const {
  return state_->watchdog->started();
}

WorkPtr MpiCommunicator::start_collective(const Collective& collective) {
  Call call = translate(*state_, collective);
  const uint64_t seq = begin(*state_, collective);
  auto work = std::make_shared<MpiWork>(state_, std::move(call), seq);
  work->start();
  return work;
}

void MpiCommunicator::run_collective(const Collective& collective) {
  if (collective.kind == Kind::AllReduce && !state_->config.debug_collectives) [[likely]] {
    all_reduce_now(collective);
    return;
  }
  run_blocking(*state_, collective);
}

// The one latency-bound collective (SyncBatchNorm's statistics, DDP's small buckets, metrics),
// written out: the sequence number, the watchdog's bracket and MPI_Allreduce, with no Call in
// between. Counted with callgrind on an 8-byte in-place all-reduce (one rank, Open MPI 4.1),
// mpigrad's instructions a call on top of raw MPI_Allreduce's 120: 325 through a Call and
// run_blocking, 161 written out like this, 202 once Communicator made the checks before a
// virtual call per operation, and 216 now that the call arrives as a Collective (its 11 fields
// filled once; run_collective's dispatch costs 6). The debug agreement check takes the general
// path.
void MpiCommunicator::all_reduce_now(const Collective& collective) {
  State& s = *state_;
  const core::DType dtype = collective.dtype;
  const MPI_Op mpi_op = s.ops[size_t(dtype)][size_t(collective.op)];
  if (mpi_op == MPI_OP_NULL) [[unlikely]]
    unsupported_reduction(s, Kind::AllReduce, dtype, collective.op);
  // Every check before the sequence number: a refused call takes no collective's number.
  const int mpi_count = to_int_count(collective.count, "all_reduce", s);
  void* recv = collective.output->data_ptr();
  const void* send = collective.in_place ? MPI_IN_PLACE : collective.input->data_ptr();
  const uint64_t seq = s.watchdog->next_sequence();
  int rc = MPI_SUCCESS;
  {
    CollectiveWatchdog::WaitScope scope(*s.watchdog, seq, "all_reduce", collective.bytes);
    rc = MPI_Allreduce(send, recv, mpi_count, s.types[size_t(dtype)], mpi_op, s.comm.comm);
  }
  if (rc != MPI_SUCCESS) [[unlikely]] {
    check_mpi(rc, "MPI_Allreduce",
              "communicator '" + s.name + "', collective #" + std::to_string(seq), s.label());
  }
  if (collective.op == ReduceOp::Avg && s.size > 1) divide_by(*collective.output, s.size);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) {
  const State& s = *state_;
  MPI_Comm part = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(s.comm.comm, color < 0 ? MPI_UNDEFINED : color, key, &part),
            "MPI_Comm_split", "communicator '" + s.name + "' into '" + name + "'", s.label());
  if (part == MPI_COMM_NULL) return nullptr;
  MpiCommHandle handle(part);
  auto world = world_ranks_within(part, s.comm.comm, *s.world);
  return std::make_unique<MpiCommunicator>(std::move(handle), s.runtime, std::move(name), s.config,
                                           std::move(world));
}

std::unique_ptr<Communicator> MpiCommunicator::split_node_local(std::string name) {
  const State& s = *state_;
  MPI_Comm part = MPI_COMM_NULL;
  int nodes = 0;
  try {
    nodes = simulated_node_count();
  } catch (const core::Error& error) {
    core::fail(s.label(), " ", error.what());
  }
  if (nodes > 0) {
    // Every rank sees the same size and the same variable, so every rank raises this or none.
    MPIGRAD_CHECK(s.size % nodes == 0, s.label(), " MPIGRAD_SIMULATE_NODES=", nodes, ": the ",
                  s.size, " ranks of communicator '", s.name, "' do not split into ", nodes,
                  " equal nodes; launch a multiple of ", nodes, " ranks or change the variable");
    const int per_node = s.size / nodes;
    check_mpi(MPI_Comm_split(s.comm.comm, s.rank / per_node, s.rank, &part), "MPI_Comm_split",
              "simulated node of communicator '" + s.name + "'", s.label());
  } else {
    check_mpi(MPI_Comm_split_type(s.comm.comm, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &part),
              "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", "communicator '" + s.name + "'",
              s.label());
  }
  MpiCommHandle handle(part);
  auto world = world_ranks_within(part, s.comm.comm, *s.world);
  return std::make_unique<MpiCommunicator>(std::move(handle), s.runtime, std::move(name), s.config,
                                           std::move(world));
}

// ---- Interop ------------------------------------------------------------------------------------

MpiCommHandle duplicate_communicator(MPI_Comm comm, std::string_view what, std::string_view label) {
  MPIGRAD_CHECK(comm != MPI_COMM_NULL, "mpigrad: cannot duplicate MPI_COMM_NULL (", what, ")");
  MPI_Comm copy = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup", what, label);
  MpiCommHandle handle(copy);
  check_mpi(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", what,
            label);
  return handle;
}

std::shared_ptr<const WorldRanks> gather_world_ranks(MPI_Comm world, std::string_view what) {
  int size = 1, rank = 0;
  check_mpi(MPI_Comm_size(world, &size), "MPI_Comm_size", what);
  check_mpi(MPI_Comm_rank(world, &rank), "MPI_Comm_rank", what);
  auto ranks = std::make_shared<WorldRanks>(WorldRanks::identity(size));
  // Fixed-size names (Linux's HOST_NAME_MAX is 64), one all-gather when the world is built.
  constexpr int kHostBytes = 64;
  std::array<char, kHostBytes> mine{};
  std::strncpy(mine.data(), host_name().c_str(), kHostBytes - 1);
  std::vector<char> all(size_t(size) * kHostBytes);
  check_mpi(
      MPI_Allgather(mine.data(), kHostBytes, MPI_CHAR, all.data(), kHostBytes, MPI_CHAR, world),
      "MPI_Allgather", std::string("host names of '") + std::string(what) + "'",
      rank_label(rank, size));
  auto hosts = std::make_shared<std::vector<std::string>>();
  for (int r = 0; r < size; ++r) {
    const char* name = &all[size_t(r) * kHostBytes];
    hosts->emplace_back(name, strnlen(name, kHostBytes));
  }
  ranks->hosts = std::move(hosts);
  return ranks;
}

std::shared_ptr<const WorldRanks> world_ranks_within(MPI_Comm part, MPI_Comm parent,
                                                     const WorldRanks& parent_world) {
  MPI_Group part_group = MPI_GROUP_NULL, parent_group = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(part, &part_group), "MPI_Comm_group", "a split communicator");
  check_mpi(MPI_Comm_group(parent, &parent_group), "MPI_Comm_group", "its parent");
  int size = 0;
  MPI_Group_size(part_group, &size);
  std::vector<int> members(static_cast<size_t>(size));
  std::vector<int> in_parent(static_cast<size_t>(size), MPI_UNDEFINED);
  std::iota(members.begin(), members.end(), 0);
  const int rc =
      MPI_Group_translate_ranks(part_group, size, members.data(), parent_group, in_parent.data());
  MPI_Group_free(&part_group);
  MPI_Group_free(&parent_group);
  check_mpi(rc, "MPI_Group_translate_ranks", "a split communicator against its parent");
  auto world = std::make_shared<WorldRanks>();
  world->size = parent_world.size;
  world->hosts = parent_world.hosts;
  for (int r : in_parent) {
    MPIGRAD_CHECK(r >= 0 && size_t(r) < parent_world.of_member.size(),
                  "a split communicator holds a rank its parent does not");
    world->of_member.push_back(parent_world.of_member[size_t(r)]);
  }
  return world;
}

}  // namespace mpigrad::launch
