/* The atoms calls on a distributed model, under mpirun: R ranks training on their own labelled
 * structures (rank r holds 1 + r % 2 of them, so the ranks' batches differ) end with the weights
 * one process gets from all the structures at once, and mpigrad_mean_loss is that process's
 * loss (with SGD, which a gradient off by a factor would change, unlike Adam); a bad array on one
 * rank fails the training step on every rank, with the message naming the array and the rank, and
 * training goes on after it; predicting is local. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "atoms_fixture.h"
#include "c_check.h"

#define POTENTIAL                                                                             \
  "[model]\nname = schnet\nhidden = 16\nn_rbf = 8\ninteractions = 2\n[graph]\ncutoff = 2.2\n" \
  "[loss]\nname = energy_force\nenergy_weight = 1\nforce_weight = 10\n"                       \
  "[optim]\nname = sgd\nlr = 0.02\nmomentum = 0.5\n[train]\nseed = 5\n"
#define MAX_RANKS 8
#define MAX_STRUCTURES (2 * MAX_RANKS)

static double x[MAX_STRUCTURES][ATOMS][3], f[MAX_STRUCTURES][ATOMS][3], e[MAX_STRUCTURES];
static double cells[MAX_STRUCTURES][3][3];
static int32_t z[MAX_STRUCTURES][ATOMS], pbcs[MAX_STRUCTURES][3];
static int32_t counts[MAX_STRUCTURES];

static int structures_of(int rank) {
  return 1 + rank % 2;
}

/* A training step on structures [first, first + count). */
static mpigrad_status train(mpigrad_model model, int first, int count, double* loss) {
  int64_t v_shape[2], n_shape[1], b_shape[1], cell_shape[3], pbc_shape[2], f_shape[2];
  mpigrad_array p, numbers, n, c, b, energy, forces;
  mpigrad_atoms atoms;
  v_shape[0] = f_shape[0] = n_shape[0] = (int64_t)count * ATOMS;
  v_shape[1] = f_shape[1] = 3;
  b_shape[0] = cell_shape[0] = pbc_shape[0] = count;
  cell_shape[1] = cell_shape[2] = pbc_shape[1] = 3;
  p = mpigrad_host_array(x[first], 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  numbers = mpigrad_host_array(z[first], 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  n = mpigrad_host_array(&counts[first], 1, b_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  c = mpigrad_host_array(cells[first], 3, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  b = mpigrad_host_array(pbcs[first], 2, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  energy = mpigrad_host_array(&e[first], 1, b_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  forces = mpigrad_host_array(f[first], 2, f_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  atoms = mpigrad_atoms_of(&p, &numbers);
  atoms.num_atoms = &n;
  atoms.cell = &c;
  atoms.pbc = &b;
  return mpigrad_atoms_train_step(model, &atoms, &energy, &forces, loss);
}

/* Energy and forces of structure `s`. */
static mpigrad_status predict(mpigrad_model model, int s, double* energy, double forces[ATOMS][3]) {
  int64_t v_shape[2] = {ATOMS, 3}, n_shape[1] = {ATOMS}, one[1] = {1}, cell_shape[2] = {3, 3},
          pbc_shape[1] = {3};
  mpigrad_array p = mpigrad_host_array(x[s], 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array numbers = mpigrad_host_array(z[s], 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array c = mpigrad_host_array(cells[s], 2, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array b = mpigrad_host_array(pbcs[s], 1, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array out_e = mpigrad_host_array(energy, 1, one, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array out_f = mpigrad_host_array(forces, 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_atoms atoms = mpigrad_atoms_of(&p, &numbers);
  atoms.cell = &c;
  atoms.pbc = &b;
  return mpigrad_atoms_predict(model, &atoms, &out_e, &out_f);
}

int main(int argc, char** argv) {
  int rank, size, q, s, total = 0, mine = 0, i, d, step;
  mpigrad_model distributed = {0}, alone = {0};
  double loss, alone_loss = 0, mean, e_d, e_a, worst = 0, largest = 0;
  static double f_d[ATOMS][3], f_a[ATOMS][3];
  char expected[64];
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > MAX_RANKS) {
    if (rank == 0) fprintf(stderr, "at most %d ranks\n", MAX_RANKS);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* The global batch, the same on every rank: rank q's structures, in rank order. */
  for (q = 0; q < size; ++q) {
    if (q == rank) mine = total;
    for (s = 0; s < structures_of(q); ++s, ++total) {
      atoms_box(20 + 3 * q + s, x[total], z[total], cells[total]);
      e[total] = atoms_lennard_jones(x[total], f[total]);
      counts[total] = ATOMS;
      pbcs[total][0] = pbcs[total][1] = pbcs[total][2] = 1;
    }
  }
  CHECK_STATUS(
      mpigrad_model_create_distributed(&distributed, POTENTIAL,
                                       (mpigrad_fortran_comm)MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
      MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_create(&alone, POTENTIAL, "cpu"), MPIGRAD_SUCCESS);

  for (step = 0; step < 3; ++step) {
    CHECK_STATUS(train(distributed, mine, structures_of(rank), &loss), MPIGRAD_SUCCESS);
    CHECK_STATUS(train(alone, 0, total, &alone_loss), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_mean_loss(distributed, &mean), MPIGRAD_SUCCESS);
    CHECK(fabs(mean - alone_loss) < 1e-5 * fabs(alone_loss));
    if (rank == 0)
      printf("step %d: loss over the ranks %.6f, one process %.6f\n", step, mean, alone_loss);
  }
  for (s = 0; s < total; ++s) {
    CHECK_STATUS(predict(distributed, s, &e_d, f_d), MPIGRAD_SUCCESS);
    CHECK_STATUS(predict(alone, s, &e_a, f_a), MPIGRAD_SUCCESS);
    CHECK(fabs(e_d - e_a) < 1e-5 * (1 + fabs(e_a)));
    for (i = 0; i < ATOMS; ++i) {
      for (d = 0; d < 3; ++d) {
        worst = fmax(worst, fabs(f_d[i][d] - f_a[i][d]));
        largest = fmax(largest, fabs(f_a[i][d]));
      }
    }
  }
  if (rank == 0) {
    printf("after 3 steps: forces of %d ranks and of one process differ by %.2e (largest %.2e)\n",
           size, worst, largest);
  }
  CHECK(worst < 1e-4 * (1 + largest));

  /* A bad atomic number on the last rank: every rank fails, naming it; then training goes on. */
  if (rank == size - 1) z[mine][2] = 120;
  CHECK_STATUS(train(distributed, mine, structures_of(rank), &loss),
               MPIGRAD_ERROR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("mpigrad_atoms_train_step: atomic_numbers[2] is 120");
  snprintf(expected, sizeof(expected), "(rank %d of %d)", size - 1, size);
  CHECK_ERROR_MENTIONS(expected);
  /* Predicting is local: only that rank fails. */
  CHECK_STATUS(predict(distributed, mine, &e_d, f_d),
               rank == size - 1 ? MPIGRAD_ERROR_INVALID_ARGUMENT : MPIGRAD_SUCCESS);
  if (rank == size - 1) CHECK_ERROR_MENTIONS(expected);
  z[mine][2] = 1; /* atoms_box gives even atoms hydrogen */
  CHECK_STATUS(train(distributed, mine, structures_of(rank), &loss), MPIGRAD_SUCCESS);

  CHECK_STATUS(mpigrad_model_destroy(&distributed), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&alone), MPIGRAD_SUCCESS);
  {
    int failures = c_check_failures, all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0) printf("c_api_atoms_mpi: %d failures over %d ranks\n", all, size);
    return c_check_exit_code("c_api_atoms_mpi") + (all > 0 && failures == 0);
  }
}
