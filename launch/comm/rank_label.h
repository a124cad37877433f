// The one way mpigrad names a rank in what it prints: "[rank r/w]", where r and w are the rank
// and size in mpigrad's world (the communicator the job started on, or the one a host code
// handed over), never those of a sub-communicator such as the node-local or inter-node one.
// Errors that may involve several nodes add the host name: "[rank r/w on node7]".
#pragma once

#include <string>
#include <string_view>

namespace mpigrad::launch {

// "[rank r/w]".
std::string rank_label(int world_rank, int world_size);
// "[rank r/w on HOST]", HOST being this process's host name.
std::string rank_label_on_host(int world_rank, int world_size);
// This process's host name (gethostname, read once); "unknown-host" if it cannot be read.
const std::string& host_name();

// Writes "[rank r/w] PROGRAM: error: MESSAGE\n" to stderr in one call (so the lines of ranks
// failing together do not interleave) and flushes it.
void print_rank_error(int world_rank, int world_size, std::string_view program,
                      std::string_view message);

}  // namespace mpigrad::launch
