// MPI start-up and attachment, the dtype mapping and the 16-bit float reduction operators.
#include "mpigrad/launch/comm/mpi_runtime.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <type_traits>

#include "mpigrad/core/error.h"
#include "mpigrad/kernels/elementwise.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/peer_liveness.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

namespace {

ThreadLevel to_thread_level(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return ThreadLevel::Multiple;
  if (provided >= MPI_THREAD_SERIALIZED) return ThreadLevel::Serialized;
  if (provided >= MPI_THREAD_FUNNELED) return ThreadLevel::Funneled;
  return ThreadLevel::Single;
}

// "[rank r/w]" in MPI_COMM_WORLD, or "" before MPI_Init and after MPI_Finalize. Only for what
// has no communicator at hand: a runtime that started MPI (the one case where this prints at
// the end) works on a duplicate of MPI_COMM_WORLD, so these are then mpigrad's world ranks.
std::string mpi_world_label() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "";
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return rank_label(rank, size);
}

// User-defined reductions for the 16-bit floats: widen to float, combine, round back.
template <typename T, typename Combine>
void combine_16bit(void* in, void* inout, int* length, Combine combine) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = T(combine(float(a[i]), float(b[i])));
}

struct MaxFn {
  float operator()(float a, float b) const { return a > b || a != a ? a : b; }
};
struct MinFn {
  float operator()(float a, float b) const { return a < b || a != a ? a : b; }
};

template <typename T, typename Fn>
void reduce_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  combine_16bit<T>(in, inout, length, Fn{});
}

// The sum, which gradient compression runs on every element it sends, is the kernels' vectorized
// loop: float(a) + float(b), rounded back, as combine_16bit would.
template <typename T>
void sum_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  kernels::cpu::add_16bit_dense(
      std::is_same_v<T, core::BFloat16> ? core::kBFloat16 : core::kFloat16, *length, in, inout);
}

// Waits until every rank of `comm` has called this, in a barrier polled with a growing sleep:
// MPI_Wait would spin a core for as long as another rank is late, and on a node with more ranks
// than cores that core is what the late rank needs. An MPI error ends the wait (MPI_Finalize,
// which follows, still synchronizes).
void await_every_rank(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &request) != MPI_SUCCESS) return;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

// SIGTERM while mpigrad owns MPI: the ring of peer_liveness.h first names a lost rank, if any,
// then the process ends as it would have; with no ring, at once. SIGCONT, which Open MPI's mpirun
// (and Slurm) send a second before that TERM, names it as early; with no rank lost the process
// goes on as before.
extern "C" void on_termination(int signal) {
  if (signal == SIGCONT) {
    notice_termination_signal(signal, /*end_process=*/false);
  } else if (!notice_termination_signal(signal, /*end_process=*/true)) {
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

}  // namespace

std::string_view thread_level_name(ThreadLevel level) {
  return core::enum_name(level, kThreadLevelNames);
}

void check_mpi(int rc, std::string_view call, std::string_view what, std::string_view label) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  std::string prefix = label.empty() ? mpi_world_label() : std::string(label);
  core::fail(prefix.empty() ? prefix : prefix + " ", call, what.empty() ? "" : " (", what,
             what.empty() ? "" : ")", " failed: ", std::string_view(text, size_t(length)));
}

MPI_Datatype mpi_datatype(core::DType dtype) {
  switch (dtype) {
    case core::kFloat32:
      return MPI_FLOAT;
    case core::kFloat64:
      return MPI_DOUBLE;
    case core::kBFloat16:
    case core::kFloat16:
      return MPI_UINT16_T;
    case core::kInt32:
      return MPI_INT32_T;
    case core::kInt64:
      return MPI_INT64_T;
    case core::kUInt8:
    case core::kBool:
      return MPI_UINT8_T;
  }
  core::fail("mpi_datatype: unknown dtype");
}

MpiRuntime::ReductionOps::ReductionOps() {
  check_mpi(MPI_Op_create(&sum_16bit<core::BFloat16>, 1, &bfloat16[0]), "MPI_Op_create",
            "bfloat16 sum");
  check_mpi(MPI_Op_create(&reduce_16bit<core::BFloat16, MaxFn>, 1, &bfloat16[1]), "MPI_Op_create",
            "bfloat16 max");
  check_mpi(MPI_Op_create(&reduce_16bit<core::BFloat16, MinFn>, 1, &bfloat16[2]), "MPI_Op_create",
            "bfloat16 min");
  check_mpi(MPI_Op_create(&sum_16bit<core::Half>, 1, &float16[0]), "MPI_Op_create", "float16 sum");
  check_mpi(MPI_Op_create(&reduce_16bit<core::Half, MaxFn>, 1, &float16[1]), "MPI_Op_create",
            "float16 max");
  check_mpi(MPI_Op_create(&reduce_16bit<core::Half, MinFn>, 1, &float16[2]), "MPI_Op_create",
            "float16 min");
}

MpiRuntime::ReductionOps::~ReductionOps() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* ops : {bfloat16, float16}) {
    for (int i = 0; i < 3; ++i) {
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
    }
  }
}

MPI_Op MpiRuntime::ReductionOps::find(core::DType dtype, ReduceOp op) const {
  int index = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
  switch (dtype) {
    case core::kBFloat16:
      return bfloat16[index];
    case core::kFloat16:
      return float16[index];
    case core::kBool:
      core::fail("reduction on a bool tensor is not supported; convert it to uint8");
    default:
      break;
  }
  MPIGRAD_CHECK(!(op == ReduceOp::Avg && !core::is_floating(dtype)), "reduce op avg needs a ",
                "floating dtype, got ", dtype, "; use sum and divide");
  return op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
}

MpiRuntime::MpiRuntime(bool owns, ThreadLevel level)
    : owns_mpi_(owns), thread_level_(level), ops_(std::make_unique<ReductionOps>()) {}

std::shared_ptr<MpiRuntime> MpiRuntime::start(int* argc, char*** argv) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) return attach();
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread",
            "requested MPI_THREAD_MULTIPLE");
  // Errors come back as return codes, which we turn into exceptions that name the call and
  // the rank, instead of MPI's default of aborting the whole job on the spot.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::shared_ptr<MpiRuntime> runtime(new MpiRuntime(true, to_thread_level(provided)));
  runtime->farewell_ = std::make_unique<MpiCommHandle>(
      duplicate_communicator(MPI_COMM_WORLD, "the barrier before MPI_Finalize"));
  // Only over the default action: a handler the program installed stays.
  for (int signal : {SIGTERM, SIGCONT}) {
    struct sigaction previous {};
    if (sigaction(signal, nullptr, &previous) == 0 && previous.sa_handler == SIG_DFL) {
      struct sigaction action {};
      action.sa_handler = on_termination;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      sigaction(signal, &action, nullptr);
      runtime->watches_termination_ = true;
    }
  }
  return runtime;
}

MpiLifecycle mpi_lifecycle() {
  int initialized = 0, finalized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  check_mpi(MPI_Finalized(&finalized), "MPI_Finalized");
  if (finalized) return MpiLifecycle::Finalized;
  return initialized ? MpiLifecycle::Running : MpiLifecycle::NotInitialized;
}

std::shared_ptr<MpiRuntime> MpiRuntime::attach() {
  const MpiLifecycle lifecycle = mpi_lifecycle();
  MPIGRAD_CHECK(lifecycle == MpiLifecycle::Running, "mpigrad: cannot attach to MPI: it is ",
                lifecycle == MpiLifecycle::Finalized ? "already finalized" : "not initialized",
                " (call MPI_Init first, or let DistributedManager::initialize start it)");
  int provided = 0;
  check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  return std::shared_ptr<MpiRuntime>(new MpiRuntime(false, to_thread_level(provided)));
}

MpiRuntime::~MpiRuntime() {
  ops_.reset();  // user-defined ops must go before MPI_Finalize
  if (!owns_mpi_) return;
  if (watches_termination_) {
    for (int signal : {SIGTERM, SIGCONT}) {
      struct sigaction current {};
      if (sigaction(signal, nullptr, &current) == 0 && current.sa_handler == on_termination) {
        ::signal(signal, SIG_DFL);
      }
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from an error on this rank while the others may sit in a collective: finalize
    // would wait for them forever, so end the whole job now with a non-zero exit.
    std::fprintf(stderr,
                 "%s mpigrad: aborting the job because this rank is unwinding an exception\n",
                 mpi_world_label().c_str());
    std::fflush(stderr);
    abort_job(MPI_COMM_WORLD, 1);
  }
  // Open MPI's MPI_Finalize begins with a fence in the launcher's PMIx server. When one rank
  // calls MPI_Abort (a collective watchdog, launch/comm/collective_watchdog.h) while others sit
  // in that fence (they failed and returned, and wait for the stuck ranks to finalize too),
  // Open MPI 4.1's mpirun, once every rank is gone, sometimes crashes in PMIx_server_finalize or
  // hangs there forever: 5 jobs of 10 in a 20-line MPI program that does just that, 0 of 15
  // when those ranks wait in an MPI barrier instead (ddp_hierarchical_hang_np4 hung or crashed
  // this way). So every rank first waits here, where an abort ends it like any other wait, and
  // the fence then finds all ranks present.
  if (farewell_ != nullptr) {
    await_every_rank(farewell_->comm);
    farewell_.reset();
  }
  MPI_Finalize();
}

namespace {

bool launched_with_recovery() {
  const char* value = std::getenv("OMPI_MCA_orte_enable_recovery");
  if (value == nullptr) return false;
  const std::string text = value;
  return text == "1" || text == "true" || text == "yes";
}

// This process's parent, if it is Open MPI's launcher itself (not an orted on another node).
pid_t parent_launcher() {
  const pid_t parent = getppid();
  std::ifstream comm_file("/proc/" + std::to_string(parent) + "/comm");
  std::string name;
  std::getline(comm_file, name);
  return name == "mpirun" || name == "mpiexec" || name == "orterun" ? parent : 0;
}

}  // namespace

void abort_job(MPI_Comm comm, int exit_code) {
  // This rank ends the job on purpose: the others must not report it as lost.
  say_goodbye_to_peers();
  if (launched_with_recovery()) {
    if (const pid_t launcher = parent_launcher(); launcher > 0) {
      std::fprintf(stderr,
                   "%s mpigrad: mpirun --enable-recovery would report this failed job as a "
                   "success; stopping mpirun (pid %d) so that it exits non-zero\n",
                   mpi_world_label().c_str(), int(launcher));
      std::fflush(stderr);
      kill(launcher, SIGTERM);
    }
  }
  MPI_Abort(comm, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; if it ever does, still end non-zero
}

}  // namespace mpigrad::launch
