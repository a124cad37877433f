// What MPIGRAD_DEBUG_COLLECTIVES compares across ranks before each collective, shared by the MPI
// and NCCL communicators and taken from the call's description (collective.h): which collective,
// dtype, count, root, reduction and per-rank counts. A mismatch becomes one error listing every
// rank's call instead of garbage or a hang.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/launch/comm/collective.h"

namespace mpigrad::launch {

struct MpiCommHandle;
struct WorldRanks;

// Every rank of `control` (whose ranks `world` places in mpigrad's world) shares what it is about
// to call as collective #seq and all compare; on any difference throws core::Error "<where>:
// MPIGRAD_DEBUG_COLLECTIVES: ranks disagree on collective #seq:" followed by one line per rank,
// by world rank. `name` labels MPI failures.
void check_collective_agreement(const MpiCommHandle& control, const WorldRanks& world,
                                const std::string& where, const std::string& name,
                                const Collective& mine, uint64_t seq);

}  // namespace mpigrad::launch
