// Whether MPI is running and who owns it. The rule (docs/architecture.md): nothing calls MPI_Init
// if MPI is already initialized, and nothing calls MPI_Finalize unless it called MPI_Init. An
// MpiRuntime either started MPI itself (and then finalizes it when the last reference goes) or
// attached to a running MPI owned by a host code (and then never finalizes).
//
// Every communicator holds a shared_ptr to the runtime, so MPI_Finalize cannot run while any
// communicator still exists: the order "communicators, then MPI" is enforced by ownership, not
// by a comment. The runtime also owns the user-defined MPI reduction operators for bfloat16 and
// float16, which must be freed before MPI_Finalize.
//
// A runtime that started MPI waits for every rank in an MPI barrier of its own before calling
// MPI_Finalize, so that no rank sits in Open MPI's finalize (a fence in the launcher) while the
// job may still end in MPI_Abort (mpi_runtime.cpp says why). It also handles SIGCONT and SIGTERM
// (unless the program already does) so that a rank the launcher ends because another rank died
// first names that rank (peer_liveness.h).
#pragma once

#include <memory>
#include <string_view>

#include "mpigrad/core/enum_names.h"

namespace mpigrad::launch {

struct MpiCommHandle;  // launch/comm/mpi_handle.h

enum class ThreadLevel { Single, Funneled, Serialized, Multiple };
inline constexpr core::EnumName<ThreadLevel> kThreadLevelNames[] = {
    {ThreadLevel::Single, "MPI_THREAD_SINGLE"},
    {ThreadLevel::Funneled, "MPI_THREAD_FUNNELED"},
    {ThreadLevel::Serialized, "MPI_THREAD_SERIALIZED"},
    {ThreadLevel::Multiple, "MPI_THREAD_MULTIPLE"}};
std::string_view thread_level_name(ThreadLevel level);

// Where MPI stands in this process, asked without starting it (MPI_Initialized, MPI_Finalized):
// for code that must refuse to go on before MPI is up or after it is down, such as the C API's
// distributed model, which never starts MPI for a host.
enum class MpiLifecycle { NotInitialized, Running, Finalized };
MpiLifecycle mpi_lifecycle();

class MpiRuntime {
 public:
  // Starts MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) unless it is already initialized, in
  // which case it attaches. argc/argv may be null.
  static std::shared_ptr<MpiRuntime> start(int* argc, char*** argv);
  // Attaches to an MPI that a host code initialized; throws if MPI is not initialized or was
  // already finalized.
  static std::shared_ptr<MpiRuntime> attach();

  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  bool owns_mpi() const { return owns_mpi_; }
  // What MPI granted (MPI_Query_thread). Below Multiple the timeout watchdog cannot ask other
  // ranks where they are; it still aborts a hung job, with a shorter report.
  ThreadLevel thread_level() const { return thread_level_; }

  struct ReductionOps;  // the 16-bit float MPI_Ops; defined in mpi_runtime.cpp
  const ReductionOps& reduction_ops() const { return *ops_; }

 private:
  MpiRuntime(bool owns_mpi, ThreadLevel level);
  bool owns_mpi_;
  ThreadLevel thread_level_;
  std::unique_ptr<ReductionOps> ops_;
  // A duplicate of MPI_COMM_WORLD used by nothing but the barrier before MPI_Finalize (so it
  // cannot be mismatched with a collective another rank is stuck in); when owns_mpi_ only.
  std::unique_ptr<MpiCommHandle> farewell_;
  // Whether start() put its SIGCONT and SIGTERM handlers in (peer_liveness.h); they go with the
  // runtime.
  bool watches_termination_ = false;
};

}  // namespace mpigrad::launch
