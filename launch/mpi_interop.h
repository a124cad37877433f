// defines: MpiCommHandle, check_mpi, adopt_communicator, native_communicator
//
// The one public header of mpigrad that includes <mpi.h>. Host codes (C, C++ or Fortran) that
// already own MPI use it to hand mpigrad a communicator, either as an MPI_Comm or, from Fortran,
// as an MPI_Fint. mpigrad always duplicates what it is given and works only on the duplicate, so
// its traffic can never match the host's messages, and it never touches MPI_COMM_WORLD unless
// it was the one that started MPI.
//
// Every other launch/ header refers to communicators through the opaque MpiCommHandle declared
// here, so code that embeds mpigrad without adopting a communicator never sees MPI.
#pragma once

// The deprecated MPI C++ bindings would otherwise come in with <mpi.h> and need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string_view>

#include "mpigrad/core/dtype.h"
#include "mpigrad/launch/communicator.h"
#include "mpigrad/launch/distributed_manager.h"
#include "mpigrad/launch/mpi_runtime.h"

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

// Throws core::Error naming the MPI call, what it worked on and the calling rank (in
// MPI_COMM_WORLD when known) unless rc is MPI_SUCCESS.
void check_mpi(int rc, std::string_view call, std::string_view what = {});

// Duplicates `comm` (MPI_Comm_dup) into a handle that mpigrad owns.
MpiCommHandle duplicate_communicator(MPI_Comm comm, std::string_view what);

// A DistributedManager over a duplicate of the host's communicator. MPI must be initialized;
// the manager never finalizes it. The host keeps `comm` and may go on using it and MPI freely.
DistributedManager adopt_communicator(MPI_Comm comm, DistributedOptions options = {});
// The same for a Fortran handle (from `use mpi_f08`'s comm%MPI_VAL or `use mpi`'s integer).
DistributedManager adopt_communicator_fortran(MPI_Fint comm, DistributedOptions options = {});

// The MPI communicator underneath an MPI-backed communicator, for host codes that want to mix
// their own MPI calls on mpigrad's ranks; throws if `communicator` is not MPI-backed.
MPI_Comm native_communicator(const Communicator& communicator);

// ---- Used by mpigrad's MPI backend -------------------------------------------------------------

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
