// measure_links: the figures `transport = auto` decides by across nodes
// (launch/ddp/transport_cost_model.h), measured at DDP's start-up in a bounded fraction of a
// second and the same on every rank:
//   shared memory  every rank of a node copies 16 MiB at once (the transport's node steps
//                  share the memory bandwidth so too), its best of 5, and the best rank's
//                  figure counts: on a machine shared with other work (2 cores, load 10-17 here)
//                  the slowest rank's best of 3 ranged 0.67-8 GB/s from one DDP to the next;
//   link           the node leaders (local rank 0) all-reduce among themselves, as the
//                  transports do: the latency from the best of 5 all-reduces of 8 bytes (over
//                  the ring's 2 (N - 1) steps), the bandwidth from all-reduces of 256 KiB,
//                  two a size, doubling until the better takes 10 ms or the size reaches 64 MiB
//                  (so that one slow all-reduce does not stop the growth, and the bytes sent on
//                  the way drain a rate limiter's initial burst: a token bucket lets its first
//                  bytes through at line rate), over two sizes at least, and past any size
//                  whose rate is 4x below both the previous size's and the copy rate (a stall
//                  twice at one size looks settled: 2 of 29 runs on a fast link once settled on
//                  0.0109 GB/s at 256 KiB; a link that slow is as slow at the next size, so
//                  that one decides); then that size again until its two best times agree
//                  within a factor of 2 (at most 6 tries): the choice turns on factors, and a
//                  2-core machine under load varies more than 50%. Load only adds time, so the
//                  best is the link's.
// Each leader's step uses the slowest leader's time, so all leaders take the same steps and
// reach the same figures, which every rank then gets (one small all-reduce). Never more than
// kProbeBudgetSeconds of all-reduces: when the bandwidth has not settled by then the result is
// empty, with the two best figures in `*why_not`, and auto keeps the layout rule.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/ddp/transport_cost_model.h"

namespace mpigrad::launch {

inline constexpr double kProbeBudgetSeconds = 0.4;

// Collective over `communicator` (MPI, host tensors); `node` is this rank's node (its ranks in
// `communicator`, split_node_local), spanning `nodes` nodes in all (>= 2).
std::optional<LinkFigures> measure_links(Communicator& communicator, Communicator& node, int nodes,
                                         std::string* why_not);

// The bandwidth half of the probe, apart from MPI so that a test can give it any timings:
// time_all_reduce(bytes) runs one all-reduce of `bytes` among the `node_count` node leaders and
// returns the slowest leader's seconds (so that every leader takes the same steps); `latency` is
// one ring step's, `copy` the shared-memory copy rate (bytes/s) that every leader has.
struct BandwidthProbe {
  double bandwidth = 0;  // bytes/s over the link, from the best time at the last size
  double previous = 0;   // the same from the second-best time
  bool settled = false;  // long enough to time, and the two best agree
  int64_t bytes = 0;     // the last size
  int sizes = 0;         // the sizes it tried
  double spent = 0;      // seconds of all-reduces
};
BandwidthProbe probe_bandwidth(const std::function<double(int64_t bytes)>& time_all_reduce,
                               int node_count, double latency, double copy);

}  // namespace mpigrad::launch
