// The all-pairs radius graph on the host (kernels/neighbor_list.h): the reference the CUDA
// search is tested against, and itself held against data/neighbor_list.cpp's cell list.
#include "mpigrad/kernels/neighbor_list.h"

#include <cmath>

#include "mpigrad/kernels/cpu/parallel.h"

namespace mpigrad::kernels::cpu {

int64_t radius_graph_count(const RadiusGraphArgs& args, int64_t* counts) {
  for (int64_t i = 0; i < 3 * args.atoms; ++i) {
    if (!std::isfinite(args.positions[i])) return i / 3;
  }
  parallel_for(0, args.atoms, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t n = 0;
      neighbor_detail::search_target(args, t, [&n](int64_t, const int64_t*, double) { ++n; });
      counts[t] = n;
    }
  });
  return -1;
}

void radius_graph_write(const RadiusGraphArgs& args, const RadiusGraphOutput& out) {
  parallel_for(0, args.atoms, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) neighbor_detail::write_target(args, out, t);
  });
}

}  // namespace mpigrad::kernels::cpu
