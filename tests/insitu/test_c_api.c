/* The C API from C99, one process, without MPI: training, predicting, saving and loading, array
 * layouts (C and Fortran order, strides, dtypes), and every error path with its code and its
 * message. Argument: a scratch directory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "c_check.h"

#define BATCH 8
#define IN 4
#define OUT 3

static const char* kConfig =
    "[model]\nname = mlp\nhidden = 16\ninput_shape = 4\noutputs = 3\n"
    "[loss]\nname = mse\n[optim]\nname = sgd\nlr = 0.05\nmomentum = 0.9\n[train]\nseed = 7\n";

/* x[b][i] and the target y = W x of a fixed linear map W. */
static void make_batch(int step, float x[BATCH][IN], float y[BATCH][OUT]) {
  static const float w[OUT][IN] = {
      {0.5f, -1.f, 0.25f, 2.f}, {1.f, 0.f, -0.5f, 0.f}, {-0.25f, 0.75f, 1.f, -1.f}};
  int b, i, o;
  for (b = 0; b < BATCH; ++b) {
    for (i = 0; i < IN; ++i) x[b][i] = (float)sin(0.37 * (step * BATCH + b) + 1.3 * i);
    for (o = 0; o < OUT; ++o) {
      y[b][o] = 0.f;
      for (i = 0; i < IN; ++i) y[b][o] += w[o][i] * x[b][i];
    }
  }
}

static mpigrad_model create(const char* config) {
  mpigrad_model model = {0};
  CHECK_STATUS(mpigrad_model_create(&model, config, "cpu"), MPIGRAD_SUCCESS);
  return model;
}

static void test_training_and_layouts(const char* dir) {
  int64_t xs[2] = {BATCH, IN}, ys[2] = {BATCH, OUT};
  float x[BATCH][IN], y[BATCH][OUT], first = 0.f, last = 0.f;
  double loss = -1.0;
  int step;
  mpigrad_model model = create(kConfig);
  mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array label = mpigrad_host_array(y, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  int64_t steps = -1, copied = -1;
  CHECK(strlen(mpigrad_version()) > 0);
  for (step = 0; step < 300; ++step) {
    make_batch(step, x, y);
    CHECK_STATUS(mpigrad_train_step(model, &input, &label, step % 10 == 0 ? &loss : NULL),
                 MPIGRAD_SUCCESS);
    if (step == 0) first = (float)loss;
  }
  CHECK_STATUS(mpigrad_last_loss(model, &loss), MPIGRAD_SUCCESS);
  last = (float)loss;
  CHECK(isfinite(first) && isfinite(last));
  CHECK(last < 0.05f * first); /* learns the linear map */
  CHECK_STATUS(mpigrad_steps(model, &steps), MPIGRAD_SUCCESS);
  CHECK(steps == 300);
  /* float32, dense, on the host: nothing was copied. */
  CHECK_STATUS(mpigrad_copied_bytes(model, &copied), MPIGRAD_SUCCESS);
  CHECK(copied == 0);

  {
    /* The same samples in Fortran order (xf(i, b) = x[b][i]), in float64, and strided (every
     * other column of a wider buffer) all predict what the dense C array predicts. */
    float c_out[BATCH][OUT], f_out[OUT][BATCH], s_out[BATCH][OUT];
    double xf[BATCH][IN];
    float wide[BATCH][2 * IN];
    int64_t fshape[2] = {IN, BATCH}, fout[2] = {OUT, BATCH}, strides[2] = {2 * IN, 2};
    int b, i, o, same = 1;
    mpigrad_array c_pred = mpigrad_host_array(c_out, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array f_in = mpigrad_host_array(xf, 2, fshape, MPIGRAD_F64, MPIGRAD_ORDER_FORTRAN);
    mpigrad_array f_pred = mpigrad_host_array(f_out, 2, fout, MPIGRAD_F32, MPIGRAD_ORDER_FORTRAN);
    mpigrad_array strided = mpigrad_host_array(wide, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array s_pred = mpigrad_host_array(s_out, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    strided.strides = strides;
    make_batch(1000, x, y);
    for (b = 0; b < BATCH; ++b) {
      for (i = 0; i < IN; ++i) {
        ((double*)xf)[b * IN + i] = x[b][i]; /* column-major (IN, BATCH): element (i, b) */
        wide[b][2 * i] = x[b][i];
        wide[b][2 * i + 1] = 1e9f; /* never read */
      }
    }
    CHECK_STATUS(mpigrad_predict(model, &input, &c_pred), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_predict(model, &f_in, &f_pred), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_predict(model, &strided, &s_pred), MPIGRAD_SUCCESS);
    for (b = 0; b < BATCH; ++b) {
      for (o = 0; o < OUT; ++o) {
        same &= fabsf(c_out[b][o] - ((float*)f_out)[b * OUT + o]) < 1e-6f;
        same &= c_out[b][o] == s_out[b][o];
        same &= fabsf(c_out[b][o] - y[b][o]) < 0.3f;
      }
    }
    CHECK(same);
    CHECK_STATUS(mpigrad_copied_bytes(model, &copied), MPIGRAD_SUCCESS);
    CHECK(copied == (int64_t)(BATCH * IN * 4 + BATCH * IN * 4)); /* float64 -> 32, strides */
  }

  {
    /* save_model / load_model: a model of another seed predicts the same after loading. */
    char path[4096];
    float a[BATCH][OUT], b2[BATCH][OUT];
    mpigrad_array pa = mpigrad_host_array(a, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array pb = mpigrad_host_array(b2, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_model other;
    snprintf(path, sizeof(path), "%s/model.h5", dir);
    CHECK_STATUS(mpigrad_save_model(model, path), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_set_seed(99), MPIGRAD_SUCCESS);
    other = create(kConfig);
    CHECK_STATUS(mpigrad_predict(model, &input, &pa), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_predict(other, &input, &pb), MPIGRAD_SUCCESS);
    CHECK(memcmp(a, b2, sizeof(a)) != 0);
    CHECK_STATUS(mpigrad_load_model(other, path), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_predict(other, &input, &pb), MPIGRAD_SUCCESS);
    CHECK(memcmp(a, b2, sizeof(a)) == 0);
    CHECK_STATUS(mpigrad_model_destroy(&other), MPIGRAD_SUCCESS);
  }

  {
    /* A checkpoint restores the optimizer and the step: the next step is the same, bit for bit. */
    char path[4096];
    double loss_a = 0, loss_b = 1;
    int64_t restored = 0;
    mpigrad_model resumed;
    snprintf(path, sizeof(path), "%s/checkpoint.h5", dir);
    CHECK_STATUS(mpigrad_save_checkpoint(model, path), MPIGRAD_SUCCESS);
    resumed = create(kConfig);
    CHECK_STATUS(mpigrad_load_checkpoint(resumed, path), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_steps(resumed, &restored), MPIGRAD_SUCCESS);
    CHECK(restored == 300);
    make_batch(2000, x, y);
    CHECK_STATUS(mpigrad_train_step(model, &input, &label, &loss_a), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_train_step(resumed, &input, &label, &loss_b), MPIGRAD_SUCCESS);
    CHECK(loss_a == loss_b);
    CHECK_STATUS(mpigrad_train_step(model, &input, &label, &loss_a), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_train_step(resumed, &input, &label, &loss_b), MPIGRAD_SUCCESS);
    CHECK(loss_a == loss_b);
    CHECK_STATUS(mpigrad_model_destroy(&resumed), MPIGRAD_SUCCESS);
  }
  CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS);
  CHECK(model.id == 0);
}

static void test_seeds(void) {
  int64_t xs[2] = {BATCH, IN}, ys[2] = {BATCH, OUT};
  float x[BATCH][IN], y[BATCH][OUT], a[BATCH][OUT], b[BATCH][OUT], c[BATCH][OUT];
  mpigrad_model m1, m2, m3;
  mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array pa = mpigrad_host_array(a, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array pb = mpigrad_host_array(b, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array pc = mpigrad_host_array(c, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  make_batch(0, x, y);
  CHECK_STATUS(mpigrad_set_seed(5), MPIGRAD_SUCCESS);
  m1 = create(kConfig);
  m2 = create(kConfig);
  CHECK_STATUS(mpigrad_set_seed(6), MPIGRAD_SUCCESS);
  m3 = create(kConfig);
  CHECK_STATUS(mpigrad_predict(m1, &input, &pa), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_predict(m2, &input, &pb), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_predict(m3, &input, &pc), MPIGRAD_SUCCESS);
  CHECK(memcmp(a, b, sizeof(a)) == 0);
  CHECK(memcmp(a, c, sizeof(a)) != 0);
  mpigrad_model_destroy(&m1);
  mpigrad_model_destroy(&m2);
  mpigrad_model_destroy(&m3);
}

static void test_errors(const char* dir) {
  int64_t xs[2] = {BATCH, IN}, ys[2] = {BATCH, OUT}, wrong[2] = {BATCH, IN + 1};
  int64_t short_batch[2] = {BATCH - 1, OUT}, zero[2] = {BATCH, 0}, bad_strides[2] = {IN, 0};
  float x[BATCH][IN + 1], y[BATCH][OUT];
  int32_t classes[BATCH];
  char path[4096];
  mpigrad_model model, none = {0}, made_up = {123456789};
  mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array label = mpigrad_host_array(y, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array bad;
  double loss;
  memset(x, 0, sizeof(x));
  memset(y, 0, sizeof(y));
  memset(classes, 0, sizeof(classes));

  /* Creation: NULL pointers, a bad device, bad configs, a missing config file, no MPI. */
  CHECK_STATUS(mpigrad_model_create(NULL, kConfig, "cpu"), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_ERROR_MENTIONS("mpigrad_model_create: model is NULL");
  CHECK_STATUS(mpigrad_model_create(&model, NULL, "cpu"), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_ERROR_MENTIONS("config is NULL");
  CHECK_STATUS(mpigrad_model_create(&model, kConfig, NULL), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_STATUS(mpigrad_model_create(&model, kConfig, "tpu:0"), MPIGRAD_ERROR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("device 'tpu:0'");
  CHECK_STATUS(mpigrad_model_create(&model, "[model]\nname = transformer\n", "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS(
      "[model] name: expected one of mlp | cnn | conv | resnet | onnx | schnet, got 'transformer'");
  CHECK_STATUS(mpigrad_model_create(&model, "[model]\nname = mlp\noutputs = 3\n", "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("[model] input_shape is required");
  CHECK_STATUS(mpigrad_model_create(&model, "[data]\ntrain = a.h5\n", "cpu"), MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("data.train");
  CHECK_STATUS(mpigrad_model_create(&model, "no_such_config.ini", "cpu"), MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("no_such_config.ini");
  CHECK(model.id == 0);
  CHECK_STATUS(mpigrad_model_create_distributed(&model, kConfig, 0, "cpu"), MPIGRAD_ERROR_MPI);
  CHECK_ERROR_MENTIONS("MPI is not initialized");

  model = create(kConfig);
  /* Arrays: NULLs, ranks, orders, dtypes, extents, strides. */
  CHECK_STATUS(mpigrad_train_step(model, NULL, &label, &loss), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_ERROR_MENTIONS("mpigrad_train_step: input is NULL");
  bad = input;
  bad.data = NULL;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_ERROR_MENTIONS("input.data is NULL");
  bad = input;
  bad.rank = 0;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("input.rank is 0");
  bad.rank = 9;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_INVALID_ARGUMENT);
  bad = input;
  bad.order = (mpigrad_order)7;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_INVALID_ARGUMENT);
  bad = input;
  bad.memory = (mpigrad_memory)5;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_INVALID_ARGUMENT);
  bad = input;
  bad.dtype = (mpigrad_dtype)42;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_DTYPE);
  CHECK_ERROR_MENTIONS("unknown dtype 42");
  bad = input;
  bad.dtype = MPIGRAD_I32;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_DTYPE);
  CHECK_ERROR_MENTIONS("input: dtype int32");
  bad = mpigrad_host_array(x, 2, zero, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_SHAPE);
  bad = input;
  bad.strides = bad_strides;
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_INVALID_ARGUMENT);
  /* Shapes that do not fit the model. */
  bad = mpigrad_host_array(x, 2, wrong, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_train_step(model, &bad, &label, &loss), MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("holds 5 values per sample, but [model] input_shape [4] needs 4");
  bad = mpigrad_host_array(y, 2, short_batch, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_train_step(model, &input, &bad, &loss), MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("different batches (8 and 7 samples");
  bad = mpigrad_host_array(y, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_train_step(model, &input, &bad, &loss), MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("label: shape [8, 4] holds 4 values per sample, but the model outputs [3]");
  bad = mpigrad_host_array(classes, 1, xs, MPIGRAD_I32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_train_step(model, &input, &bad, &loss), MPIGRAD_ERROR_DTYPE);
  CHECK_ERROR_MENTIONS("mse labels must be float");
  bad = mpigrad_host_array(y, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_predict(model, &input, &bad), MPIGRAD_ERROR_SHAPE);
  CHECK_STATUS(mpigrad_predict(model, &input, NULL), MPIGRAD_ERROR_NULL_POINTER);
  CHECK_STATUS(mpigrad_last_loss(model, NULL), MPIGRAD_ERROR_NULL_POINTER);

  /* Files. */
  snprintf(path, sizeof(path), "%s/no/such/directory/model.h5", dir);
  CHECK_STATUS(mpigrad_save_model(model, path), MPIGRAD_ERROR_FILE);
  CHECK_ERROR_MENTIONS("no/such/directory");
  snprintf(path, sizeof(path), "%s/missing.h5", dir);
  CHECK_STATUS(mpigrad_load_model(model, path), MPIGRAD_ERROR_FILE);
  CHECK_ERROR_MENTIONS("missing.h5");
  CHECK_STATUS(mpigrad_load_checkpoint(model, path), MPIGRAD_ERROR_FILE);
  CHECK_STATUS(mpigrad_save_checkpoint(model, NULL), MPIGRAD_ERROR_NULL_POINTER);
  {
    /* A checkpoint of a differently shaped model is refused, naming the entry. */
    char other[4096];
    mpigrad_model wide = create(
        "[model]\nname = mlp\nhidden = 32\ninput_shape = 4\noutputs = 3\n[loss]\nname = mse\n");
    snprintf(other, sizeof(other), "%s/wide.h5", dir);
    CHECK_STATUS(mpigrad_save_model(wide, other), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_load_model(model, other), MPIGRAD_ERROR_FILE);
    CHECK_ERROR_MENTIONS("shape");
    mpigrad_model_destroy(&wide);
  }

  /* Handles: the zero handle, a made-up one, one used after destroy. */
  CHECK_STATUS(mpigrad_train_step(none, &input, &label, &loss), MPIGRAD_ERROR_INVALID_HANDLE);
  CHECK_ERROR_MENTIONS("zero handle");
  CHECK_STATUS(mpigrad_predict(made_up, &input, &label), MPIGRAD_ERROR_INVALID_HANDLE);
  CHECK_ERROR_MENTIONS("was never created");
  {
    mpigrad_model copy = model;
    CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_train_step(copy, &input, &label, &loss), MPIGRAD_ERROR_INVALID_HANDLE);
    CHECK_ERROR_MENTIONS("mpigrad_train_step: model handle");
    CHECK_ERROR_MENTIONS("was destroyed");
    CHECK_STATUS(mpigrad_model_destroy(&copy), MPIGRAD_ERROR_INVALID_HANDLE);
  }
  CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS); /* the zero handle: a no-op */
  CHECK_STATUS(mpigrad_model_destroy(NULL), MPIGRAD_ERROR_NULL_POINTER);
  CHECK(strcmp(mpigrad_status_name(MPIGRAD_ERROR_SHAPE), "MPIGRAD_ERROR_SHAPE") == 0);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : ".";
  test_training_and_layouts(dir);
  test_seeds();
  test_errors(dir);
  return c_check_exit_code("test_c_api");
}
