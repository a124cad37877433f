/* A C99 MPI host program that trains through the C API on the very batches `mpigrad train`
 * gives each rank, for same_step_check.sh: the two must end with bitwise-equal weights, since
 * both drive one Run and one TrainingStrategy (launch/config/run.h).
 *
 *   same_step_host write DATA.h5              rank 0 writes /x float32 [N, 8], /y int64 [N]
 *   same_step_host train CONFIG DATA.h5 OUT.h5 BATCH
 *
 * `train` reads the file with HDF5's C API, as a host code would, and feeds rank r the batches
 * of mpigrad train's distributed sampler without shuffling: sample r + k R is the rank's k-th,
 * BATCH of them per call, then writes mpigrad_save_checkpoint(OUT.h5). */
#include <hdf5.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"

#define SAMPLES 64
#define FEATURES 8
#define CLASSES 4

static int write_data(const char* path) {
  static float x[SAMPLES][FEATURES];
  static int64_t y[SAMPLES];
  hsize_t x_dims[2] = {SAMPLES, FEATURES}, y_dims[1] = {SAMPLES};
  hid_t file, space, set;
  int s, f;
  for (s = 0; s < SAMPLES; ++s) {
    for (f = 0; f < FEATURES; ++f) x[s][f] = (float)sin(0.37 * s + 1.3 * f) * (1.0f + 0.1f * f);
    /* Inputs past float16's range for some samples: fp16 training meets an overflow and skips. */
    if (s % 29 == 7) x[s][0] *= 1.0e5f; /* samples 7 and 36: the 1st and 3rd steps */
    y[s] = (s * 7 + s / 3) % CLASSES;
  }
  file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return 1;
  space = H5Screate_simple(2, x_dims, NULL);
  set = H5Dcreate2(file, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
  H5Dclose(set);
  H5Sclose(space);
  space = H5Screate_simple(1, y_dims, NULL);
  set = H5Dcreate2(file, "y", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
  H5Dclose(set);
  H5Sclose(space);
  return H5Fclose(file) < 0;
}

static int read_data(const char* path, float x[SAMPLES][FEATURES], int64_t y[SAMPLES]) {
  hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), set;
  herr_t failed = 0;
  if (file < 0) return 1;
  set = H5Dopen2(file, "x", H5P_DEFAULT);
  failed |= H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
  H5Dclose(set);
  set = H5Dopen2(file, "y", H5P_DEFAULT);
  failed |= H5Dread(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
  H5Dclose(set);
  H5Fclose(file);
  return failed < 0;
}

static int train(const char* config, const char* data, const char* out, int batch) {
  static float x[SAMPLES][FEATURES], bx[SAMPLES][FEATURES];
  static int64_t y[SAMPLES], by[SAMPLES];
  mpigrad_model model = {0};
  int rank, size, first, b, k;
  int64_t xs[2] = {0, FEATURES}, ys[1] = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (read_data(data, x, y) != 0) {
    fprintf(stderr, "same_step_host: cannot read %s\n", data);
    return 1;
  }
  CHECK_STATUS(
      mpigrad_model_create_distributed(&model, config, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
      MPIGRAD_SUCCESS);
  xs[0] = ys[0] = batch;
  /* The rank's shard, in order, a batch at a time (SAMPLES is a multiple of size * batch). */
  for (first = 0; first + batch <= SAMPLES / size; first += batch) {
    mpigrad_array input, label;
    for (b = 0; b < batch; ++b) {
      k = rank + (first + b) * size;
      memcpy(bx[b], x[k], sizeof(bx[b]));
      by[b] = y[k];
    }
    input = mpigrad_host_array(bx, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    label = mpigrad_host_array(by, 1, ys, MPIGRAD_I64, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(model, &input, &label, NULL), MPIGRAD_SUCCESS);
  }
  CHECK_STATUS(mpigrad_save_checkpoint(model, out), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS);
  return c_check_exit_code(rank == 0 ? "same_step_host" : "same_step_host (rank > 0)");
}

int main(int argc, char** argv) {
  int result = 2, rank = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc == 3 && strcmp(argv[1], "write") == 0) {
    result = rank == 0 ? write_data(argv[2]) : 0;
  } else if (argc == 6 && strcmp(argv[1], "train") == 0) {
    result = train(argv[2], argv[3], argv[4], atoi(argv[5]));
  } else {
    fprintf(stderr, "usage: same_step_host write DATA.h5 | train CONFIG DATA.h5 OUT.h5 BATCH\n");
  }
  MPI_Finalize();
  return result;
}
