// The all-pairs radius graph of a ragged batch: the neighbor search data/neighbor_list.h runs
// where the positions live on a device, and the CPU version of the same search, which tests
// hold against the host's cell list.
//
// Each target atom looks at every atom of its structure, across the periodic images a frame
// (prepared on the host) allows, and keeps the sources strictly closer than the cutoff. The
// arithmetic is that of data/neighbor_list.cpp's cell list step for step (the same wrapping into
// the cell, the same sums in the same order, every product and sum rounded on its own, never
// fused), so both find the same edges with the same shifts. Quadratic in a structure's atoms: it
// suits batches of small structures, which is what a GPU trains on.
//
// Two passes: `count` finds each target's number of sources (before max_neighbors); the caller
// turns the counts into offsets and `write` writes the edges, each target's in order of source,
// then image, which is the host's order. With max_neighbors > 0 a target with more sources keeps
// its nearest (ties by that order): its candidates go to scratch first, then the kept ones to the
// output. Every target is one thread's work, so the output is the same on every run.
#pragma once

#include <cmath>
#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

// One structure of the batch, prepared on the host (data/neighbor_list.cpp).
struct NeighborFrame {
  double basis[9];    // rows are the lattice vectors; the identity when no axis is periodic
  double inverse[9];  // of basis
  int64_t reach[3];   // image offsets -reach .. reach are searched along each axis (0: not pbc)
  int64_t first;      // the structure's atoms are first .. last - 1 of the batch
  int64_t last;
  uint8_t pbc[3];
  uint8_t periodic;  // some axis is periodic: shifts are image . basis (else zero)
};

struct RadiusGraphArgs {
  int64_t atoms = 0;                      // V
  int64_t structures = 0;                 // B
  const NeighborFrame* frames = nullptr;  // [B], on the search's device
  const int64_t* structure_of = nullptr;  // [V]: each atom's structure, on the device
  const float* positions = nullptr;       // [V, 3], on the device
  double cutoff = 0;
  int64_t max_neighbors = 0;  // 0: keep every source
  bool self_loops = false;
};

// Where `write` puts the edges; every pointer is on the search's device.
struct RadiusGraphOutput {
  const int64_t* offsets = nullptr;          // [V + 1]: target t's edges are offsets[t] ..
  const int64_t* scratch_offsets = nullptr;  // [V]: where a target over max_neighbors keeps its
                                             // candidates (only those targets; null if K = 0)
  int64_t* scratch_source = nullptr;         // [scratch edges]
  int64_t* scratch_image = nullptr;          // [scratch edges * 3]
  double* scratch_distance2 = nullptr;       // [scratch edges]
  int64_t* source = nullptr;                 // [E] batch rows
  int64_t* target = nullptr;                 // [E]
  float* shift = nullptr;                    // [E * 3] Cartesian: image . basis
};

namespace neighbor_detail {

// Products and sums rounded one by one, as the host computes them (nvcc would fuse them).
MPIGRAD_HOST_DEVICE inline double mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MPIGRAD_HOST_DEVICE inline double add(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MPIGRAD_HOST_DEVICE inline double sub(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

// Atom `a` moved into the cell along periodic axes: its Cartesian position and the cells it was
// moved by (data/neighbor_list.cpp's wrapping).
MPIGRAD_HOST_DEVICE inline void wrap_atom(const NeighborFrame& f, const float* positions, int64_t a,
                                          double wrapped[3], int64_t wrap[3]) {
  const double r[3] = {double(positions[3 * a]), double(positions[3 * a + 1]),
                       double(positions[3 * a + 2])};
  for (int k = 0; k < 3; ++k) {
    double s =
        add(add(mul(r[0], f.inverse[k]), mul(r[1], f.inverse[3 + k])), mul(r[2], f.inverse[6 + k]));
    wrap[k] = 0;
    if (f.pbc[k]) {
      double w = floor(s);
      s = sub(s, w);
      if (s >= 1.0) w = add(w, 1.0);  // s was a hair below an integer
      wrap[k] = int64_t(w);
    }
  }
  for (int c = 0; c < 3; ++c) {
    double moved = r[c];
    for (int k = 0; k < 3; ++k) moved = sub(moved, mul(double(wrap[k]), f.basis[3 * k + c]));
    wrapped[c] = moved;
  }
}

// Calls emit(source, image, distance2) for every source of target t, in order of source, then
// image (lexicographic). image = wrap_s - wrap_t - offset, so the offsets run downwards.
template <typename Emit>
MPIGRAD_HOST_DEVICE void search_target(const RadiusGraphArgs& args, int64_t t, Emit&& emit) {
  const NeighborFrame& f = args.frames[args.structure_of[t]];
  const double cutoff2 = args.cutoff * args.cutoff;
  double rt[3], rs[3];
  int64_t wt[3], ws[3];
  wrap_atom(f, args.positions, t, rt, wt);
  for (int64_t s = f.first; s < f.last; ++s) {
    wrap_atom(f, args.positions, s, rs, ws);
    for (int64_t d0 = f.reach[0]; d0 >= -f.reach[0]; --d0) {
      for (int64_t d1 = f.reach[1]; d1 >= -f.reach[1]; --d1) {
        for (int64_t d2 = f.reach[2]; d2 >= -f.reach[2]; --d2) {
          if (s == t && d0 == 0 && d1 == 0 && d2 == 0 && !args.self_loops) continue;
          double distance2 = 0;
          for (int c = 0; c < 3; ++c) {
            const double translation =
                add(add(mul(double(d0), f.basis[c]), mul(double(d1), f.basis[3 + c])),
                    mul(double(d2), f.basis[6 + c]));
            const double v = sub(sub(rt[c], rs[c]), translation);
            distance2 = add(distance2, mul(v, v));
          }
          if (!(distance2 < cutoff2)) continue;
          const int64_t image[3] = {ws[0] - wt[0] - d0, ws[1] - wt[1] - d1, ws[2] - wt[2] - d2};
          emit(s, image, distance2);
        }
      }
    }
  }
}

// Edge `e` of the output: source, target and the shift of `image`.
MPIGRAD_HOST_DEVICE inline void put_edge(const NeighborFrame& f, const RadiusGraphOutput& out,
                                         int64_t e, int64_t source, int64_t target,
                                         const int64_t image[3]) {
  out.source[e] = source;
  out.target[e] = target;
  for (int c = 0; c < 3; ++c) {
    double shift = 0;
    for (int k = 0; k < 3; ++k) shift = add(shift, mul(double(image[k]), f.basis[3 * k + c]));
    out.shift[3 * e + c] = f.periodic ? float(shift) : 0.0f;
  }
}

// Target t's edges: straight to the output, or through scratch when it has more sources than
// max_neighbors, keeping the candidates that fewer than max_neighbors others are nearer than.
MPIGRAD_HOST_DEVICE inline void write_target(const RadiusGraphArgs& args,
                                             const RadiusGraphOutput& out, int64_t t) {
  const NeighborFrame& f = args.frames[args.structure_of[t]];
  const int64_t first = out.offsets[t];
  const int64_t room = out.offsets[t + 1] - first;
  if (room == 0) return;
  const bool select =
      args.max_neighbors > 0 && out.scratch_offsets != nullptr && out.scratch_offsets[t] >= 0;
  if (!select) {
    int64_t e = first;
    search_target(args, t, [&](int64_t source, const int64_t* image, double) {
      if (e < first + room) put_edge(f, out, e, source, t, image);
      ++e;
    });
    return;
  }
  const int64_t base = out.scratch_offsets[t];
  int64_t n = 0;
  search_target(args, t, [&](int64_t source, const int64_t* image, double distance2) {
    out.scratch_source[base + n] = source;
    for (int k = 0; k < 3; ++k) out.scratch_image[3 * (base + n) + k] = image[k];
    out.scratch_distance2[base + n] = distance2;
    ++n;
  });
  int64_t e = first;
  for (int64_t i = 0; i < n && e < first + room; ++i) {
    const double di = out.scratch_distance2[base + i];
    int64_t nearer = 0;  // candidates before i in (distance, order)
    for (int64_t j = 0; j < n && nearer < args.max_neighbors; ++j) {
      const double dj = out.scratch_distance2[base + j];
      if (dj < di || (dj == di && j < i)) ++nearer;
    }
    if (nearer < args.max_neighbors) {
      put_edge(f, out, e++, out.scratch_source[base + i], t, &out.scratch_image[3 * (base + i)]);
    }
  }
}

}  // namespace neighbor_detail

namespace cpu {

// counts[t] = target t's sources before max_neighbors. Returns the first atom with a coordinate
// that is not finite (nothing counted then), or -1.
int64_t radius_graph_count(const RadiusGraphArgs& args, int64_t* counts);
// The edges, where `out` says (offsets from the counts, capped at max_neighbors).
void radius_graph_write(const RadiusGraphArgs& args, const RadiusGraphOutput& out);

}  // namespace cpu

// The same on a CUDA device, one thread per target, queued on `stream`. count checks the
// positions on the device and waits for the stream to read the answer; that needs `workspace`,
// at least kNeighborCheckBytes of device memory.
namespace cuda {

constexpr size_t kNeighborCheckBytes = 8;

int64_t radius_graph_count(const RadiusGraphArgs& args, int64_t* counts, void* workspace,
                           void* stream);
void radius_graph_write(const RadiusGraphArgs& args, const RadiusGraphOutput& out, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
