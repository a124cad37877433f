// decide_auto_transport: the cost model of transport_cost_model.h and the log line it gives.
#include "mpigrad/launch/ddp/transport_cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace mpigrad::launch {

namespace {

// The hierarchical transport's inter-node pieces (launch/ddp/transports/hierarchical_all_reduce.h).
constexpr double kPieceBytes = 1 << 20;
// Predictions closer than this (relative) are a tie, which goes to the hierarchical transport.
constexpr double kTie = 0.10;

// Three significant digits (all of them from 100 up), without an exponent from 1e-4 up.
std::string figure(double value) {
  char text[32];
  std::snprintf(text, sizeof text, value >= 1000 ? "%.0f" : "%.3g", value);
  return text;
}

std::string seconds_text(double seconds) {
  if (seconds < 1e-3) return figure(seconds * 1e6) + " us";
  return figure(seconds * 1e3) + " ms";
}

std::string figures_text(const LinkFigures& f) {
  return "link " + figure(f.link_bytes_per_second / 1e9) + " GB/s, " +
         seconds_text(f.link_latency_seconds) + "; shm " +
         figure(f.shared_memory_bytes_per_second / 1e9) + " GB/s";
}

bool usable(const LinkFigures& f) {
  return std::isfinite(f.link_bytes_per_second) && f.link_bytes_per_second > 0 &&
         std::isfinite(f.link_latency_seconds) && f.link_latency_seconds >= 0 &&
         std::isfinite(f.shared_memory_bytes_per_second) && f.shared_memory_bytes_per_second > 0;
}

}  // namespace

double predict_communicator_seconds(int nodes, int ranks_per_node, const LinkFigures& figures,
                                    std::span<const int64_t> bucket_bytes, double wire_ratio) {
  const double n_nodes = nodes, local = ranks_per_node, ranks = n_nodes * local;
  const double steps = std::ceil(std::log2(ranks));
  double seconds = 0;
  for (int64_t bytes : bucket_bytes) {
    const double n = double(bytes) * wire_ratio;  // it casts the whole bucket
    seconds += 2 * steps * figures.link_latency_seconds +
               2 * local * (n_nodes - 1) / n_nodes * n / figures.link_bytes_per_second +
               2 * (local - 1) / ranks * n / figures.shared_memory_bytes_per_second;
  }
  return seconds;
}

double predict_hierarchical_seconds(int nodes, int ranks_per_node, const LinkFigures& figures,
                                    std::span<const int64_t> bucket_bytes, double wire_ratio) {
  const double n_nodes = nodes, local = ranks_per_node;
  double seconds = 0;
  for (int64_t bytes : bucket_bytes) {
    const double n = double(bytes);
    if (ranks_per_node > 1) seconds += (1 + 1 / local) * n / figures.shared_memory_bytes_per_second;
    const double pieces = std::max(1.0, std::ceil(n / local / kPieceBytes));
    seconds += pieces * 2 * (n_nodes - 1) * figures.link_latency_seconds +
               2 * (n_nodes - 1) / n_nodes * n * wire_ratio / figures.link_bytes_per_second;
  }
  return seconds;
}

AutoTransportDecision decide_auto_transport(int nodes, int ranks_per_node,
                                            const std::optional<LinkFigures>& figures,
                                            std::string_view unmeasured,
                                            std::span<const int64_t> bucket_bytes,
                                            double wire_ratio) {
  AutoTransportDecision decision;
  if (nodes <= 1) {
    decision.kind = TransportKind::SharedMemory;
    decision.reason = "transport auto: shared_memory (every rank on one node: no link to cross)";
    return decision;
  }
  if (ranks_per_node <= 0) {
    decision.kind = TransportKind::Communicator;
    decision.reason =
        "transport auto: communicator (the nodes hold different numbers of ranks, which the "
        "hierarchical transport cannot shard)";
    return decision;
  }
  double total = 0;
  for (int64_t bytes : bucket_bytes) total += double(bytes);
  const std::string layout_rule = "transport auto: hierarchical by the layout rule (";
  if (!figures) {
    decision.reason = layout_rule + std::string(unmeasured) + ")";
    return decision;
  }
  if (!usable(*figures)) {
    decision.reason = layout_rule + "the measurement is unusable: " + figures_text(*figures) + ")";
    return decision;
  }
  if (total <= 0) {
    decision.reason =
        layout_rule + "no gradient bytes to predict for; " + figures_text(*figures) + ")";
    return decision;
  }
  decision.by_measurement = true;
  decision.link_bytes_per_second = figures->link_bytes_per_second;
  decision.hierarchical_seconds =
      predict_hierarchical_seconds(nodes, ranks_per_node, *figures, bucket_bytes, wire_ratio);
  decision.communicator_seconds =
      predict_communicator_seconds(nodes, ranks_per_node, *figures, bucket_bytes, wire_ratio);
  const bool communicator =
      decision.communicator_seconds < (1 - kTie) * decision.hierarchical_seconds;
  decision.kind = communicator ? TransportKind::Communicator : TransportKind::Hierarchical;
  const double chosen =
      communicator ? decision.communicator_seconds : decision.hierarchical_seconds;
  const double other = communicator ? decision.hierarchical_seconds : decision.communicator_seconds;
  const bool tie = !communicator && decision.communicator_seconds <= decision.hierarchical_seconds;
  decision.reason = "transport auto: " + std::string(transport_kind_name(decision.kind)) + " (" +
                    figures_text(*figures) + "; predicted " + seconds_text(chosen) + " vs " +
                    (communicator ? "hierarchical " : "communicator ") + seconds_text(other) +
                    " per step for " + figure(total / 1e6) + " MB of buckets" +
                    (wire_ratio != 1 ? ", sent at " + figure(wire_ratio) + "x (compression)" : "") +
                    (tie ? ", a tie within 10%, which goes to hierarchical" : "") + ")";
  return decision;
}

}  // namespace mpigrad::launch
