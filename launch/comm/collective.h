// What one collective call is, written once for every backend: its kind, its reduction, and the
// description (Collective) that Communicator's public calls build after checking their arguments
// and hand to the backend that runs it (communicator.h). A backend translates the description
// into its library's arguments (MPI datatypes and int counts, NCCL types and streams); it never
// works out again which tensor is sent, how many elements each rank moves or whether the call
// is in place.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/dtype.h"

namespace mpigrad::core {
class Tensor;
}

namespace mpigrad::launch {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
inline constexpr core::EnumName<ReduceOp> kReduceOpNames[] = {
    {ReduceOp::Sum, "sum"}, {ReduceOp::Avg, "avg"}, {ReduceOp::Max, "max"}, {ReduceOp::Min, "min"}};
std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

// The values travel between ranks in the MPIGRAD_DEBUG_COLLECTIVES check (collective_check.h),
// hence the fixed width.
enum class CollectiveKind : int64_t {
  AllReduce,
  Broadcast,
  AllGather,
  AllGatherV,
  ReduceScatter,
  Gather,
  GatherV,
  Barrier,
};
// "all_reduce", ... (the public call's name); inline, as every collective names itself to the
// watchdog.
inline const char* collective_kind_name(CollectiveKind kind) {
  constexpr const char* kNames[] = {"all_reduce",     "broadcast", "all_gather", "all_gather_v",
                                    "reduce_scatter", "gather",    "gather_v",   "barrier"};
  const auto index = size_t(kind);
  return index < std::size(kNames) ? kNames[index] : "?";
}

// One collective as this rank calls it. Everything a backend needs is here, already checked:
// defined, contiguous tensors on the communicator's device, one dtype, counts that fit the
// operation, a root in range, avg only on floating dtypes.
struct Collective {
  CollectiveKind kind = CollectiveKind::Barrier;
  // The caller's tensors, borrowed for the call: a pointer, not a copy, keeps the latency-bound
  // path free of reference counting. A backend that returns before the collective completes
  // (the async forms, NCCL's stream order) keeps its own references until it has.
  // - input: what this rank sends; null for broadcast and barrier.
  // - output: what this rank receives; for broadcast the one tensor, sent by the root and
  //   received by the others; null for barrier and, on ranks other than the root, for gather
  //   and gather_v (they receive nothing).
  const core::Tensor* input = nullptr;
  const core::Tensor* output = nullptr;
  core::DType dtype = core::kFloat32;
  ReduceOp op = ReduceOp::Sum;  // all_reduce, reduce_scatter
  int root = 0;                 // broadcast, gather, gather_v
  // The count the libraries take: the tensor's elements (all_reduce, broadcast), this rank's
  // input (all_gather, gather, and counts[rank] for the v forms), or each rank's block of the
  // result (reduce_scatter's output).
  int64_t count = 0;
  // The v forms: every rank's count, the same on every rank; borrowed from the caller for the
  // call, like the tensors.
  std::span<const int64_t> counts;
  // This rank's input already is its place in the output: the same memory (all_reduce), or
  // its block of it (all_gather, all_gather_v, and the gathers on the root). MPI then passes
  // MPI_IN_PLACE; NCCL reads and writes the same buffer, which it allows.
  bool in_place = false;
  int64_t bytes = 0;  // what this rank moves, for the watchdog's reports

  bool is_reduction() const {
    return kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter;
  }
  bool is_v() const {
    return kind == CollectiveKind::AllGatherV || kind == CollectiveKind::GatherV;
  }
  // Elements rank r contributes to the output (all_gather and the gathers, v forms included).
  int64_t count_of(int r) const { return is_v() ? counts[size_t(r)] : count; }
  // Where rank r's block starts in the output, in elements: r x count, or the counts before r.
  int64_t offset_of(int r) const {
    if (!is_v()) return int64_t(r) * count;
    int64_t offset = 0;
    for (int before = 0; before < r; ++before) offset += counts[size_t(before)];
    return offset;
  }
};

}  // namespace mpigrad::launch
