// The one public header of mpigrad that includes <mpi.h>. Host codes (C, C++ or Fortran) that
// already own MPI use it to hand mpigrad a communicator, either as an MPI_Comm or, from Fortran,
// as an MPI_Fint. mpigrad always duplicates what it is given and works only on the duplicate, so
// its traffic can never match the host's messages, and it never touches MPI_COMM_WORLD unless
// it was the one that started MPI.
//
// Every other public header refers to communicators through opaque handles, so code that embeds
// mpigrad without adopting a communicator never sees MPI.
#pragma once

// The deprecated MPI C++ bindings would otherwise come in with <mpi.h> and need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/job/distributed_manager.h"

namespace mpigrad::launch {

// A DistributedManager over a duplicate of the host's communicator. MPI must be initialized;
// the manager never finalizes it. The host keeps `comm` and may go on using it and MPI freely.
DistributedManager adopt_communicator(MPI_Comm comm, DistributedOptions options = {});
// The same for a Fortran handle (from `use mpi_f08`'s comm%MPI_VAL or `use mpi`'s integer).
DistributedManager adopt_communicator_fortran(MPI_Fint comm, DistributedOptions options = {});

// The MPI communicator underneath an MPI-backed communicator, for host codes that want to mix
// their own MPI calls on mpigrad's ranks; throws if `communicator` is not MPI-backed.
MPI_Comm native_communicator(const Communicator& communicator);

}  // namespace mpigrad::launch
