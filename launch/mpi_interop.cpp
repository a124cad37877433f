#include "mpigrad/launch/mpi_interop.h"

#include <memory>
#include <utility>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/comm/mpi_handle.h"

namespace mpigrad::launch {

DistributedManager adopt_communicator(MPI_Comm comm, DistributedOptions options) {
  std::shared_ptr<MpiRuntime> runtime = MpiRuntime::attach();
  MpiCommHandle world = duplicate_communicator(comm, "adopted communicator");
  return DistributedManager(std::move(runtime), std::move(world), std::move(options));
}

DistributedManager adopt_communicator_fortran(MPI_Fint comm, DistributedOptions options) {
  return adopt_communicator(MPI_Comm_f2c(comm), std::move(options));
}

MPI_Comm native_communicator(const Communicator& communicator) {
  auto* mpi = dynamic_cast<const MpiCommunicator*>(&communicator);
  MPIGRAD_CHECK(mpi != nullptr, "native_communicator: communicator '", communicator.name(),
                "' uses the ", backend_name(communicator.backend()), " backend, not MPI");
  return mpi->handle().comm;
}

}  // namespace mpigrad::launch
