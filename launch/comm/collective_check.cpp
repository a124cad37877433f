#include "mpigrad/launch/comm/collective_check.h"

#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

void check_collective_agreement(const MpiCommHandle& control, const WorldRanks& world,
                                const std::string& where, const std::string& name,
                                const CollectiveSignature& signature, uint64_t seq) {
  const int size = int(world.of_member.size());
  int rank = 0;
  MPI_Comm_rank(control.comm, &rank);
  constexpr int kFields = 7;
  int64_t mine[kFields] = {
      int64_t(signature.kind),   int64_t(signature.dtype), signature.count, signature.root,
      int64_t(signature.reduce), signature.counts_hash,    int64_t(seq)};
  std::vector<int64_t> all(size_t(kFields * size));
  check_mpi(
      MPI_Allgather(mine, kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T, control.comm),
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
    const int64_t* f = &all[size_t(r * kFields)];
    auto kind = CollectiveKind(f[0]);
    message += "\n  rank " + std::to_string(world.of_member[size_t(r)]) + ": " +
               collective_kind_name(kind) + "(dtype " +
               std::string(core::dtype_name(core::DType(f[1]))) + ", count " + std::to_string(f[2]);
    if (kind == CollectiveKind::Broadcast) message += ", root " + std::to_string(f[3]);
    if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter) {
      message += ", op " + std::string(reduce_op_name(ReduceOp(f[4])));
    }
    if (kind == CollectiveKind::AllGatherV) message += ", counts hash " + std::to_string(f[5]);
    message += ") as collective #" + std::to_string(f[6]);
  }
  core::fail(message);
}

}  // namespace mpigrad::launch
