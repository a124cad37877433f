/* Uses the installed C API from C99, as an outside MPI host program: run under mpiexec with any
 * number of ranks. A linear model learns y = 2x - 1 in one process; a data-parallel model on the
 * world and on a sub-communicator (even and odd ranks) ends with the weights one process gets
 * from the whole batch; the mean loss over the ranks; error paths that fail alike on every rank;
 * and the host's MPI still working after every model is destroyed. Exit code: failures. */
#include <math.h>
#include <mpi.h>
#include <mpigrad/mpigrad_c.h>
#include <stdio.h>
#include <string.h>

#define GLOBAL 8
static int failures = 0;

static void check(int ok, const char* what, int rank) {
  if (!ok) {
    ++failures;
    fprintf(stderr, "[rank %d] FAILED: %s (last error: %s)\n", rank, what, mpigrad_last_error());
  }
}

static const char* kConfig =
    "[model]\nname = mlp\nhidden = 8\ninput_shape = 2\noutputs = 1\n"
    "[loss]\nname = mse\n[optim]\nname = adam\nlr = 0.01\n[train]\nseed = 3\n";

/* Trains on samples [first, first + count) of each global batch of y = x0 * x1. */
static void train(mpigrad_model model, int first, int count, int rank) {
  float x[GLOBAL][2], y[GLOBAL][1];
  int64_t xs[2], ys[2];
  int step, b;
  xs[0] = ys[0] = count;
  xs[1] = 2;
  ys[1] = 1;
  for (step = 0; step < 20; ++step) {
    mpigrad_array input, label;
    for (b = 0; b < GLOBAL; ++b) {
      x[b][0] = (float)sin(0.3 * (step * GLOBAL + b));
      x[b][1] = (float)cos(0.7 * (step * GLOBAL + b));
      y[b][0] = x[b][0] * x[b][1];
    }
    input = mpigrad_host_array(x[first], 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    label = mpigrad_host_array(y[first], 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    check(mpigrad_train_step(model, &input, &label, NULL) == MPIGRAD_SUCCESS, "train", rank);
  }
}

static float predict_one(mpigrad_model model, int rank) {
  float x[1][2] = {{0.25f, -0.5f}}, y[1][1] = {{0.f}};
  int64_t xs[2] = {1, 2}, ys[2] = {1, 1};
  mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array output = mpigrad_host_array(y, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  check(mpigrad_predict(model, &input, &output) == MPIGRAD_SUCCESS, "predict", rank);
  return y[0][0];
}

static int linear_fit(void) {
  float x[16], y[16];
  int64_t shape[2] = {16, 1};
  double first = 0, loss = 0;
  int i, step;
  mpigrad_model model;
  mpigrad_array input, label;
  if (mpigrad_model_create(&model,
                           "[model]\nname = mlp\nhidden =\ninput_shape = 1\noutputs = 1\n"
                           "[loss]\nname = mse\n[optim]\nname = sgd\nlr = 0.1\nmomentum = 0\n",
                           "cpu") != MPIGRAD_SUCCESS) {
    fprintf(stderr, "%s\n", mpigrad_last_error());
    return 1;
  }
  for (i = 0; i < 16; ++i) {
    x[i] = (float)i / 16.0f;
    y[i] = 2.0f * x[i] - 1.0f;
  }
  input = mpigrad_host_array(x, 2, shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  label = mpigrad_host_array(y, 2, shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  for (step = 0; step < 1000; ++step) {
    if (mpigrad_train_step(model, &input, &label, &loss) != MPIGRAD_SUCCESS) {
      fprintf(stderr, "%s\n", mpigrad_last_error());
      return 1;
    }
    if (step == 0) first = loss;
  }
  printf("mpigrad %s from C: loss %.3g -> %.3g\n", mpigrad_version(), first, loss);
  mpigrad_model_destroy(&model);
  return loss < 1e-3 * first ? 0 : 1;
}

int main(int argc, char** argv) {
  int rank, size, group_rank, group_size, total = 0;
  mpigrad_model world = {0}, reference = {0}, half = {0}, broken = {0};
  MPI_Comm halves;
  double mine = 0, mean = 0, sum = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  failures += linear_fit();

  check(mpigrad_model_create_distributed(&world, kConfig, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu") ==
            MPIGRAD_SUCCESS,
        "create on the world", rank);
  check(mpigrad_model_create(&reference, kConfig, "cpu") == MPIGRAD_SUCCESS, "create", rank);
  train(world, rank * (GLOBAL / size), GLOBAL / size, rank);
  train(reference, 0, GLOBAL, rank);
  check(fabsf(predict_one(world, rank) - predict_one(reference, rank)) < 1e-5f,
        "R ranks on R parts of a batch = one process on all of it", rank);
  /* The loss over the ranks: this rank's, averaged by the host, is mpigrad's mean. */
  check(mpigrad_last_loss(world, &mine) == MPIGRAD_SUCCESS, "last_loss", rank);
  check(mpigrad_mean_loss(world, &mean) == MPIGRAD_SUCCESS, "mean_loss", rank);
  MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  check(fabs(mean - sum / size) < 1e-6 * fabs(mean) + 1e-12, "the mean loss over the ranks", rank);

  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &halves);
  MPI_Comm_rank(halves, &group_rank);
  MPI_Comm_size(halves, &group_size);
  check(mpigrad_model_create_distributed(&half, kConfig, MPI_Comm_c2f(halves), NULL) ==
            MPIGRAD_SUCCESS,
        "create on a sub-communicator", rank);
  train(half, group_rank * (GLOBAL / group_size), GLOBAL / group_size, rank);
  check(fabsf(predict_one(half, rank) - predict_one(reference, rank)) < 1e-5f,
        "the same on a sub-communicator", rank);

  /* Error paths: the same error on every rank, never a hang. */
  check(mpigrad_model_create_distributed(&broken, rank == size - 1 ? "[model]\nname = x" : kConfig,
                                         MPI_Comm_c2f(MPI_COMM_WORLD),
                                         "cpu") == MPIGRAD_ERROR_CONFIG &&
            broken.id == 0,
        "a bad config on one rank", rank);
  check(mpigrad_load_checkpoint(world, "no_such_checkpoint.h5") == MPIGRAD_ERROR_FILE,
        "a missing checkpoint", rank);
  {
    float x[4][2];
    float y[4][2];
    int64_t xs[2] = {2, 4}, ys[2] = {4, 2};
    mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_FORTRAN);
    mpigrad_array label = mpigrad_host_array(y, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    memset(x, 0, sizeof(x));
    memset(y, 0, sizeof(y));
    check(mpigrad_train_step(reference, &input, &label, NULL) == MPIGRAD_ERROR_SHAPE,
          "a label of two values per sample", rank);
    check(strstr(mpigrad_last_error(), "expected [4, 1]") != NULL, "the expected shape", rank);
  }

  check(mpigrad_model_destroy(&world) == MPIGRAD_SUCCESS, "destroy", rank);
  check(mpigrad_model_destroy(&half) == MPIGRAD_SUCCESS, "destroy", rank);
  check(mpigrad_model_destroy(&reference) == MPIGRAD_SUCCESS, "destroy", rank);
  MPI_Comm_free(&halves);
  /* The host's MPI works after mpigrad is gone; the host finalizes it. */
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("consumer_c on %d ranks: %d failed\n", size, total);
  MPI_Finalize();
  return total > 100 ? 100 : total;
}
