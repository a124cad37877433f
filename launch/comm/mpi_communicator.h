// Collectives on host tensors over an MPI communicator that this object owns (always a duplicate,
// never the host's or MPI_COMM_WORLD itself).
//
// Blocking forms call the blocking MPI collective directly (MPI_Allreduce, ...), so they cost
// what raw MPI costs; async forms start the MPI_I* collective and return a Work.
//
// Progress: polling, no progress thread. Work::test() calls MPI_Test, Work::wait() calls
// MPI_Wait, and Work::wait_sleeping() calls MPI_Test with 50 us naps in between; a caller that
// wants the collective to advance while it computes calls test() between pieces of work (DDP
// does this from its gradient-ready hooks). Measured on the 2-core dev VM,
// Open MPI 4.1 shared memory, 16 MiB float32 all-reduce against about as much compute
// (tests/ddp/test_overlap.cpp prints this): np 2: communication 12.7 ms, compute 9.9 ms,
// sequential 22.6 ms; async without polling 31.4 ms (the libnbc schedule stalls until wait());
// async polling from the compute loop 21.8 ms. A CPU all-reduce spends its time in memcpy and
// the reduction itself, so on a node whose cores all compute there is little to hide it behind,
// and a progress thread would only add a spinning thread competing for the same cores (and make
// every blocking collective hand off between threads). Polling makes progress cost nothing when
// unused and keeps blocking collectives at raw-MPI cost.
//
// Every collective is numbered and watched by a CollectiveWatchdog (timeout report + abort), and
// with CollectiveConfig::debug_collectives every rank's call is checked against the others'.
#pragma once

#include <memory>
#include <string>

#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/mpi_runtime.h"

namespace mpigrad::launch {

struct MpiCommHandle;

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (a duplicate the caller made); `runtime` keeps MPI alive for as
  // long as this communicator exists. Collective over the ranks of `comm`. `world` places its
  // ranks in mpigrad's world (communicator.h); null means `comm` is that world (or a duplicate
  // of it), and then every rank's host name is gathered here, once.
  MpiCommunicator(MpiCommHandle&& comm, std::shared_ptr<MpiRuntime> runtime, std::string name,
                  CollectiveConfig config, std::shared_ptr<const WorldRanks> world = nullptr);
  ~MpiCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  Backend backend() const override { return Backend::Mpi; }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  std::unique_ptr<Communicator> split_node_local(std::string name) override;

  // The owned MPI communicator (see mpi_interop.h's native_communicator).
  const MpiCommHandle& handle() const;
  const std::shared_ptr<MpiRuntime>& runtime() const;
  // How many collectives this rank has started on this communicator.
  uint64_t collectives_started() const;

  struct State;  // shared with in-flight Work objects; defined in mpi_communicator.cpp

 protected:
  void run_collective(const Collective& collective) override;
  WorkPtr start_collective(const Collective& collective) override;

 private:
  // The blocking all-reduce's own path, written out for its latency (mpi_communicator.cpp).
  void all_reduce_now(const Collective& collective);

  std::shared_ptr<State> state_;
};

}  // namespace mpigrad::launch
