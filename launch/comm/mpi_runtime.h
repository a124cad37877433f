// Whether MPI is running and who owns it. The rule (DESIGN.md): nothing calls MPI_Init if MPI is
// already initialized, and nothing calls MPI_Finalize unless it called MPI_Init. An MpiRuntime
// either started MPI itself (and then finalizes it when the last reference goes) or attached to
// a running MPI owned by a host code (and then never finalizes).
//
// Every communicator holds a shared_ptr to the runtime, so MPI_Finalize cannot run while any
// communicator still exists: the order "communicators, then MPI" is enforced by ownership, not
// by a comment. The runtime also owns the user-defined MPI reduction operators for bfloat16 and
// float16, which must be freed before MPI_Finalize.
#pragma once

#include <memory>
#include <string_view>

namespace mpigrad::launch {

enum class ThreadLevel { Single, Funneled, Serialized, Multiple };
std::string_view thread_level_name(ThreadLevel level);

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
};

}  // namespace mpigrad::launch
