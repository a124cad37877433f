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
// How the thread waits, decided by measurement over real, rate-limited links (2 nodes x 1 rank
// of scripts/cluster-sim.sh, 2-core dev VM). Two ways, LinkWait, chosen per transport:
//   - Blocking (the default, and for fast links): inside MPI's blocking collectives, whose
//     algorithms are the fast ones (36 all-reduces of 1 MiB float32 at 10 Gbit/s: 26.5 ms
//     blocking, 65-66 ms as MPI_Iallreduce, polled or waited), at nice 19 so that its spinning
//     in MPI never takes backward's core: it runs on whatever core backward leaves idle, and
//     otherwise once the main thread waits for the buckets;
//   - Sleeping (for slow links; DDP's transport = auto picks it when the link it measured is
//     slow, transport_choice.cpp): each collective started nonblocking and waited for with
//     Work::wait_sleeping (MPI_Test, then a 50 us nap), which the communicator's watchdog times
//     like a blocking call, at nice -20 where the process may raise it (root, CAP_SYS_NICE),
//     else as far as RLIMIT_NICE allows, else at the process's own priority (thread_nice()
//     and DDP's transport line say which). On a slow link the thread mostly waits, and the link
//     only moves data while the thread runs, so its priority decides what can hide behind
//     backward. mpigrad-bench-comm-thread --busy 1 at 2 Gbit/s, 36 all-reduces of 1 MiB of
//     float32 (then bfloat16, half the bytes) beside one busy thread per rank:
//       thread at nice       -20    -15    -10    -5     0      19
//       float32 (ms)         156    155    170    325    610    3772
//       bfloat16 (ms)        77     97     124    196    469    4708
//     (with nothing beside it 156-158 and 71-79 ms, the link's rate). It never spins, so the
//     priority costs backward only the thread's real work; spinning at nice -10 (MPI_Test
//     without naps) took 537-540 ms for the float32 case in a scratch run. At 10 Gbit/s the
//     same wait made mpigrad-bench-ddp's step 1.2-1.6x slower on 2 x 1 (at any nice value),
//     hence Blocking there.
// In both, the thread sleeps on a condition variable while it has nothing to do (spinning for
// work measured 1.54-1.79x the serial bound: it takes backward's core), and while a node's ranks
// wait for each other to start a bucket it polls the shared-memory flags with backoff (spin,
// yield, then 20 us naps), as SharedMemoryAllReduce does. What each gives a DDP step is in
// docs/clusters.md ("Slow links").
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

// How the communication thread waits for the inter-node step (see "How the thread waits").
enum class LinkWait : uint8_t {
  Blocking,  // inside MPI's blocking collectives, at nice 19: for fast links
  Sleeping,  // nonblocking collectives polled with naps, at nice -20 where allowed: slow links
};

class HierarchicalAllReduce final : public BucketTransport {
 public:
  // Collective over `communicator` (an MPI one). `node` holds this rank's node: the ranks of
  // `communicator` that share its memory (split_node_local), every node as many. Returns null
  // on every rank, with the reason in `*why_not`, when a rank's MPI is below
  // MPI_THREAD_MULTIPLE or a node cannot share memory. `timeout_seconds` bounds each wait for
  // the other ranks of the node (<= 0: no bound). `wire`, a 16-bit float dtype, is what the
  // inter-node step sends, when not the buffers' own (see "Gradient compression" above).
  // `link_wait`: how the thread waits for the link, the same on every rank.
  static std::unique_ptr<HierarchicalAllReduce> create(
      Communicator& communicator, std::unique_ptr<Communicator> node,
      std::span<const SharedBufferSpec> buffers, double timeout_seconds,
      std::string* why_not = nullptr, std::optional<core::DType> wire = std::nullopt,
      LinkWait link_wait = LinkWait::Blocking);
  ~HierarchicalAllReduce() override;

  // The communication thread's nice value: 19 when it waits Blocking; when Sleeping -20 where
  // the process may raise it, else the process's own (see "How the thread waits").
  int thread_nice() const;
  LinkWait link_wait() const;
  // CPU time the communication thread has used so far, in seconds: what the averaging takes
  // from the cores backward computes on (the kernel's TCP work on the thread's behalf included;
  // mpigrad-bench-ddp reports it per average).
  double thread_cpu_seconds() const;
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
