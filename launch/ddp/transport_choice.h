// Which bucket transport (launch/ddp/bucket_transport.h) a DistributedDataParallel uses, decided
// in this one place from the gradients' device, the communicator, the options and the node
// layout, and the same on every rank:
//   communicator   a single rank, GPU gradients, a non-MPI communicator, shared_memory off,
//                  gradient compression on one node, or nodes holding different numbers of ranks;
//   shared_memory  host gradients and every rank on one node, without compression;
//   hierarchical   host gradients on several nodes with as many ranks each (one rank a node
//                  included: then there is no shared-memory step, only the communication thread),
//                  with or without compression (then only the inter-node step is 16-bit).
// On several nodes with as many ranks each, Auto measures the links at start-up
// (launch/ddp/link_probe.h) and takes the communicator instead when the cost model predicts it
// faster for these buckets (launch/ddp/transport_cost_model.h); the description then ends with
// the figures, the predictions and the choice ("transport auto: ..."). Without a usable
// measurement (simulated nodes, a bandwidth that does not settle) the layout rule above stands,
// and the line says why.
// Asking for a transport by name (TransportKind other than Auto) makes it a requirement: when it
// cannot be had, every rank raises one core::Error saying why. Under Auto a transport that cannot
// be set up (no room in /dev/shm, MPI below MPI_THREAD_MULTIPLE) gives way to the next one, and
// the description says why.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/ddp/bucket_transport.h"

namespace mpigrad::launch {

enum class TransportKind : uint8_t { Auto, Communicator, SharedMemory, Hierarchical };
inline constexpr core::EnumName<TransportKind> kTransportKindNames[] = {
    {TransportKind::Auto, "auto"},
    {TransportKind::Communicator, "communicator"},
    {TransportKind::SharedMemory, "shared_memory"},
    {TransportKind::Hierarchical, "hierarchical"}};
// "auto", "communicator", "shared_memory", "hierarchical"; throws core::Error listing them.
TransportKind parse_transport_kind(std::string_view text);
std::string_view transport_kind_name(TransportKind kind);

struct TransportRequest {
  TransportKind kind = TransportKind::Auto;
  // false rules out both shared-memory transports (DdpOptions::shared_memory).
  bool shared_memory = true;
  // A 16-bit dtype to communicate in (gradient compression): the communicator sends the whole
  // bucket in it, the hierarchical transport its inter-node step; shared memory does not.
  std::optional<core::DType> wire;
  // Bounds each wait on the other ranks of a node (the shared-memory transports).
  double timeout_seconds = 300;
};

struct TransportChoice {
  std::unique_ptr<BucketTransport> transport;
  TransportKind kind = TransportKind::Communicator;
  // One line for the log: the transport, the layout, and why this one.
  std::string description;
};

// Collective over `communicator`: every rank must pass the same buckets and request.
TransportChoice choose_bucket_transport(Communicator& communicator,
                                        std::span<const BucketSpec> buckets,
                                        const TransportRequest& request);

}  // namespace mpigrad::launch
