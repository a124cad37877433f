// What MPIGRAD_DEBUG_COLLECTIVES compares across ranks before each collective, shared by the MPI
// and NCCL communicators: which collective, dtype, count, root, reduction and per-rank counts.
// A mismatch becomes one error listing every rank's call instead of garbage or a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

#include "mpigrad/core/dtype.h"
#include "mpigrad/launch/comm/communicator.h"

namespace mpigrad::launch {

struct MpiCommHandle;

enum class CollectiveKind : int64_t {
  AllReduce,
  Broadcast,
  AllGather,
  AllGatherV,
  ReduceScatter,
  Barrier,
};
// "all_reduce", ...; inline, as every collective names itself to the watchdog.
inline const char* collective_kind_name(CollectiveKind kind) {
  constexpr const char* kNames[] = {"all_reduce",   "broadcast",      "all_gather",
                                    "all_gather_v", "reduce_scatter", "barrier"};
  const auto index = size_t(kind);
  return index < std::size(kNames) ? kNames[index] : "?";
}

struct CollectiveSignature {
  CollectiveKind kind = CollectiveKind::Barrier;
  core::DType dtype = core::kFloat32;
  int64_t count = 0;
  int64_t root = 0;
  ReduceOp reduce = ReduceOp::Sum;
  int64_t counts_hash = 0;  // all_gather_v's per-rank counts
};

template <typename Counts>
int64_t hash_counts(const Counts& counts) {
  int64_t hash = 0;
  for (auto count : counts) hash = hash * 1000003 + int64_t(count);
  return hash;
}

// Every rank of `control` (whose ranks `world` places in mpigrad's world) shares its signature
// of collective #seq and all compare; on any difference throws core::Error "<where>:
// MPIGRAD_DEBUG_COLLECTIVES: ranks disagree on collective #seq:" followed by one line per rank,
// by world rank. `name` labels MPI failures.
void check_collective_agreement(const MpiCommHandle& control, const WorldRanks& world,
                                const std::string& where, const std::string& name,
                                const CollectiveSignature& mine, uint64_t seq);

}  // namespace mpigrad::launch
