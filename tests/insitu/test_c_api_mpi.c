/* The C API from an MPI host program (C99), under mpirun -np 2 and 4. The host owns MPI: it
 * initializes it, hands mpigrad communicators, and after destroying every model still uses
 * MPI_COMM_WORLD before it finalizes. Checks that R ranks stepping on R parts of a batch end
 * with the weights one process gets from the whole batch, on the world and on a
 * sub-communicator; that checkpoints are written once and restore training exactly; and that a
 * failure on one rank (a bad config, a missing file) is the same error on every rank, not a
 * hang; and an ONNX graph through the multi-array call (with tests/data/onnx as the second
 * argument). Arguments: a scratch directory shared by the ranks, [the ONNX data folder]. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "c_check.h"

#define GLOBAL 8 /* the global batch: divisible by 1, 2 and 4 ranks */
#define IN 4
#define OUT 3

static const char* kConfig =
    "[model]\nname = mlp\nhidden = 16\ninput_shape = 4\noutputs = 3\n"
    "[loss]\nname = mse\n[optim]\nname = adam\nlr = 0.01\n[train]\nseed = 11\n";

static void make_batch(int step, float x[GLOBAL][IN], float y[GLOBAL][OUT]) {
  int b, i, o;
  for (b = 0; b < GLOBAL; ++b) {
    for (i = 0; i < IN; ++i) x[b][i] = (float)cos(0.21 * (step * GLOBAL + b) + 0.7 * i);
    for (o = 0; o < OUT; ++o) y[b][o] = x[b][o] * x[b][o + 1] - 0.5f * x[b][(o + 2) % IN];
  }
}

/* Trains `model` for `steps` steps on samples [first, first + count) of each global batch. */
static void train(mpigrad_model model, int steps, int first, int count) {
  float x[GLOBAL][IN], y[GLOBAL][OUT];
  int64_t xs[2] = {0, IN}, ys[2] = {0, OUT};
  int step;
  xs[0] = ys[0] = count;
  for (step = 0; step < steps; ++step) {
    mpigrad_array input, label;
    make_batch(step, x, y);
    input = mpigrad_host_array(x[first], 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    label = mpigrad_host_array(y[first], 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(model, &input, &label, NULL), MPIGRAD_SUCCESS);
  }
}

/* The largest difference between two models' predictions on a probe batch. */
static double difference(mpigrad_model a, mpigrad_model b) {
  float x[GLOBAL][IN], y[GLOBAL][OUT], pa[GLOBAL][OUT], pb[GLOBAL][OUT];
  int64_t xs[2] = {GLOBAL, IN}, ys[2] = {GLOBAL, OUT};
  mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array oa = mpigrad_host_array(pa, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array ob = mpigrad_host_array(pb, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  double worst = 0;
  int s, o;
  make_batch(777, x, y);
  CHECK_STATUS(mpigrad_predict(a, &input, &oa), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_predict(b, &input, &ob), MPIGRAD_SUCCESS);
  for (s = 0; s < GLOBAL; ++s) {
    for (o = 0; o < OUT; ++o) {
      double d = fabs((double)pa[s][o] - (double)pb[s][o]);
      if (d > worst) worst = d;
    }
  }
  return worst;
}

/* An ONNX U-Net (tests/data/onnx) trained through the multi-array call on R parts of each
 * global batch ends where one process on the whole batch with the one-array call does. */
static void check_onnx_ranks(const char* data, int rank, int size) {
  static float x[GLOBAL][64], y[GLOBAL][64], pa[GLOBAL][64], pb[GLOBAL][64];
  char config[4096];
  mpigrad_model spread = {0}, whole = {0};
  int64_t part[4] = {GLOBAL / 4, 1, 8, 8}, all[4] = {GLOBAL, 1, 8, 8};
  double worst = 0;
  int step, s, i;
  part[0] = GLOBAL / size;
  snprintf(config, sizeof(config),
           "[model]\nname = onnx\nfile = %s/unet.legacy.onnx\n[loss]\nname = mse\n"
           "[optim]\nlr = 0.05\nmomentum = 0.9\n",
           data);
  CHECK_STATUS(
      mpigrad_model_create_distributed(&spread, config, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
      MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_create(&whole, config, "cpu"), MPIGRAD_SUCCESS);
  for (step = 0; step < 10; ++step) {
    mpigrad_array mine_x, mine_y, all_x, all_y;
    for (s = 0; s < GLOBAL; ++s) {
      for (i = 0; i < 64; ++i) {
        x[s][i] = (float)sin(0.13 * (step * GLOBAL * 64 + s * 64 + i));
        y[s][i] = 0.5f * x[s][i];
      }
    }
    mine_x = mpigrad_host_array(x[rank * (GLOBAL / size)], 4, part, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mine_y = mpigrad_host_array(y[rank * (GLOBAL / size)], 4, part, MPIGRAD_F32, MPIGRAD_ORDER_C);
    all_x = mpigrad_host_array(x, 4, all, MPIGRAD_F32, MPIGRAD_ORDER_C);
    all_y = mpigrad_host_array(y, 4, all, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step_multi(spread, 1, &mine_x, 1, &mine_y, NULL), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_train_step(whole, &all_x, &all_y, NULL), MPIGRAD_SUCCESS);
  }
  {
    mpigrad_array in = mpigrad_host_array(x, 4, all, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array oa = mpigrad_host_array(pa, 4, all, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array ob = mpigrad_host_array(pb, 4, all, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_predict_multi(spread, 1, &in, 1, &oa), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_predict(whole, &in, &ob), MPIGRAD_SUCCESS);
    for (s = 0; s < GLOBAL; ++s) {
      for (i = 0; i < 64; ++i) {
        const double d = fabs((double)pa[s][i] - (double)pb[s][i]);
        if (d > worst) worst = d;
      }
    }
  }
  CHECK(worst < 1e-5);
  CHECK_STATUS(mpigrad_model_destroy(&spread), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&whole), MPIGRAD_SUCCESS);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : ".";
  int rank, size, failures = 0, total = 0;
  char path[4096];
  MPI_Comm halves;
  mpigrad_model world = {0}, reference = {0}, half = {0}, resumed = {0}, broken = {0};
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  /* R ranks on R parts of each batch = one process on the whole batch. */
  CHECK_STATUS(
      mpigrad_model_create_distributed(&world, kConfig, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
      MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_create(&reference, kConfig, "cpu"), MPIGRAD_SUCCESS);
  train(world, 40, rank * (GLOBAL / size), GLOBAL / size);
  train(reference, 40, 0, GLOBAL);
  CHECK(difference(world, reference) < 1e-5);
  if (argc > 2) check_onnx_ranks(argv[2], rank, size);

  /* The same on a sub-communicator: the even and the odd ranks, each a data-parallel group. */
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &halves);
  {
    int group_rank, group_size;
    MPI_Comm_rank(halves, &group_rank);
    MPI_Comm_size(halves, &group_size);
    CHECK_STATUS(mpigrad_model_create_distributed(&half, kConfig, MPI_Comm_c2f(halves), NULL),
                 MPIGRAD_SUCCESS);
    train(half, 40, group_rank * (GLOBAL / group_size), GLOBAL / group_size);
    CHECK(difference(half, reference) < 1e-5);
  }

  /* A checkpoint: one file, written by rank 0; every rank resumes from it exactly. */
  snprintf(path, sizeof(path), "%s/distributed_checkpoint.h5", dir);
  CHECK_STATUS(mpigrad_save_checkpoint(world, path), MPIGRAD_SUCCESS);
  CHECK(access(path, R_OK) == 0);
  CHECK_STATUS(
      mpigrad_model_create_distributed(&resumed, kConfig, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
      MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_load_checkpoint(resumed, path), MPIGRAD_SUCCESS);
  {
    int64_t steps = 0;
    CHECK_STATUS(mpigrad_steps(resumed, &steps), MPIGRAD_SUCCESS);
    CHECK(steps == 40);
  }
  train(world, 5, rank * (GLOBAL / size), GLOBAL / size);
  train(resumed, 5, rank * (GLOBAL / size), GLOBAL / size);
  CHECK(difference(world, resumed) == 0.0);

  /* ZeRO-1 ([distributed] zero = 1): each rank steps its shard of Adam's state, and the weights
   * are still those of one process; its checkpoint (the full state, gathered) resumes a model
   * without ZeRO, which then trains as the ZeRO-1 one does. */
  {
    mpigrad_model sharded = {0}, plain = {0};
    char config[1024];
    snprintf(config, sizeof(config), "%s[distributed]\nzero = 1\n", kConfig);
    CHECK_STATUS(
        mpigrad_model_create_distributed(&sharded, config, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
        MPIGRAD_SUCCESS);
    train(sharded, 40, rank * (GLOBAL / size), GLOBAL / size);
    CHECK(difference(sharded, reference) < 1e-5);
    snprintf(path, sizeof(path), "%s/zero_checkpoint.h5", dir);
    CHECK_STATUS(mpigrad_save_checkpoint(sharded, path), MPIGRAD_SUCCESS);
    CHECK_STATUS(
        mpigrad_model_create_distributed(&plain, kConfig, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
        MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_load_checkpoint(plain, path), MPIGRAD_SUCCESS);
    train(sharded, 5, rank * (GLOBAL / size), GLOBAL / size);
    train(plain, 5, rank * (GLOBAL / size), GLOBAL / size);
    CHECK(difference(sharded, plain) < 1e-6);
    CHECK_STATUS(mpigrad_model_destroy(&sharded), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_model_destroy(&plain), MPIGRAD_SUCCESS);
  }

  /* ZeRO-1 with fp16 loss scaling: growth after every clean step drives the scale into fp16's
   * range limit within a few steps, so some steps overflow and are skipped; every rank skips the
   * same ones as plain DDP does, and the weights stay plain DDP + fp16's. A resumed model goes
   * on with the checkpoint's scale (from 2^16 it would skip other steps and drift apart). */
  {
    mpigrad_model sharded = {0}, plain = {0}, resumed_sharded = {0};
    char sharded_config[1100], plain_config[1024];
    snprintf(plain_config, sizeof(plain_config),
             "%sprecision = fp16\nloss_scale_growth_interval = 1\n", kConfig);
    snprintf(sharded_config, sizeof(sharded_config), "%s[distributed]\nzero = 1\n", plain_config);
    CHECK_STATUS(mpigrad_model_create_distributed(&sharded, sharded_config,
                                                  MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
                 MPIGRAD_SUCCESS);
    CHECK_STATUS(
        mpigrad_model_create_distributed(&plain, plain_config, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
        MPIGRAD_SUCCESS);
    train(sharded, 30, rank * (GLOBAL / size), GLOBAL / size);
    train(plain, 30, rank * (GLOBAL / size), GLOBAL / size);
    CHECK(difference(sharded, plain) < 1e-6);
    snprintf(path, sizeof(path), "%s/zero_fp16_checkpoint.h5", dir);
    CHECK_STATUS(mpigrad_save_checkpoint(sharded, path), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_model_create_distributed(&resumed_sharded, sharded_config,
                                                  MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
                 MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_load_checkpoint(resumed_sharded, path), MPIGRAD_SUCCESS);
    train(sharded, 10, rank * (GLOBAL / size), GLOBAL / size);
    train(resumed_sharded, 10, rank * (GLOBAL / size), GLOBAL / size);
    CHECK(difference(sharded, resumed_sharded) == 0.0);
    CHECK_STATUS(mpigrad_model_destroy(&sharded), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_model_destroy(&plain), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_model_destroy(&resumed_sharded), MPIGRAD_SUCCESS);
  }

  /* A failure on one rank is the same error on every rank. */
  snprintf(path, sizeof(path), "%s/missing_on_every_rank.h5", dir);
  CHECK_STATUS(mpigrad_load_checkpoint(world, path), MPIGRAD_ERROR_FILE);
  CHECK_ERROR_MENTIONS("failed on rank 0");
  CHECK_STATUS(mpigrad_model_create_distributed(
                   &broken, rank == size - 1 ? "[model]\nname = bogus\n" : kConfig,
                   MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("expected one of mlp | cnn | conv | resnet | onnx | schnet, got 'bogus'");
  CHECK(broken.id == 0);
  /* Models that differ between ranks are refused on every rank. */
  CHECK_STATUS(mpigrad_model_create_distributed(
                   &broken,
                   rank == 0 ? kConfig
                             : "[model]\nname = mlp\nhidden = 17\ninput_shape = 4\noutputs = 3\n"
                               "[loss]\nname = mse\n",
                   MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("differs between ranks");

  /* Gradient accumulation over ranks: two micro-steps on halves of each rank's part, averaged
   * over the ranks only at the second, give the weights of one step on the whole batch. */
  {
    mpigrad_model accumulated = {0}, single = {0};
    char config[1024];
    int part = GLOBAL / size;
    snprintf(config, sizeof(config), "%s[train]\ngrad_accum_steps = 2\n", kConfig);
    CHECK_STATUS(
        mpigrad_model_create_distributed(&accumulated, config, MPI_Comm_c2f(MPI_COMM_WORLD), "cpu"),
        MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_model_create(&single, kConfig, "cpu"), MPIGRAD_SUCCESS);
    if (part % 2 == 0) {
      int step;
      for (step = 0; step < 5; ++step) {
        float x[GLOBAL][IN], y[GLOBAL][OUT];
        int64_t xs[2] = {0, IN}, ys[2] = {0, OUT};
        int micro;
        make_batch(step, x, y);
        xs[0] = ys[0] = part / 2;
        for (micro = 0; micro < 2; ++micro) {
          int first = rank * part + micro * (part / 2);
          mpigrad_array input = mpigrad_host_array(x[first], 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
          mpigrad_array label = mpigrad_host_array(y[first], 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
          CHECK_STATUS(mpigrad_train_step(accumulated, &input, &label, NULL), MPIGRAD_SUCCESS);
        }
      }
      train(single, 5, 0, GLOBAL);
      CHECK(difference(accumulated, single) < 1e-5);
    }
    mpigrad_model_destroy(&accumulated);
    mpigrad_model_destroy(&single);
  }

  /* The mean loss over the ranks weights each rank's loss by its batch (rank r steps on r + 1
   * samples), so it is the loss of the whole global batch; mpigrad_last_loss is this rank's. */
  {
    float x[GLOBAL][IN], y[GLOBAL][OUT];
    int64_t xs[2] = {0, IN}, ys[2] = {0, OUT};
    double mine = 0, mean = 0, weighted[2], sums[2];
    mpigrad_array input, label;
    make_batch(3, x, y);
    xs[0] = ys[0] = rank % GLOBAL + 1;
    input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    label = mpigrad_host_array(y, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(world, &input, &label, &mine), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_mean_loss(world, &mean), MPIGRAD_SUCCESS);
    weighted[0] = mine * (double)xs[0];
    weighted[1] = (double)xs[0];
    MPI_Allreduce(weighted, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    CHECK(fabs(mean - sums[0] / sums[1]) <= 1e-12 * fabs(mean));
  }

  CHECK_STATUS(mpigrad_model_destroy(&world), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&reference), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&half), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&resumed), MPIGRAD_SUCCESS);
  MPI_Comm_free(&halves);

  /* The host's MPI still works after mpigrad is gone, and it finalizes it itself. */
  failures = c_check_exit_code("test_c_api_mpi");
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total > 100 ? 100 : total;
}
