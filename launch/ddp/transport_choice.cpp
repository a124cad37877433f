// choose_bucket_transport: the one place that decides how DDP's buckets are averaged.
#include "mpigrad/launch/ddp/transport_choice.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/ddp/link_probe.h"
#include "mpigrad/launch/ddp/transport_cost_model.h"
#include "mpigrad/launch/ddp/transports/communicator_transport.h"
#include "mpigrad/launch/ddp/transports/hierarchical_all_reduce.h"
#include "mpigrad/launch/ddp/transports/shared_memory_all_reduce.h"

namespace mpigrad::launch {

TransportKind parse_transport_kind(std::string_view text) {
  return core::parse_enum<TransportKind>(text, kTransportKindNames, "gradient transport");
}

std::string_view transport_kind_name(TransportKind kind) {
  return core::enum_name(kind, kTransportKindNames);
}

namespace {

// Below this measured link bandwidth the hierarchical transport's thread waits Sleeping.
constexpr double kSlowLinkBytes = 0.5e9;

// Which ranks share a node, as seen by every rank alike.
struct NodeLayout {
  std::unique_ptr<Communicator> node;  // this rank's node
  int nodes = 1;
  int ranks_per_node = 0;  // 0 when the nodes hold different numbers of ranks
  int fewest = 0, most = 0;
};

NodeLayout detect_nodes(Communicator& communicator) {
  NodeLayout layout;
  layout.node = communicator.split_node_local(communicator.name() + " node");
  core::Tensor mine = core::Tensor::from_vector<int32_t>(
      {layout.node->size(), layout.node->rank() == 0 ? 1 : 0}, {2});
  core::Tensor all = core::zeros({2 * communicator.size()}, core::kInt32);
  communicator.all_gather(mine, all);
  std::vector<int32_t> values = all.to_vector<int32_t>();
  layout.nodes = 0;
  layout.fewest = values[0];
  layout.most = values[0];
  for (size_t r = 0; r < values.size(); r += 2) {
    layout.nodes += values[r + 1];
    layout.fewest = std::min(layout.fewest, values[r]);
    layout.most = std::max(layout.most, values[r]);
  }
  layout.ranks_per_node = layout.fewest == layout.most ? layout.fewest : 0;
  return layout;
}

std::string describe_layout(const NodeLayout& layout) {
  std::ostringstream out;
  out << layout.nodes << (simulated_node_count() > 0 ? " simulated" : "")
      << (layout.nodes == 1 ? " node" : " nodes") << " x " << layout.ranks_per_node
      << (layout.ranks_per_node == 1 ? " rank" : " ranks");
  return out.str();
}

TransportChoice communicator_choice(Communicator& communicator, std::span<const BucketSpec> buckets,
                                    const TransportRequest& request, const std::string& why) {
  TransportChoice choice;
  choice.kind = TransportKind::Communicator;
  choice.transport = std::make_unique<CommunicatorTransport>(communicator, buckets, request.wire);
  choice.description = "all-reduced over the " + std::string(backend_name(communicator.backend())) +
                       " communicator '" + communicator.name() + "' (" + why + ")";
  return choice;
}

// Under Auto, falls back to the communicator with `why`; a transport asked for by name fails.
TransportChoice fall_back(Communicator& communicator, std::span<const BucketSpec> buckets,
                          const TransportRequest& request, TransportKind wanted,
                          const std::string& why) {
  MPIGRAD_CHECK(request.kind == TransportKind::Auto || request.kind == TransportKind::Communicator,
                "DistributedDataParallel on communicator '", communicator.name(),
                "': the gradient transport '", transport_kind_name(wanted), "' was asked for, but ",
                why);
  return communicator_choice(communicator, buckets, request, why);
}

// Simulated nodes share memory, so what the probe would call their link is not a network: auto
// keeps the layout rule there unless a test asks for the measurement anyway.
bool probe_simulated_links() {
  const char* text = std::getenv("MPIGRAD_PROBE_SIMULATED_LINKS");
  const std::string_view value = text == nullptr ? "" : text;
  MPIGRAD_CHECK(value.empty() || value == "0" || value == "1", "MPIGRAD_PROBE_SIMULATED_LINKS='",
                value, "' must be 0 or 1");
  return value == "1";
}

// Auto across nodes with as many ranks each: hierarchical or communicator, whichever the cost
// model predicts faster from the links measured now (launch/ddp/transport_cost_model.h).
AutoTransportDecision decide_across_nodes(Communicator& communicator, NodeLayout& layout,
                                          std::span<const BucketSpec> buckets,
                                          const TransportRequest& request) {
  std::vector<int64_t> bucket_bytes;
  double wire_ratio = 1;  // the wire's bytes per bucket byte: every bucket has one dtype here
  for (const BucketSpec& spec : buckets) {
    bucket_bytes.push_back(spec.numel * int64_t(core::element_size(spec.dtype)));
    if (request.wire) {
      wire_ratio = double(core::element_size(*request.wire)) / core::element_size(spec.dtype);
    }
  }
  std::optional<LinkFigures> figures;
  std::string unmeasured;
  if (simulated_node_count() > 0 && !probe_simulated_links()) {
    unmeasured =
        "the nodes are simulated (MPIGRAD_SIMULATE_NODES), so there is no network between them to "
        "measure";
  } else {
    figures = measure_links(communicator, *layout.node, layout.nodes, &unmeasured);
  }
  return decide_auto_transport(layout.nodes, layout.ranks_per_node, figures, unmeasured,
                               bucket_bytes, wire_ratio);
}

}  // namespace

TransportChoice choose_bucket_transport(Communicator& communicator,
                                        std::span<const BucketSpec> buckets,
                                        const TransportRequest& request) {
  const bool on_host = std::all_of(buckets.begin(), buckets.end(),
                                   [](const BucketSpec& spec) { return spec.device.is_cpu(); });
  // What rules out both shared-memory transports, checked in the same order on every rank.
  std::string why_not;
  if (request.kind == TransportKind::Communicator) {
    why_not = "the communicator transport was asked for";
  } else if (!request.shared_memory) {
    why_not = "shared_memory is off";
  } else if (communicator.size() == 1) {
    why_not = "a single rank has nothing to average";
  } else if (!on_host) {
    why_not = "the gradients are on a GPU";
  } else if (communicator.backend() != Backend::Mpi) {
    why_not = "the communicator is not an MPI one";
  }
  if (!why_not.empty()) {
    const TransportKind wanted =
        request.kind == TransportKind::Auto ? TransportKind::SharedMemory : request.kind;
    return fall_back(communicator, buckets, request, wanted, why_not);
  }

  NodeLayout layout = detect_nodes(communicator);
  std::vector<SharedBufferSpec> specs;
  for (const BucketSpec& spec : buckets) specs.push_back({spec.dtype, spec.numel});
  TransportKind wanted = request.kind;
  std::string auto_reason;           // the measured decision's log line, under Auto across nodes
  double link_bytes_per_second = 0;  // the link that decided it, when measured
  if (wanted == TransportKind::Auto) {
    wanted = layout.nodes == 1 ? TransportKind::SharedMemory : TransportKind::Hierarchical;
    if (layout.nodes > 1 && layout.ranks_per_node > 0) {
      AutoTransportDecision decision = decide_across_nodes(communicator, layout, buckets, request);
      if (decision.kind == TransportKind::Communicator) {
        return communicator_choice(communicator, buckets, request, decision.reason);
      }
      auto_reason = std::move(decision.reason);
      link_bytes_per_second = decision.link_bytes_per_second;
    }
  }
  TransportChoice choice;
  choice.kind = wanted;
  if (wanted == TransportKind::SharedMemory) {
    if (layout.nodes != 1) {
      std::ostringstream why;
      why << "the ranks span " << layout.nodes << " nodes";
      return fall_back(communicator, buckets, request, wanted, why.str());
    }
    if (request.wire) {
      // Kept as before the hierarchical transport compressed: on one node nothing crosses a
      // link, and the shared-memory average has no wire to round on.
      return fall_back(communicator, buckets, request, wanted,
                       "gradient compression on one node goes through the communicator");
    }
    layout.node.reset();
    std::string why;
    choice.transport =
        SharedMemoryAllReduce::create(communicator, specs, request.timeout_seconds, &why);
    if (!choice.transport) return fall_back(communicator, buckets, request, wanted, why);
    choice.description =
        "averaged in shared memory (every rank on one node, " + describe_layout(layout) + ")";
    return choice;
  }
  if (layout.ranks_per_node == 0) {
    std::ostringstream why;
    why << "the " << layout.nodes << " nodes hold different numbers of ranks (" << layout.fewest
        << " to " << layout.most << "), so the shards of the nodes would not match";
    return fall_back(communicator, buckets, request, wanted, why.str());
  }
  const std::string layout_text = describe_layout(layout);
  const std::string wire_text =
      request.wire ? " in " + std::string(core::dtype_name(*request.wire)) + " (compression)" : "";
  // A slow link, as auto measured it, is waited for sleeping at a raised priority, so it moves
  // data while backward runs; anything else blocking in MPI (hierarchical_all_reduce.h, "How the
  // thread waits"). Measured on the simulated cluster (docs/clusters.md, "Slow links"): at 1-2
  // Gbit/s (0.12-0.26 GB/s) sleeping made the step 0.79-0.97x (2 x 2 bf16 up to 1.06x), at 10
  // Gbit/s (1.15 GB/s) 1.2-1.6x; the threshold lies between.
  const LinkWait link_wait = link_bytes_per_second > 0 && link_bytes_per_second < kSlowLinkBytes
                                 ? LinkWait::Sleeping
                                 : LinkWait::Blocking;
  std::string why;
  std::unique_ptr<HierarchicalAllReduce> hierarchical =
      HierarchicalAllReduce::create(communicator, std::move(layout.node), specs,
                                    request.timeout_seconds, &why, request.wire, link_wait);
  if (!hierarchical) return fall_back(communicator, buckets, request, wanted, why);
  const int nice = hierarchical->thread_nice();
  const std::string thread_text =
      "a communication thread" +
      (link_wait == LinkWait::Blocking
           ? std::string(" blocking in MPI at nice ") + std::to_string(nice)
           : " that sleeps while the link is busy, at nice " + std::to_string(nice) +
                 (nice < 0 ? std::string()
                           : " (the process may not raise its priority, so where every core "
                             "computes the link mostly waits for backward; README, Slow links)"));
  choice.transport = std::move(hierarchical);
  choice.description =
      "averaged hierarchically over " + layout_text +
      (layout.ranks_per_node > 1
           ? ": reduce-scatter in shared memory, each shard all-reduced across the nodes on " +
                 thread_text + wire_text + ", all-gather in shared memory"
           : ": each bucket all-reduced across the nodes on " + thread_text + wire_text) +
      (auto_reason.empty() ? "" : "; " + auto_reason);
  return choice;
}

}  // namespace mpigrad::launch
