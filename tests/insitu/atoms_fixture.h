/* Atomic structures for the atoms calls' C tests: periodic cubic boxes of atoms on a jittered
 * simple cubic lattice, their Lennard-Jones energies and forces (the labels to train on), and a
 * host's own neighbor list built by brute force with the minimum image. C99, no MPI. */
#ifndef MPIGRAD_TEST_ATOMS_FIXTURE_H
#define MPIGRAD_TEST_ATOMS_FIXTURE_H

#include <math.h>
#include <stdint.h>

#define ATOMS_SIDE 3
#define ATOMS (ATOMS_SIDE * ATOMS_SIDE * ATOMS_SIDE) /* 27 per box */
#define ATOMS_SPACING 1.6
#define ATOMS_BOX (ATOMS_SIDE * ATOMS_SPACING) /* 4.8 */
#define ATOMS_MAX_EDGES (ATOMS * ATOMS * 2)

/* The `seed`-th box: positions [ATOMS][3] (double), atomic numbers 1 and 8 alternating, its
 * cell (a cube of side ATOMS_BOX, rows the lattice vectors). */
static inline void atoms_box(int seed, double positions[ATOMS][3], int32_t numbers[ATOMS],
                             double cell[3][3]) {
  uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
  int i, d;
  for (i = 0; i < ATOMS; ++i) {
    const int site[3] = {i % ATOMS_SIDE, (i / ATOMS_SIDE) % ATOMS_SIDE,
                         i / (ATOMS_SIDE * ATOMS_SIDE)};
    for (d = 0; d < 3; ++d) {
      double jitter;
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      jitter = ((double)(state >> 11) / 9007199254740992.0 - 0.5) * 0.4;
      positions[i][d] = (site[d] + 0.5) * ATOMS_SPACING + jitter;
    }
    numbers[i] = (i % 2) ? 8 : 1;
  }
  for (i = 0; i < 3; ++i) {
    for (d = 0; d < 3; ++d) cell[i][d] = i == d ? ATOMS_BOX : 0.0;
  }
}

/* The minimum-image vector from atom s to atom t (t - s), and the shift it added. */
static inline void atoms_minimum_image(double positions[ATOMS][3], int s, int t, double vector[3],
                                       double shift[3]) {
  int d;
  for (d = 0; d < 3; ++d) {
    const double raw = positions[t][d] - positions[s][d];
    vector[d] = raw - ATOMS_BOX * floor(raw / ATOMS_BOX + 0.5);
    shift[d] = vector[d] - raw;
  }
}

/* Shifted-force Lennard-Jones (sigma 1, epsilon 1, cutoff 2.2): energy and forces. */
static inline double atoms_lennard_jones(double positions[ATOMS][3], double forces[ATOMS][3]) {
  const double rc = 2.2;
  const double inv_rc6 = 1.0 / pow(rc, 6.0);
  const double v_rc = 4.0 * (inv_rc6 * inv_rc6 - inv_rc6);
  const double dv_rc = (-48.0 * inv_rc6 * inv_rc6 + 24.0 * inv_rc6) / rc;
  double energy = 0, vector[3], shift[3];
  int s, t, d;
  for (s = 0; s < ATOMS; ++s) {
    for (d = 0; d < 3; ++d) forces[s][d] = 0;
  }
  for (s = 0; s < ATOMS; ++s) {
    for (t = s + 1; t < ATOMS; ++t) {
      double r2, r, inv6, dv;
      atoms_minimum_image(positions, s, t, vector, shift);
      r2 = vector[0] * vector[0] + vector[1] * vector[1] + vector[2] * vector[2];
      if (r2 >= rc * rc) continue;
      r = sqrt(r2);
      inv6 = 1.0 / (r2 * r2 * r2);
      energy += 4.0 * (inv6 * inv6 - inv6) - v_rc - (r - rc) * dv_rc;
      dv = (-48.0 * inv6 * inv6 + 24.0 * inv6) / r - dv_rc; /* dV/dr */
      for (d = 0; d < 3; ++d) {
        forces[t][d] -= dv * vector[d] / r;
        forces[s][d] += dv * vector[d] / r;
      }
    }
  }
  return energy;
}

/* The host's neighbor list: every ordered pair closer than `reach` (minimum image), edge_index
 * [2][E] numbered from `base`, shifts [E][3]. Returns E. */
static inline int64_t atoms_neighbor_list(double positions[ATOMS][3], double reach, int32_t base,
                                          int64_t edge_index[2][ATOMS_MAX_EDGES],
                                          double shifts[ATOMS_MAX_EDGES][3]) {
  int64_t edges = 0;
  double vector[3], shift[3];
  int s, t, d;
  for (t = 0; t < ATOMS; ++t) {
    for (s = 0; s < ATOMS; ++s) {
      if (s == t) continue;
      atoms_minimum_image(positions, s, t, vector, shift);
      if (vector[0] * vector[0] + vector[1] * vector[1] + vector[2] * vector[2] >= reach * reach) {
        continue;
      }
      edge_index[0][edges] = s + base;
      edge_index[1][edges] = t + base;
      for (d = 0; d < 3; ++d) shifts[edges][d] = shift[d];
      ++edges;
    }
  }
  return edges;
}

#endif
