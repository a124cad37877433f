// defines: HierarchicalAllReduce
//
// Averages host buffers over ranks spread across several nodes with the same number of ranks
// each, as Horovod and NCCL do: DDP's bucket transport across nodes (bucket_transport.h). For a
// buffer of n elements on N nodes of L ranks, local rank l:
//   1. reduce-scatter in the node, in shared memory: l sums shard l (n/L elements) over the L
//      copies of its node, in local-rank order (launch/ddp/shared_segments.h);
//   2. all-reduce of shard l across the nodes, on a communicator of the N ranks whose local rank
//      is l: MPI_Reduce_scatter_block then MPI_Allgather, so every element is reduced exactly
//      once, by one rank, and only n/L elements per rank cross the network;
//   3. all-gather in the node: l scales shard l by 1/(N L) and writes it into every local copy.
// The result is bitwise the same on every rank and does not depend on timing: each element is
// combined in a fixed order (local ranks in order, then MPI's reduce-scatter, whose schedule
// depends only on the sizes) by exactly one rank, and copied from there. With L = 1 there is no
// shared memory and step 2 runs on the whole buffer. Buffers are padded so every shard is a whole
// number of cache lines and of MPI pieces; the padding stays zero.
//
// Progress without the gradient hooks: every step runs on a communication thread this object
// owns, on its own communicator (the inter-node one, split off the caller's, used by nothing
// else), so progress() does nothing and backward never has to drive the averaging. start(b)
// hands bucket b to the thread; the thread takes the buckets in start order, which is bucket
// order in DDP, so the inter-node collectives are issued in the same order on every rank.
// Calling MPI from this thread while the main thread calls it on other communicators needs
// MPI_THREAD_MULTIPLE: create() returns null, with the reason, when any rank has less.
//
// How the thread waits (decided by measurement; mpigrad-bench-ddp, 2 simulated nodes x 1 rank,
// and mpigrad-bench-allreduce --hierarchical):
//   - it sleeps on a condition variable while it has nothing to do: spinning for work burns the
//     core that backward runs on (see MEASURED below);
//   - it blocks inside MPI for the collectives, as MPI's blocking algorithms are the fast ones
//     (MPI_Iallreduce polled with MPI_Test took 2-2.5x the time of MPI_Allreduce for 36 MiB on
//     this VM, launch/mpi_communicator.h), and a blocking call is what the communicator's
//     watchdog times (launch/collective_watchdog.h);
//   - while a node's ranks wait for each other to start a bucket, it polls the shared-memory
//     flags with backoff (spin, yield, then 20 us naps), the same way SharedMemoryAllReduce does.
// MEASURED: see the numbers in launch/ddp/hierarchical_all_reduce.cpp's opening comment.
//
// Failures end in an error on every rank, never a hang:
//   - a rank of the node that does not start a bucket within `timeout_seconds`, or that gave
//     up, or is out of step, fails this rank (named in the error), which tells its node (the
//     "gave up" flag) and the other nodes: before each inter-node step the ranks exchange a
//     status word (one small all-reduce), and a rank that failed sends its rank there for the
//     rest of the pass over the buckets, so the ranks it shares a step with fail at once, naming
//     it, instead of waiting in MPI;
//   - a rank that never gets to its inter-node step (it died, or hangs outside mpigrad) leaves
//     the others blocked in MPI: the inter-node communicator's watchdog then reports the
//     collective and the missing ranks and aborts the job after the collective timeout
//     (MPIGRAD_COLLECTIVE_TIMEOUT), as for any collective.
// After a failure every call repeats it.
//
// Contract: that of BucketTransport (every rank starts the buckets in the same order; the caller
// leaves a started buffer alone until wait() returns). Destroying the object waits for the
// buckets in flight, then stops and joins the thread.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mpigrad/launch/communicator.h"
#include "mpigrad/launch/ddp/bucket_transport.h"
#include "mpigrad/launch/ddp/shared_segments.h"

namespace mpigrad::launch {

class HierarchicalAllReduce final : public BucketTransport {
 public:
  // Collective over `communicator` (an MPI one). `node` holds this rank's node: the ranks of
  // `communicator` that share its memory (split_node_local), every node as many. Returns null
  // on every rank, with the reason in `*why_not`, when a rank's MPI is below
  // MPI_THREAD_MULTIPLE or a node cannot share memory. `timeout_seconds` bounds each wait for
  // the other ranks of the node (<= 0: no bound).
  static std::unique_ptr<HierarchicalAllReduce> create(Communicator& communicator,
                                                       std::unique_ptr<Communicator> node,
                                                       std::span<const SharedBufferSpec> buffers,
                                                       double timeout_seconds,
                                                       std::string* why_not = nullptr);
  ~HierarchicalAllReduce() override;

  int nodes() const;
  int ranks_per_node() const;
  size_t buffer_count() const override;
  // This rank's buffer `index` (padded, see above), zero at creation.
  const core::Tensor& buffer(size_t index) const override;
  void start(size_t index) override;
  void progress() override {}  // the communication thread needs no help
  // Throws core::Error, naming the ranks, on a failure of this rank, its node or another node.
  void wait(size_t index) override;
  bool in_flight(size_t index) const override;

  struct Impl;

 private:
  explicit HierarchicalAllReduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mpigrad::launch
