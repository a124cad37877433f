/* ONNX models through the C API (issue 23): [model] name = onnx in mpigrad_model_create, the
 * graph's shapes and dtypes (int64 token ids, dense cross_entropy labels [batch, T], a U-Net's
 * mse), the multi-array calls against the one-array ones, and their errors in C and Fortran
 * order. The models are the parity test's (tests/data/onnx). One process, no MPI.
 *   mpigrad-test-c-api-onnx DATA_DIR */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "c_check.h"

#define B 8
#define T 6
#define V 11

static char transformer[4096], unet[4096];

static int64_t tokens[B * T], next_tokens[B * T];
static float field[B * 64], target[B * 64], logits[B * V * T], prediction[B * V * T];

static mpigrad_model create(const char* config) {
  mpigrad_model model = {0};
  CHECK_STATUS(mpigrad_model_create(&model, config, "cpu"), MPIGRAD_SUCCESS);
  return model;
}

/* Tokens and their successors under the permutation the parity data uses: learnable. */
static void fill_batches(void) {
  int i;
  srand(7);
  for (i = 0; i < B * T; ++i) {
    tokens[i] = rand() % V;
    next_tokens[i] = (tokens[i] * 3 + 1) % V;
  }
  for (i = 0; i < B * 64; ++i) {
    field[i] = (float)(rand() % 1000) / 500.0f - 1.0f;
    target[i] = 0.5f * field[i];
  }
}

static void test_token_model(void) {
  const int64_t ids_shape[2] = {B, T}, logits_shape[3] = {B, V, T};
  mpigrad_model model = create(transformer);
  mpigrad_array ids = mpigrad_host_array(tokens, 2, ids_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
  mpigrad_array labels =
      mpigrad_host_array(next_tokens, 2, ids_shape, MPIGRAD_I64, MPIGRAD_ORDER_C);
  mpigrad_array out = mpigrad_host_array(logits, 3, logits_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  double first = 0, last = 0;
  int32_t n_inputs = 0, n_outputs = 0;
  int step;
  CHECK_STATUS(mpigrad_model_arrays(model, &n_inputs, &n_outputs), MPIGRAD_SUCCESS);
  CHECK(n_inputs == 1 && n_outputs == 1);
  for (step = 0; step < 30; ++step) {
    double loss = 0;
    CHECK_STATUS(mpigrad_train_step(model, &ids, &labels, &loss), MPIGRAD_SUCCESS);
    if (step == 0) first = loss;
    last = loss;
  }
  printf("transformer: loss %.4f -> %.4f over 30 steps\n", first, last);
  CHECK(last < 0.5 * first);
  CHECK_STATUS(mpigrad_predict(model, &ids, &out), MPIGRAD_SUCCESS);
  {
    /* The prediction is the class dimension second: argmax over it is the next token. */
    int i, t, right = 0;
    for (i = 0; i < B; ++i) {
      for (t = 0; t < T; ++t) {
        int best = 0, v;
        for (v = 1; v < V; ++v) {
          if (logits[(i * V + v) * T + t] > logits[(i * V + best) * T + t]) best = v;
        }
        right += best == next_tokens[i * T + t];
      }
    }
    CHECK(right > B * T / 2);
  }
  /* Float token ids: the graph declares int64. */
  {
    float as_float[B * T] = {0};
    mpigrad_array wrong = mpigrad_host_array(as_float, 2, ids_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(model, &wrong, &labels, NULL), MPIGRAD_ERROR_DTYPE);
    CHECK_ERROR_MENTIONS("the model's input is int64");
  }
  /* One label per sample where the logits are [batch, 11, 6]: labels must be [batch, 6]. */
  {
    const int64_t one_per_sample[1] = {B};
    mpigrad_array wrong =
        mpigrad_host_array(next_tokens, 1, one_per_sample, MPIGRAD_I64, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(model, &ids, &wrong, NULL), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("label: shape [8]");
  }
  CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS);
}

/* The multi-array calls with one array each train exactly as the one-array calls do. */
static void test_multi_equals_single(void) {
  const int64_t c_shape[4] = {B, 1, 8, 8}, f_shape[4] = {8, 8, 1, B};
  mpigrad_model single = create(unet), multi = create(unet);
  mpigrad_array x = mpigrad_host_array(field, 4, c_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array y = mpigrad_host_array(target, 4, c_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array out = mpigrad_host_array(prediction, 4, c_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  int step, i;
  for (step = 0; step < 5; ++step) {
    double a = 0, b = 0;
    CHECK_STATUS(mpigrad_train_step(single, &x, &y, &a), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_train_step_multi(multi, 1, &x, 1, &y, &b), MPIGRAD_SUCCESS);
    CHECK(a == b);
  }
  CHECK_STATUS(mpigrad_predict(single, &x, &out), MPIGRAD_SUCCESS);
  {
    static float again[B * 64];
    mpigrad_array out_multi = mpigrad_host_array(again, 4, c_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
    int same = 1;
    CHECK_STATUS(mpigrad_predict_multi(multi, 1, &x, 1, &out_multi), MPIGRAD_SUCCESS);
    for (i = 0; i < B * 64; ++i) same = same && again[i] == prediction[i];
    CHECK(same);
  }
  /* Counts and shapes are named per array, in the caller's order. */
  CHECK_STATUS(mpigrad_train_step_multi(multi, 2, &x, 1, &y, NULL), MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("n_inputs is 2; the model has 1 graph input(s)");
  {
    const int64_t f_wide[4] = {9, 8, 1, B};
    mpigrad_array wide = mpigrad_host_array(field, 4, f_wide, MPIGRAD_F32, MPIGRAD_ORDER_FORTRAN);
    mpigrad_array fy = mpigrad_host_array(target, 4, f_shape, MPIGRAD_F32, MPIGRAD_ORDER_FORTRAN);
    CHECK_STATUS(mpigrad_train_step_multi(multi, 1, &wide, 1, &fy, NULL), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("inputs[0]: shape (9, 8, 1, 8) in Fortran order");
  }
  CHECK_STATUS(mpigrad_model_destroy(&single), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_model_destroy(&multi), MPIGRAD_SUCCESS);
}

static void test_config_errors(const char* data) {
  char config[4096];
  mpigrad_model model = {0};
  snprintf(config, sizeof(config),
           "[model]\nname = onnx\nfile = %s/missing.onnx\n[loss]\nname = mse\n", data);
  CHECK_STATUS(mpigrad_model_create(&model, config, "cpu"), MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("missing.onnx' does not exist");
  /* The multi-array calls need a graph. */
  model = create(
      "[model]\nname = mlp\nhidden = 4\ninput_shape = 3\noutputs = 2\n"
      "[loss]\nname = mse\n");
  {
    const int64_t shape[2] = {B, 3}, out_shape[2] = {B, 2};
    mpigrad_array x = mpigrad_host_array(field, 2, shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array y = mpigrad_host_array(target, 2, out_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step_multi(model, 1, &x, 1, &y, NULL), MPIGRAD_ERROR_CONFIG);
    CHECK_ERROR_MENTIONS("need [model] name = onnx");
  }
  CHECK_STATUS(mpigrad_model_destroy(&model), MPIGRAD_SUCCESS);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DATA_DIR (tests/data/onnx)\n", argv[0]);
    return 2;
  }
  snprintf(transformer, sizeof(transformer),
           "[model]\nname = onnx\nfile = %s/transformer.dynamo.onnx\n[loss]\nname = "
           "cross_entropy\n[optim]\nlr = 0.03\nmomentum = 0.9\n",
           argv[1]);
  snprintf(unet, sizeof(unet),
           "[model]\nname = onnx\nfile = %s/unet.legacy.onnx\n[loss]\nname = mse\n[optim]\n"
           "lr = 0.05\nmomentum = 0.9\n",
           argv[1]);
  fill_batches();
  test_token_model();
  test_multi_equals_single();
  test_config_errors(argv[1]);
  return c_check_exit_code("c_api_onnx");
}
