#include "mpigrad/launch/comm/collective_check.h"

#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

namespace {

// What travels: the same on every rank of a matching call. The v forms send the sum of their
// counts (this rank's own count differs from rank to rank) and a hash of all of them.
enum Field { kKind, kDType, kCount, kRoot, kReduce, kCountsHash, kSequence, kFields };

std::vector<int64_t> signature(const Collective& collective, uint64_t seq) {
  std::vector<int64_t> fields(kFields, 0);
  fields[kKind] = int64_t(collective.kind);
  fields[kDType] = int64_t(collective.dtype);
  fields[kCount] = collective.count;
  fields[kRoot] = collective.root;
  fields[kReduce] = int64_t(collective.op);
  if (collective.is_v()) {
    int64_t total = 0, hash = 0;
    for (int64_t count : collective.counts) {
      total += count;
      hash = hash * 1000003 + count;
    }
    fields[kCount] = total;
    fields[kCountsHash] = hash;
  }
  fields[kSequence] = int64_t(seq);
  return fields;
}

// "all_gather_v(dtype float32, count 9, counts hash 123) as collective #4"
std::string describe(const int64_t* f) {
  const auto kind = CollectiveKind(f[kKind]);
  std::string text = std::string(collective_kind_name(kind)) + "(dtype " +
                     std::string(core::dtype_name(core::DType(f[kDType]))) + ", count " +
                     std::to_string(f[kCount]);
  if (kind == CollectiveKind::Broadcast || kind == CollectiveKind::Gather ||
      kind == CollectiveKind::GatherV) {
    text += ", root " + std::to_string(f[kRoot]);
  }
  if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter) {
    text += ", op " + std::string(reduce_op_name(ReduceOp(f[kReduce])));
  }
  if (kind == CollectiveKind::AllGatherV || kind == CollectiveKind::GatherV) {
    text += ", counts hash " + std::to_string(f[kCountsHash]);
  }
  return text + ") as collective #" + std::to_string(f[kSequence]);
}

}  // namespace

void check_collective_agreement(const MpiCommHandle& control, const WorldRanks& world,
                                const std::string& where, const std::string& name,
                                const Collective& collective, uint64_t seq) {
  const int size = int(world.of_member.size());
  int rank = 0;
  MPI_Comm_rank(control.comm, &rank);
  const std::vector<int64_t> mine = signature(collective, seq);
  std::vector<int64_t> all(size_t(kFields * size));
  check_mpi(MPI_Allgather(mine.data(), kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T,
                          control.comm),
            "MPI_Allgather", "MPIGRAD_DEBUG_COLLECTIVES check on '" + name + "'",
            rank_label(world.of_member[size_t(rank)], world.size));
  bool agree = true;
  for (int r = 1; r < size && agree; ++r) {
    for (int f = 0; f < kFields; ++f)
      agree = agree && all[size_t(r * kFields + f)] == all[size_t(f)];
  }
  if (agree) return;
  std::string message = where + ": MPIGRAD_DEBUG_COLLECTIVES: ranks disagree on collective #" +
                        std::to_string(seq) + ":";
  for (int r = 0; r < size; ++r) {
    message += "\n  rank " + std::to_string(world.of_member[size_t(r)]) + ": " +
               describe(&all[size_t(r * kFields)]);
  }
  core::fail(message);
}

}  // namespace mpigrad::launch
