// Averages host buffers over ranks spread across several nodes with the same number of ranks
// each, as Horovod and NCCL do: DDP's bucket transport across nodes (bucket_transport.h). For a
// buffer of n elements on N nodes of L ranks, local rank l:
//   1. reduce-scatter in the node, in shared memory: l sums shard l (n/L elements) over the L
//      copies of its node, in local-rank order (launch/ddp/transports/shared_segments.h);
//   2. all-reduce (sum) of shard l across the nodes, on a communicator of the N ranks whose
//      local rank is l, so only n/L elements per rank cross the network;
//   3. all-gather in the node: l scales shard l by 1/(N L) and writes it into every local copy.
// The shard goes through the three steps in pieces of 1 MiB, each while it is still in cache
// (measured below). The result is bitwise the same on every rank and does not depend on timing:
// each element is summed in local-rank order by the one rank that owns its shard, then by MPI's
// all-reduce, whose schedule depends only on the sizes and ranks, and copied from there. Every
// all-reduce algorithm of Open MPI and MPICH gives all ranks the same bits for a commutative sum
// (a partial is computed once and copied, or both partners add the same two numbers); MPI only
// recommends this, and the tests check it. MPI_Reduce_scatter_block + MPI_Allgather would
// guarantee it by construction, but measured 1.6-2.4x slower for an 18 MiB shard on 2 x 2 here
// (37-55 ms against 23-28 ms). With L = 1 there is no shared memory and step 2 runs on the
// whole buffer. Buffers are padded so every shard is a whole number of cache lines; the padding
// stays zero.
//
// Gradient compression (a 16-bit `wire` dtype, DDP's compression = bf16 | fp16): only step 2,
// the bytes that cross the link, goes in the wire dtype. Each piece of the node's fp32 sum is
// rounded to the wire dtype, all-reduced (or, under ZeRO-1, reduce-scattered) across the nodes
// with MPI's 16-bit sum, and widened back before the scaling; the node-local sum and copies, and
// ZeRO-1's parameter all-gather, stay in the buffer's dtype. So with one rank a node the result
// is bitwise the communicator transport's with the same compression (the same 16-bit values
// summed by the same MPI algorithm, then scaled by a power of two); with L > 1 it is closer to
// fp32 than that (the node's L gradients are summed before one rounding, not rounded each).
// Inf and NaN survive the rounding, so fp16's overflow reaches every rank as on the
// communicator, and DDP's found-inf flag (taken "as the wire carries" the values) still holds.
//
// ZeRO-1 (BucketCollective::ReduceScatter / AllGather): rank (node k, local rank l) owns piece k
// of node shard l. ReduceScatter is step 1, a reduce-scatter (sum) of shard l across the nodes
// instead of the all-reduce, and the scaling of piece k into this rank's own copy; AllGather is
// an all-gather of shard l's pieces across the nodes, then step 3 without the scaling. Each runs
// on the whole node shard, not in 1 MiB pieces, so every rank's piece stays contiguous; buffers
// are padded to N L shards of whole cache lines.
//
// Progress without the gradient hooks: every step runs on a communication thread this object
// owns, on its own communicator (the inter-node one, split off the caller's, used by nothing
// else), so progress() does nothing and backward never has to drive the averaging. start(b)
// hands bucket b to the thread; the thread takes the buckets in start order, which is bucket
// order in DDP, so the inter-node collectives are issued in the same order on every rank.
// Calling MPI from this thread while the main thread calls it on other communicators needs
// MPI_THREAD_MULTIPLE: create() returns null, with the reason, when any rank has less.
//
// How the thread waits, decided by measurement: mpigrad-bench-ddp on 2 simulated nodes x 1 rank
// (MLP 9.4M, batch 64, 25 MiB buckets, 2-core VM at load 4-5, six alternating runs of each), as
// the step over the serial bound (no-comm step + one blocking all-reduce; <= 1 is the target):
//   - it blocks inside MPI for the collectives: MPI's blocking algorithms are the fast ones
//     (MPI_Iallreduce polled with MPI_Test took 2-2.5x MPI_Allreduce for 36 MiB here,
//     launch/comm/mpi_communicator.h), and a blocking call is what the communicator's watchdog
//     times (launch/comm/collective_watchdog.h). Waiting for the other nodes by polling a
//     nonblocking status all-reduce with naps, then blocking for the data, measured 0.96-1.22;
//     blocking throughout 0.96-1.23;
//   - it sleeps on a condition variable while it has nothing to do. Spinning for work measured
//     1.54-1.79 (three earlier runs, one configuration at a time): it takes backward's core;
//   - it runs at the lowest priority (nice 19): 0.83-0.86 in five runs of six (one at 1.92
//     under a load burst). mpirun binds a rank to one core, so the thread shares it with
//     backward; at normal priority it preempts backward for its whole all-reduce, spinning in
//     MPI whenever the other node is not there yet. At nice 19 it runs on whatever core
//     backward leaves idle, at once where a rank has a core to spare, and otherwise as soon as
//     the main thread waits for the buckets, so it never slows the compute it overlaps;
//   - while a node's ranks wait for each other to start a bucket, it polls the shared-memory
//     flags with backoff (spin, yield, then 20 us naps), as SharedMemoryAllReduce does.
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
#include <optional>
#include <span>
#include <string>

#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/ddp/bucket_transport.h"
#include "mpigrad/launch/ddp/transports/shared_segments.h"

namespace mpigrad::launch {

class HierarchicalAllReduce final : public BucketTransport {
 public:
  // Collective over `communicator` (an MPI one). `node` holds this rank's node: the ranks of
  // `communicator` that share its memory (split_node_local), every node as many. Returns null
  // on every rank, with the reason in `*why_not`, when a rank's MPI is below
  // MPI_THREAD_MULTIPLE or a node cannot share memory. `timeout_seconds` bounds each wait for
  // the other ranks of the node (<= 0: no bound). `wire`, a 16-bit float dtype, is what the
  // inter-node step sends, when not the buffers' own (see "Gradient compression" above).
  static std::unique_ptr<HierarchicalAllReduce> create(
      Communicator& communicator, std::unique_ptr<Communicator> node,
      std::span<const SharedBufferSpec> buffers, double timeout_seconds,
      std::string* why_not = nullptr, std::optional<core::DType> wire = std::nullopt);
  ~HierarchicalAllReduce() override;

  int nodes() const;
  int ranks_per_node() const;
  size_t buffer_count() const override;
  // This rank's buffer `index` (padded, see above), zero at creation.
  const core::Tensor& buffer(size_t index) const override;
  using BucketTransport::start;
  void start(size_t index, BucketCollective collective) override;
  std::pair<int64_t, int64_t> shard(size_t index, int rank) const override;
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
