// Collectives on CUDA tensors with NCCL, bootstrapped over MPI: rank 0 of the group creates the
// ncclUniqueId, MPI_Bcast hands it to the others over the group's MPI communicator, and every
// rank calls ncclCommInitRank on its device. Exists only in builds with the CUDA backend
// (core::cuda_built()); reach it through create_communicator(manager, Backend::Nccl, device),
// which reports a clear error in other builds and when no GPU is visible.
//
// Streams (nothing here blocks the host, except barrier()):
// - Each communicator owns one CUDA stream, stream(), on which all its NCCL calls run.
// - Before a collective is queued, an event recorded on the caller's current stream of the
//   device (core::current_stream) is made a dependency of the NCCL stream, so the collective
//   sees every kernel the caller queued before it.
// - Work::wait() is STREAM-ORDERED: it records an event on the NCCL stream and makes the caller's
//   current stream wait for it, then returns at once. Kernels queued afterwards on the current
//   stream see the result; the host does not (copy to the CPU, or synchronize the stream, to read
//   it there). Work::test() queries that event without blocking. The blocking forms of the
//   operations are the async form followed by this wait(), so they are stream-ordered too.
// - Buffers are announced to the caching allocator with record_stream(tensor, stream()), so
//   freeing a tensor while NCCL still uses it never lets another kernel reuse its memory early.
// - barrier() is a one-element all-reduce followed by synchronizing the NCCL stream (host
//   blocks), watched by the collective timeout. Work::test() and wait() raise NCCL's
//   asynchronous errors (a failed peer or network).
//
// The collective timeout (MPIGRAD_COLLECTIVE_TIMEOUT) on the GPU: an event recorded after each
// collective on the NCCL stream lets the communicator's watchdog (launch/comm/
// collective_watchdog.h) see the oldest one not complete, whether or not the host waits for it
// (a stream-ordered wait returns at once; the host then blocks in whatever synchronizes the
// device next). One pending past the timeout is reported like a host wait, "OP #k (n bytes)
// waited t s on the GPU", with NCCL's asynchronous error if it has one, the ranks not arrived
// (asked over the MPI control communicator) and where they are; then the watchdog aborts the NCCL
// communicator (ncclCommAbort, so no kernel keeps waiting) and ends the job (MPI_Abort, exit code
// 3). A safe abort from the watchdog's thread is why the communicator is non-blocking
// (ncclConfig_t.blocking = 0: calls may answer ncclInProgress, and the main thread polls
// ncclCommGetAsyncError until they finish) and why every NCCL call holds a lock that the abort
// takes too. Cost per collective: on a non-blocking communicator NCCL queues each collective
// from a thread it starts for that call and answers ncclInProgress (its group.cc), so the host
// polls for it (complete_nccl); then an uncontended lock, and for the async forms one more
// cudaEventRecord (the blocking forms' stream wait uses the watchdog's event).
//
// Group calls: every operation that touches several buffers is issued inside
// ncclGroupStart/ncclGroupEnd: all_gather_v, one ncclBroadcast per contributing rank, and gather
// and gather_v, which NCCL does not have: an ncclSend from every other rank and an ncclRecv for
// each on the root, which copies its own block on the stream (unless it is already in place).
// Avg uses ncclAvg (floating dtypes only, like the MPI backend).
//
// Ownership and destruction: the NCCL communicator is destroyed first (ncclCommDestroy, or
// ncclCommAbort after a failed call or while an exception unwinds, when the other ranks may
// never drain), then its CUDA events; the stream is synchronized but kept for the life of the
// process (the caching allocator may still record events on it for gradient buckets that
// outlive the communicator); then the MPI communicators it used, and the MPI runtime last. Not
// thread-safe: issue the collectives of one communicator from one thread, in the same order on
// every rank.
#pragma once

#include <memory>
#include <string>

#include "mpigrad/core/device.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/mpi_runtime.h"

namespace mpigrad::launch {

struct MpiCommHandle;

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the ranks of `comm` (an MPI communicator the caller duplicated and hands
  // over; it carries the unique-id exchange, splits, debug checks and timeout queries, never
  // tensor data). `device` must be a visible CUDA device, distinct on every rank of a node.
  // `world` places its ranks in mpigrad's world (communicator.h); null means `comm` is that
  // world (or a duplicate of it), and then every rank's host name is gathered here, once.
  NcclCommunicator(MpiCommHandle&& comm, std::shared_ptr<MpiRuntime> runtime, core::Device device,
                   std::string name, CollectiveConfig config,
                   std::shared_ptr<const WorldRanks> world = nullptr);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  Backend backend() const override { return Backend::Nccl; }

  // Collective over this communicator; each new group gets its own NCCL communicator (a fresh
  // unique id per color, exchanged over the split MPI communicator) and its own stream.
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  std::unique_ptr<Communicator> split_node_local(std::string name) override;

  core::Device device() const override;
  // The stream every NCCL call of this communicator runs on.
  core::StreamView stream() const;
  // The ncclComm_t, opaque here so that this header needs no NCCL include (benchmarks compare
  // against raw ncclAllReduce on it).
  void* native_handle() const;
  // How many collectives this rank has queued on this communicator.
  uint64_t collectives_started() const;

  struct State;  // shared with in-flight Work objects; defined in nccl_communicator.cpp

 protected:
  void run_collective(const Collective& collective) override;
  WorkPtr start_collective(const Collective& collective) override;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace mpigrad::launch
