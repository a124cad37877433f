/* The atoms calls of the C API (interatomic potentials), one process, no MPI: forces are minus a
 * finite difference of the energy; the host's own neighbor list (with a skin, numbered from 0 or
 * from 1) gives our radius graph's result; float32 and float64 positions, a batch of two
 * structures and Fortran order agree; training steps on Lennard-Jones labels reduce the loss;
 * a checkpoint restores the trained potential; wrong inputs give the right code and a message
 * naming the array. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "atoms_fixture.h"
#include "c_check.h"

#define POTENTIAL_WITH(LOSS)                                                                  \
  "[model]\nname = schnet\nhidden = 16\nn_rbf = 8\ninteractions = 2\n[graph]\ncutoff = 2.2\n" \
  "[loss]\nname = energy_force\nenergy_weight = 1\nforce_weight = 10\n" LOSS                  \
  "[optim]\nname = adamw\nlr = 0.005\nweight_decay = 0\n[train]\nseed = 3\n"
#define POTENTIAL POTENTIAL_WITH("")

static double positions[ATOMS][3], cell[3][3];
static int32_t numbers[ATOMS];
static const int32_t periodic[3] = {1, 1, 1};

static int64_t v_shape[2] = {ATOMS, 3}, n_shape[1] = {ATOMS}, cell_shape[2] = {3, 3},
               pbc_shape[1] = {3}, one[1] = {1};

/* One periodic structure of `x` ([ATOMS][3] doubles) into `energy` and `forces`. */
static mpigrad_status predict(mpigrad_model model, double x[ATOMS][3], double* energy,
                              double forces[ATOMS][3], const mpigrad_array* edge_index,
                              const mpigrad_array* edge_shifts, int32_t base) {
  mpigrad_array p = mpigrad_host_array((void*)x, 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array z = mpigrad_host_array(numbers, 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array c = mpigrad_host_array(cell, 2, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array b = mpigrad_host_array((void*)periodic, 1, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array e = mpigrad_host_array(energy, 1, one, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array f = mpigrad_host_array(forces, 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_atoms atoms = mpigrad_atoms_of(&p, &z);
  atoms.cell = &c;
  atoms.pbc = &b;
  atoms.edge_index = edge_index;
  atoms.edge_shifts = edge_shifts;
  atoms.index_base = base;
  return mpigrad_atoms_predict(model, &atoms, &e, forces ? &f : NULL);
}

static double largest_difference(double a[ATOMS][3], double b[ATOMS][3]) {
  double worst = 0;
  int i, d;
  for (i = 0; i < ATOMS; ++i) {
    for (d = 0; d < 3; ++d) worst = fmax(worst, fabs(a[i][d] - b[i][d]));
  }
  return worst;
}

static double largest_force(double f[ATOMS][3]) {
  static double zero[ATOMS][3];
  return largest_difference(f, zero);
}

static void test_forces_are_minus_the_energy_gradient(mpigrad_model model) {
  static double forces[ATOMS][3], unused[ATOMS][3], moved[ATOMS][3];
  const double h = 1e-2;
  double energy, plus, minus, worst = 0;
  int i, d;
  CHECK_STATUS(predict(model, positions, &energy, forces, NULL, NULL, 0), MPIGRAD_SUCCESS);
  CHECK(isfinite(energy) && largest_force(forces) > 1e-3);
  for (i = 0; i < ATOMS; i += 5) {
    for (d = 0; d < 3; ++d) {
      memcpy(moved, positions, sizeof(moved));
      moved[i][d] += h;
      CHECK_STATUS(predict(model, moved, &plus, unused, NULL, NULL, 0), MPIGRAD_SUCCESS);
      moved[i][d] -= 2 * h;
      CHECK_STATUS(predict(model, moved, &minus, NULL, NULL, NULL, 0), MPIGRAD_SUCCESS);
      worst = fmax(worst, fabs(-(plus - minus) / (2 * h) - forces[i][d]));
    }
  }
  /* Central differences of a float32 energy: the rounding (~1e-6 of |E|, over 2h) dominates. */
  printf("forces vs -dE/dx by central differences: largest difference %.2e (largest force %.2e)\n",
         worst, largest_force(forces));
  CHECK(worst < 5e-5 + 1e-2 * largest_force(forces));
}

static void test_host_neighbor_list(mpigrad_model model) {
  static int64_t edge_index[2][ATOMS_MAX_EDGES];
  static double shifts[ATOMS_MAX_EDGES][3], ours[ATOMS][3], theirs[ATOMS][3];
  static const int64_t row_strides[2] = {ATOMS_MAX_EDGES, 1};
  double energy_ours, energy_theirs;
  int32_t base;
  CHECK_STATUS(predict(model, positions, &energy_ours, ours, NULL, NULL, 0), MPIGRAD_SUCCESS);
  for (base = 0; base <= 1; ++base) {
    /* A Verlet list: every pair within the cutoff plus a skin of 0.15. */
    const int64_t edges = atoms_neighbor_list(positions, 2.35, base, edge_index, shifts);
    int64_t index_shape[2], shift_shape[2];
    mpigrad_array index, shift;
    index_shape[0] = 2;
    index_shape[1] = edges;
    shift_shape[0] = edges;
    shift_shape[1] = 3;
    index = mpigrad_host_array(edge_index, 2, index_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
    index.strides = row_strides; /* the rows of edge_index[2][ATOMS_MAX_EDGES] */
    shift = mpigrad_host_array(shifts, 2, shift_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
    CHECK_STATUS(predict(model, positions, &energy_theirs, theirs, &index, &shift, base),
                 MPIGRAD_SUCCESS);
    printf("host's list (base %d, %lld edges): energy %.7f vs ours %.7f, forces differ by %.2e\n",
           (int)base, (long long)edges, energy_theirs, energy_ours,
           largest_difference(ours, theirs));
    CHECK(fabs(energy_theirs - energy_ours) < 1e-5 * (1 + fabs(energy_ours)));
    CHECK(largest_difference(ours, theirs) < 1e-5 * (1 + largest_force(ours)));
  }
  {
    /* The same list without its shifts is another structure: an edge across the boundary is
     * then as long as the box is wide, beyond the cutoff, so the energy changes. */
    const int64_t edges = atoms_neighbor_list(positions, 2.35, 0, edge_index, shifts);
    int64_t index_shape[2];
    mpigrad_array index;
    index_shape[0] = 2;
    index_shape[1] = edges;
    index = mpigrad_host_array(edge_index, 2, index_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
    index.strides = row_strides;
    CHECK_STATUS(predict(model, positions, &energy_theirs, theirs, &index, NULL, 0),
                 MPIGRAD_SUCCESS);
    CHECK(fabs(energy_theirs - energy_ours) > 1e-3);
  }
}

/* float32 positions, Fortran order ((3, V) arrays) and a batch of two structures. */
static void test_layouts_agree(mpigrad_model model) {
  static float single[ATOMS][3];
  static double forces[ATOMS][3], other_forces[ATOMS][3], both_x[2 * ATOMS][3],
      both_f[2 * ATOMS][3], fortran_f[ATOMS][3];
  static double second[ATOMS][3], second_cell[3][3];
  static int32_t second_numbers[ATOMS], both_z[2 * ATOMS];
  static double cells[2][3][3];
  static int32_t pbcs[2][3] = {{1, 1, 1}, {1, 1, 1}};
  double energy, energy2, both_e[2], fortran_e;
  int64_t both_v[2] = {2 * ATOMS, 3}, both_n[1] = {2 * ATOMS}, two[1] = {2},
          cells_shape[3] = {2, 3, 3}, pbcs_shape[2] = {2, 3}, fortran_v[2] = {3, ATOMS};
  int32_t counts[2] = {ATOMS, ATOMS};
  int i, d;
  CHECK_STATUS(predict(model, positions, &energy, forces, NULL, NULL, 0), MPIGRAD_SUCCESS);
  for (i = 0; i < ATOMS; ++i) {
    for (d = 0; d < 3; ++d) single[i][d] = (float)positions[i][d];
  }
  {
    mpigrad_array p = mpigrad_host_array(single, 2, v_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array z = mpigrad_host_array(numbers, 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
    mpigrad_array c = mpigrad_host_array(cell, 2, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_array b =
        mpigrad_host_array((void*)periodic, 1, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
    mpigrad_array e = mpigrad_host_array(&energy2, 1, one, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_array f = mpigrad_host_array(other_forces, 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_atoms atoms = mpigrad_atoms_of(&p, &z);
    atoms.cell = &c;
    atoms.pbc = &b;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_SUCCESS);
    CHECK(energy2 == energy && largest_difference(forces, other_forces) == 0);
    /* Fortran order: positions(3, V) is the same memory. */
    p = mpigrad_host_array(positions, 2, fortran_v, MPIGRAD_F64, MPIGRAD_ORDER_FORTRAN);
    f = mpigrad_host_array(fortran_f, 2, fortran_v, MPIGRAD_F64, MPIGRAD_ORDER_FORTRAN);
    e = mpigrad_host_array(&fortran_e, 1, one, MPIGRAD_F64, MPIGRAD_ORDER_FORTRAN);
    atoms.positions = &p;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_SUCCESS);
    CHECK(fortran_e == energy && largest_difference(forces, fortran_f) == 0);
  }
  /* Two structures in one batch: each gets what it gets alone. */
  atoms_box(7, second, second_numbers, second_cell);
  memcpy(both_x, positions, sizeof(positions));
  memcpy(both_x[ATOMS], second, sizeof(second));
  memcpy(both_z, numbers, sizeof(numbers));
  memcpy(both_z + ATOMS, second_numbers, sizeof(second_numbers));
  memcpy(cells[0], cell, sizeof(cell));
  memcpy(cells[1], second_cell, sizeof(second_cell));
  {
    mpigrad_array p = mpigrad_host_array(both_x, 2, both_v, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_array z = mpigrad_host_array(both_z, 1, both_n, MPIGRAD_I32, MPIGRAD_ORDER_C);
    mpigrad_array n = mpigrad_host_array(counts, 1, two, MPIGRAD_I32, MPIGRAD_ORDER_C);
    mpigrad_array c = mpigrad_host_array(cells, 3, cells_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_array b = mpigrad_host_array(pbcs, 2, pbcs_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
    mpigrad_array e = mpigrad_host_array(both_e, 1, two, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_array f = mpigrad_host_array(both_f, 2, both_v, MPIGRAD_F64, MPIGRAD_ORDER_C);
    mpigrad_atoms atoms = mpigrad_atoms_of(&p, &z);
    double second_energy;
    static double second_forces[ATOMS][3];
    atoms.num_atoms = &n;
    atoms.cell = &c;
    atoms.pbc = &b;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_SUCCESS);
    CHECK(fabs(both_e[0] - energy) < 1e-5 * (1 + fabs(energy)));
    CHECK(largest_difference(forces, both_f) < 1e-5);
    /* The second structure alone, with its own numbers. */
    {
      int32_t saved[ATOMS];
      memcpy(saved, numbers, sizeof(saved));
      memcpy(numbers, second_numbers, sizeof(saved));
      CHECK_STATUS(predict(model, second, &second_energy, second_forces, NULL, NULL, 0),
                   MPIGRAD_SUCCESS);
      memcpy(numbers, saved, sizeof(saved));
    }
    CHECK(fabs(both_e[1] - second_energy) < 1e-5 * (1 + fabs(second_energy)));
    CHECK(largest_difference(second_forces, (double(*)[3])(both_f + ATOMS)) < 1e-5);
  }
}

/* Labelled Lennard-Jones frames: the loss of a fixed set falls as the model trains on it. */
static void test_training_reduces_the_loss(mpigrad_model model) {
  enum { FRAMES = 4, STEPS = 60 };
  static double x[FRAMES][ATOMS][3], f[FRAMES][ATOMS][3], frame_cell[3][3];
  static int32_t z[ATOMS];
  double e[FRAMES], first = 0, last = 0, loss;
  int64_t steps = 0;
  int frame, step;
  for (frame = 0; frame < FRAMES; ++frame) {
    atoms_box(10 + frame, x[frame], z, frame_cell);
    e[frame] = atoms_lennard_jones(x[frame], f[frame]);
  }
  for (step = 0; step < STEPS; ++step) {
    frame = step % FRAMES;
    {
      mpigrad_array p = mpigrad_host_array(x[frame], 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
      mpigrad_array zz = mpigrad_host_array(z, 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
      mpigrad_array c = mpigrad_host_array(frame_cell, 2, cell_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
      mpigrad_array b =
          mpigrad_host_array((void*)periodic, 1, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
      mpigrad_array energy = mpigrad_host_array(&e[frame], 1, one, MPIGRAD_F64, MPIGRAD_ORDER_C);
      mpigrad_array forces = mpigrad_host_array(f[frame], 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
      mpigrad_atoms atoms = mpigrad_atoms_of(&p, &zz);
      atoms.cell = &c;
      atoms.pbc = &b;
      CHECK_STATUS(mpigrad_atoms_train_step(model, &atoms, &energy, &forces, &loss),
                   MPIGRAD_SUCCESS);
    }
    if (step < FRAMES) first += loss / FRAMES;
    if (step >= STEPS - FRAMES) last += loss / FRAMES;
  }
  CHECK_STATUS(mpigrad_steps(model, &steps), MPIGRAD_SUCCESS);
  CHECK(steps == STEPS);
  {
    double mean;
    CHECK_STATUS(mpigrad_mean_loss(model, &mean), MPIGRAD_SUCCESS);
    CHECK(mean == loss); /* one process: the mean is this rank's */
  }
  printf(
      "training on %d Lennard-Jones frames: loss %.4f over the first %d steps, %.4f over the "
      "last %d\n",
      FRAMES, first, FRAMES, last, FRAMES);
  CHECK(isfinite(last) && last < 0.5 * first);
}

static void test_errors(mpigrad_model model) {
  static double forces[ATOMS][3];
  double energy, two_energies[2];
  int64_t bad_v[2] = {ATOMS, 2}, two[1] = {2}, index_shape[2] = {2, 1};
  int64_t bad_edge[2][1] = {{0}, {ATOMS}};
  float float_numbers[ATOMS];
  mpigrad_array p = mpigrad_host_array(positions, 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array z = mpigrad_host_array(numbers, 1, n_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
  mpigrad_array e = mpigrad_host_array(&energy, 1, one, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_array f = mpigrad_host_array(forces, 2, v_shape, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_atoms atoms = mpigrad_atoms_of(&p, &z);
  mpigrad_array bad = mpigrad_host_array(positions, 2, bad_v, MPIGRAD_F64, MPIGRAD_ORDER_C);
  mpigrad_model mlp = {0};
  int i;

  atoms.positions = &bad;
  CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("mpigrad_atoms_predict: positions: shape [27, 2]");
  CHECK_STATUS(mpigrad_atoms_train_step(model, &atoms, &e, &f, NULL), MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("mpigrad_atoms_train_step: positions");
  atoms.positions = &p;

  numbers[3] = 120;
  CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("atomic_numbers[3] is 120");
  CHECK_ERROR_MENTIONS("1 to 100");
  numbers[3] = 0;
  CHECK_STATUS(mpigrad_atoms_train_step(model, &atoms, &e, &f, NULL),
               MPIGRAD_ERROR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("atomic_numbers[3] is 0");
  numbers[3] = 8;

  for (i = 0; i < ATOMS; ++i) float_numbers[i] = (float)numbers[i];
  {
    mpigrad_array fz = mpigrad_host_array(float_numbers, 1, n_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
    atoms.atomic_numbers = &fz;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_DTYPE);
    CHECK_ERROR_MENTIONS("atomic_numbers: dtype");
    atoms.atomic_numbers = &z;
  }
  {
    mpigrad_array e2 = mpigrad_host_array(two_energies, 1, two, MPIGRAD_F64, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e2, &f), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("energy: shape [2]");
    /* A training label of the wrong shape. */
    CHECK_STATUS(mpigrad_atoms_train_step(model, &atoms, &e, &bad, NULL), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("forces: shape [27, 2]");
  }
  {
    mpigrad_array index =
        mpigrad_host_array(bad_edge, 2, index_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
    atoms.edge_index = &index;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("edge_index: edge 0's target is atom 27, outside 0 .. 26");
    atoms.index_base = 1;
    bad_edge[1][0] = 1;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("source is atom 0, outside 1 .. 27");
    atoms.index_base = 2;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("index_base is 2");
    atoms.index_base = 0;
    atoms.edge_index = NULL;
  }
  {
    mpigrad_array b =
        mpigrad_host_array((void*)periodic, 1, pbc_shape, MPIGRAD_I32, MPIGRAD_ORDER_C);
    atoms.pbc = &b;
    CHECK_STATUS(mpigrad_atoms_predict(model, &atoms, &e, &f), MPIGRAD_ERROR_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("pbc: an axis is periodic, but no cell was given");
    atoms.pbc = NULL;
  }
  CHECK_STATUS(mpigrad_atoms_predict(model, NULL, &e, &f), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_ERROR_MENTIONS("atoms is NULL");

  /* The sample calls refuse a potential, and the atoms calls any other model. */
  CHECK_STATUS(mpigrad_predict(model, &p, &f), MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("interatomic potential");
  CHECK_STATUS(mpigrad_model_create(&mlp,
                                    "[model]\nname = mlp\ninput_shape = 3\noutputs = 1\n"
                                    "[loss]\nname = mse\n",
                                    "cpu"),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_atoms_predict(mlp, &atoms, &e, &f), MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("energy_force");
  CHECK_STATUS(mpigrad_atoms_train_step(mlp, &atoms, &e, &f, NULL), MPIGRAD_ERROR_CONFIG);
  CHECK_STATUS(mpigrad_model_destroy(&mlp), MPIGRAD_SUCCESS);
  /* Configs a potential cannot take. */
  CHECK_STATUS(mpigrad_model_create(&mlp, POTENTIAL_WITH("stress_weight = 1\n"), "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("stress_weight");
  CHECK_STATUS(mpigrad_model_create(&mlp,
                                    "[model]\nname = mlp\ninput_shape = 3\noutputs = 1\n"
                                    "[loss]\nname = energy_force\n",
                                    "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("not an interatomic potential");
}

/* A checkpoint of the trained potential, loaded into a fresh one, gives its energies and forces. */
static void test_checkpoint(mpigrad_model model) {
  static double forces[ATOMS][3], loaded_forces[ATOMS][3];
  double energy, loaded_energy;
  mpigrad_model fresh = {0};
  int64_t steps = 0;
  CHECK_STATUS(mpigrad_save_checkpoint(model, "c_api_atoms.h5"), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_create(&fresh, POTENTIAL_WITH("") /* same seed */, "cpu"),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(predict(model, positions, &energy, forces, NULL, NULL, 0), MPIGRAD_SUCCESS);
  CHECK_STATUS(predict(fresh, positions, &loaded_energy, loaded_forces, NULL, NULL, 0),
               MPIGRAD_SUCCESS);
  CHECK(loaded_energy != energy); /* trained and untrained differ */
  CHECK_STATUS(mpigrad_load_checkpoint(fresh, "c_api_atoms.h5"), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_steps(fresh, &steps), MPIGRAD_SUCCESS);
  CHECK(steps == 60);
  CHECK_STATUS(predict(fresh, positions, &loaded_energy, loaded_forces, NULL, NULL, 0),
               MPIGRAD_SUCCESS);
  CHECK(loaded_energy == energy && largest_difference(forces, loaded_forces) == 0);
  CHECK_STATUS(mpigrad_model_destroy(&fresh), MPIGRAD_SUCCESS);
  remove("c_api_atoms.h5");
}

int main(void) {
  mpigrad_model model = {0};
  atoms_box(0, positions, numbers, cell);
  CHECK_STATUS(mpigrad_model_create(&model, POTENTIAL, "cpu"), MPIGRAD_SUCCESS);
  test_forces_are_minus_the_energy_gradient(model);
  test_host_neighbor_list(model);
  test_layouts_agree(model);
  test_errors(model);
  test_training_reduces_the_loss(model);
  test_forces_are_minus_the_energy_gradient(model); /* again, on the trained model's forces */
  test_checkpoint(model);
  CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS);
  return c_check_exit_code("c_api_atoms");
}
