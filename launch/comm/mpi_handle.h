// The MPI pieces that mpigrad's own MPI code shares: the owning communicator handle, the checked
// call, the duplicate that mpigrad always works on, and the datatypes and reduction operators
// that move tensors. Internal: it is not installed, and host codes use launch/mpi_interop.h.
#pragma once

// The deprecated MPI C++ bindings would otherwise come in with <mpi.h> and need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>
#include <string_view>

#include "mpigrad/core/dtype.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/mpi_runtime.h"

namespace mpigrad::launch {

// Owns one MPI communicator and frees it exactly once. Move-only. Never owns MPI_COMM_WORLD or
// MPI_COMM_SELF (freeing those is an MPI error), and frees nothing after MPI_Finalize.
struct MpiCommHandle {
  MPI_Comm comm = MPI_COMM_NULL;

  MpiCommHandle() = default;
  explicit MpiCommHandle(MPI_Comm owned) : comm(owned) {}
  MpiCommHandle(const MpiCommHandle&) = delete;
  MpiCommHandle& operator=(const MpiCommHandle&) = delete;
  MpiCommHandle(MpiCommHandle&& other) noexcept : comm(other.comm) { other.comm = MPI_COMM_NULL; }
  MpiCommHandle& operator=(MpiCommHandle&& other) noexcept {
    if (this != &other) {
      reset();
      comm = other.comm;
      other.comm = MPI_COMM_NULL;
    }
    return *this;
  }
  ~MpiCommHandle() { reset(); }

  void reset() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_NULL && comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF && !finalized) {
      MPI_Comm_free(&comm);
    }
    comm = MPI_COMM_NULL;
  }
};

// Throws core::Error naming the MPI call, what it worked on and the calling rank unless rc is
// MPI_SUCCESS. `label` is the rank as a communicator knows it in mpigrad's world ("[rank r/w]",
// Communicator::world_label); without one (MPI start-up, before a world exists) the rank in
// MPI_COMM_WORLD stands in, which is the world whenever mpigrad started MPI itself.
void check_mpi(int rc, std::string_view call, std::string_view what = {},
               std::string_view label = {});

// Duplicates `comm` (MPI_Comm_dup) into a handle that mpigrad owns; `label` as for check_mpi.
MpiCommHandle duplicate_communicator(MPI_Comm comm, std::string_view what,
                                     std::string_view label = {});

// The WorldRanks (communicator.h) of mpigrad's world `world` itself: rank r is world rank r,
// with every rank's host name (one all-gather). Collective over `world`.
std::shared_ptr<const WorldRanks> gather_world_ranks(MPI_Comm world, std::string_view what);
// The WorldRanks of `part`, split from `parent`, whose ranks `parent_world` places: the parent
// rank of each member (MPI_Group_translate_ranks), then its world rank. No communication.
std::shared_ptr<const WorldRanks> world_ranks_within(MPI_Comm part, MPI_Comm parent,
                                                     const WorldRanks& parent_world);

// Ends the whole job with `exit_code` after a failure on this rank (MPI_Abort on `comm`); never
// returns. Under Open MPI's `mpirun --enable-recovery` (orte_enable_recovery) mpirun reports
// exit status 0 whatever its ranks do (a non-zero exit, MPI_Abort, a kill: measured with 4.1.4),
// so a batch script would take a failed run for a finished one. Its SIGTERM handler does end it
// non-zero, so a rank whose parent process is that mpirun (the ranks on mpirun's node) sends it
// one first. Ranks on other nodes cannot reach it (docs/failures.md, "How the job ends").
[[noreturn]] void abort_job(MPI_Comm comm, int exit_code);

// The MPI datatype that moves elements of `dtype`. bfloat16 and float16 travel as MPI_UINT16_T and
// are reduced only through the runtime's user-defined operators.
MPI_Datatype mpi_datatype(core::DType dtype);

// MPI has no 16-bit float types, so bfloat16 and float16 reductions use user-defined, commutative
// MPI_Ops that widen each pair to float, combine, and round back (round-to-nearest-even). We
// chose this over converting whole buffers to float32 because it moves half the bytes, needs no
// temporary buffers, and works unchanged for in-place and nonblocking collectives. As with NCCL,
// each partial sum is rounded to 16 bits, so the result can depend on the reduction order.
struct MpiRuntime::ReductionOps {
  MPI_Op bfloat16[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum, max, min
  MPI_Op float16[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};

  ReductionOps();  // MPI must be initialized
  ~ReductionOps();
  ReductionOps(const ReductionOps&) = delete;
  ReductionOps& operator=(const ReductionOps&) = delete;

  // The MPI_Op for `op` on `dtype` (Avg reduces with the sum); throws on unsupported pairs.
  MPI_Op find(core::DType dtype, ReduceOp op) const;
};

}  // namespace mpigrad::launch
