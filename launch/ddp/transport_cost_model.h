// How `transport = auto` chooses between the hierarchical and the communicator transport when
// host gradients span several nodes with as many ranks each: it predicts each one's all-reduce
// time for the model's buckets from three measured figures (launch/ddp/link_probe.h) and takes
// the faster. Pure: the same inputs give the same decision, so every rank that holds the same
// (broadcast) figures decides alike, and the tests can drive it with any regime.
//
// The cost model, for a bucket of n bytes on N nodes of L ranks (P = N L ranks, placed node by
// node), with the link's bandwidth beta and latency alpha (one stream between two node leaders,
// and the latency of one step of an all-reduce between them) and sigma, one rank's copy
// bandwidth while every rank of its node copies at once:
//   communicator  the flat all-reduce over all P ranks, which does not know the nodes, as
//                 recursive halving then doubling in rank order: its first log2 N exchanges
//                 cross the links, all L ranks of a node at once, so each link carries
//                 2 L (N - 1) / N n bytes; the rest moves 2 (L - 1) / P n bytes a rank inside
//                 the node:
//                   t = 2 ceil(log2 P) alpha + 2 L (N - 1) / N * n / beta
//                       + 2 (L - 1) / P * n / sigma;
//   hierarchical  a reduce-scatter and an all-gather in shared memory, which together read and
//                 write (1 + 1/L) n bytes a rank, as a copy of that much would (none when
//                 L = 1), then the L shards' all-reduces across the N nodes at once, sharing the
//                 link, in pieces of 1 MiB (launch/ddp/transports/hierarchical_all_reduce.h),
//                 each a ring:
//                   t = (1 + 1/L) n / sigma + pieces * 2 (N - 1) alpha + 2 (N - 1) / N * n / beta.
// Under gradient compression (a 16-bit wire, wire_ratio = 1/2 of fp32) the communicator sends
// its whole bucket in the wire dtype, so every n above is n wire_ratio; the hierarchical transport
// rounds only its inter-node step (the shared-memory steps stay in the bucket's dtype), so only
// its link term shrinks, and its 1 MiB pieces stay as many.
// Per step is the sum over the buckets (they share the link one after another). So on 2 x 2 the
// communicator wins only where the link is faster than a rank's copy, and with one rank a node
// the two send the same bytes. A prediction within 10% of the other's is a tie, and a tie goes to
// the hierarchical transport: its communication thread hides more behind backward than the
// communicator's MPI_Iallreduce, which this model leaves out (on 2 x 1, where both send the same
// bytes, the communicator's step measured 0.96-1.61x the hierarchical one's on the simulated
// cluster; docs/clusters.md, "Slow links"). Measured there on 2 x 2 at 1 Gbit/s, where the link
// limits: the communicator's step 1.40-2.08x the hierarchical one's, and a blocking MPI_Allreduce
// of 36 MiB 1.5-1.8x the hierarchical averaging (Open MPI 4.1's default, ring and Rabenseifner
// algorithms alike); this model says 2.0x, a ring formula 1.5x.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mpigrad/launch/ddp/transport_choice.h"

namespace mpigrad::launch {

struct LinkFigures {
  double link_bytes_per_second = 0;           // beta
  double link_latency_seconds = 0;            // alpha
  double shared_memory_bytes_per_second = 0;  // sigma
};

// The predicted seconds per step for the buckets' sizes in bytes (nodes >= 2, ranks_per_node
// >= 1, figures positive), sending `wire_ratio` bytes on the wire per bucket byte.
double predict_communicator_seconds(int nodes, int ranks_per_node, const LinkFigures& figures,
                                    std::span<const int64_t> bucket_bytes, double wire_ratio = 1);
double predict_hierarchical_seconds(int nodes, int ranks_per_node, const LinkFigures& figures,
                                    std::span<const int64_t> bucket_bytes, double wire_ratio = 1);

struct AutoTransportDecision {
  TransportKind kind = TransportKind::Hierarchical;
  // True when the figures decided; false when the layout rule did (see `reason`).
  bool by_measurement = false;
  double hierarchical_seconds = 0;  // the predictions, 0 when not made
  double communicator_seconds = 0;
  double link_bytes_per_second = 0;  // the measured link, when the figures decided
  // One line for the log, "transport auto: hierarchical (link 0.25 GB/s, 45 us; shm 9.8 GB/s;
  // predicted 18 ms vs communicator 31 ms per step for 9.4 MB of buckets)", or the layout rule
  // and why the figures did not decide.
  std::string reason;
};

// nodes <= 1: shared_memory; ranks_per_node <= 0 (the nodes hold different numbers of ranks):
// communicator. Otherwise by the figures, or, when there are none (`unmeasured` says why), they
// are not all positive and finite, or there are no bucket bytes, by the layout rule
// (hierarchical), saying so.
AutoTransportDecision decide_auto_transport(int nodes, int ranks_per_node,
                                            const std::optional<LinkFigures>& figures,
                                            std::string_view unmeasured,
                                            std::span<const int64_t> bucket_bytes,
                                            double wire_ratio = 1);

}  // namespace mpigrad::launch
