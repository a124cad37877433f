/* The C API checks an array's samples against the model's sample shape, rank and every extent,
 * mapped through C or Fortran order, and names both shapes in the caller's order; the one
 * flattening allowed is an mlp's with a one-number input_shape (or outputs). One process, no
 * MPI. */
#include <stdint.h>
#include <stdlib.h>

#include "c_check.h"

#define B 8

/* input_shape 1,4,4 (16 values) and 3 outputs; the conv keeps the grid. */
static const char* kMlp =
    "[model]\nname = mlp\nhidden = 8\ninput_shape = 1,4,4\noutputs = 3\n"
    "[loss]\nname = mse\n";
static const char* kFlatMlp =
    "[model]\nname = mlp\nhidden = 8\ninput_shape = 16\noutputs = 3\n"
    "[loss]\nname = mse\n";
static const char* kConv =
    "[model]\nname = conv\nchannels =\ninput_shape = 1,4,4\noutputs = 1\n"
    "[loss]\nname = mse\n";
static const char* kClassifier =
    "[model]\nname = mlp\nhidden = 8\ninput_shape = 1,4,4\noutputs = 3\n"
    "[loss]\nname = cross_entropy\n";

static float x[B * 16], y[B * 16], out[B * 16];
static int64_t classes[B];

static mpigrad_model create(const char* config) {
  mpigrad_model model = {0};
  CHECK_STATUS(mpigrad_model_create(&model, config, "cpu"), MPIGRAD_SUCCESS);
  return model;
}

static mpigrad_status step(mpigrad_model model, int in_rank, const int64_t* in_shape,
                           mpigrad_order in_order, int label_rank, const int64_t* label_shape,
                           mpigrad_order label_order) {
  mpigrad_array input = mpigrad_host_array(x, in_rank, in_shape, MPIGRAD_F32, in_order);
  mpigrad_array label = mpigrad_host_array(y, label_rank, label_shape, MPIGRAD_F32, label_order);
  return mpigrad_train_step(model, &input, &label, NULL);
}

static void test_inputs(void) {
  const int64_t c_exact[4] = {B, 1, 4, 4}, f_exact[4] = {4, 4, 1, B}, labels[2] = {B, 3};
  const int64_t c_flat[2] = {B, 16}, f_flat[2] = {16, B}, c_other[4] = {B, 4, 1, 4};
  const int64_t f_other[4] = {2, 8, 1, B}, c_rank3[3] = {B, 4, 4}, c_wide[4] = {B, 1, 4, 5};
  const int64_t f_labels[2] = {3, B};
  mpigrad_model model = create(kMlp);
  CHECK_STATUS(step(model, 4, c_exact, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(step(model, 4, f_exact, MPIGRAD_ORDER_FORTRAN, 2, f_labels, MPIGRAD_ORDER_FORTRAN),
               MPIGRAD_SUCCESS);
  /* The same number of values per sample, in another shape: refused. */
  CHECK_STATUS(step(model, 2, c_flat, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS(
      "input: shape [8, 16] is 8 samples of shape [16], but [model] "
      "input_shape [1, 4, 4]");
  CHECK_ERROR_MENTIONS("expected [8, 1, 4, 4]");
  CHECK_STATUS(step(model, 2, f_flat, MPIGRAD_ORDER_FORTRAN, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("input: shape (16, 8) in Fortran order");
  CHECK_ERROR_MENTIONS("expected (4, 4, 1, 8) in Fortran order");
  CHECK_STATUS(step(model, 4, c_other, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("samples of shape [4, 1, 4]");
  CHECK_STATUS(step(model, 4, f_other, MPIGRAD_ORDER_FORTRAN, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("shape (2, 8, 1, 8) in Fortran order is 8 samples of shape (2, 8, 1)");
  CHECK_STATUS(step(model, 3, c_rank3, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_STATUS(step(model, 4, c_wide, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("holds 20 values per sample, but [model] input_shape [1, 4, 4] needs 16");
  {
    /* predict checks its input the same way. */
    int64_t outs[2] = {B, 3};
    mpigrad_array input = mpigrad_host_array(x, 2, c_flat, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array output = mpigrad_host_array(out, 2, outs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_predict(model, &input, &output), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("mpigrad_predict: input: shape [8, 16]");
  }
  mpigrad_model_destroy(&model);

  /* The documented flattening: an mlp with a one-number input_shape takes any sample shape of
   * that many values. */
  model = create(kFlatMlp);
  CHECK_STATUS(step(model, 4, c_exact, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(step(model, 2, c_flat, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(step(model, 4, c_wide, MPIGRAD_ORDER_C, 2, labels, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  mpigrad_model_destroy(&model);
}

static void test_labels_and_outputs(void) {
  const int64_t inputs[4] = {B, 1, 4, 4}, grid[4] = {B, 1, 4, 4}, f_grid[4] = {4, 4, 1, B};
  const int64_t flat[2] = {B, 16}, rank3[3] = {B, 4, 4}, per_sample[2] = {B, 1};
  const int64_t mlp_labels[3] = {B, 1, 3}, wrong[2] = {B, 4};
  mpigrad_model conv = create(kConv), mlp = create(kMlp), classifier = create(kClassifier);
  /* A conv's labels and predictions are grids: [8, 1, 4, 4], (4, 4, 1, 8) in Fortran. */
  CHECK_STATUS(step(conv, 4, inputs, MPIGRAD_ORDER_C, 4, grid, MPIGRAD_ORDER_C), MPIGRAD_SUCCESS);
  CHECK_STATUS(step(conv, 4, inputs, MPIGRAD_ORDER_C, 4, f_grid, MPIGRAD_ORDER_FORTRAN),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(step(conv, 4, inputs, MPIGRAD_ORDER_C, 2, flat, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS(
      "label: shape [8, 16] is 8 samples of shape [16], but the model outputs "
      "[1, 4, 4]");
  CHECK_STATUS(step(conv, 4, inputs, MPIGRAD_ORDER_C, 3, rank3, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS("expected [8, 1, 4, 4]");
  {
    mpigrad_array input = mpigrad_host_array(x, 4, inputs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array output = mpigrad_host_array(out, 2, flat, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_predict(conv, &input, &output), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("output: shape [8, 16]");
    output = mpigrad_host_array(out, 4, f_grid, MPIGRAD_F32, MPIGRAD_ORDER_FORTRAN);
    CHECK_STATUS(mpigrad_predict(conv, &input, &output), MPIGRAD_SUCCESS);
  }
  /* An mlp's outputs is one number: labels of any shape of 3 values fit, others do not. */
  CHECK_STATUS(step(mlp, 4, inputs, MPIGRAD_ORDER_C, 3, mlp_labels, MPIGRAD_ORDER_C),
               MPIGRAD_SUCCESS);
  CHECK_STATUS(step(mlp, 4, inputs, MPIGRAD_ORDER_C, 2, wrong, MPIGRAD_ORDER_C),
               MPIGRAD_ERROR_SHAPE);
  CHECK_ERROR_MENTIONS(
      "label: shape [8, 4] holds 4 values per sample, but the model outputs "
      "[3] (3 values); expected [8, 3]");
  {
    /* cross_entropy: one class per sample, an array [batch]. */
    mpigrad_array input = mpigrad_host_array(x, 4, inputs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array label = mpigrad_host_array(classes, 1, inputs, MPIGRAD_I64, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(classifier, &input, &label, NULL), MPIGRAD_SUCCESS);
    label = mpigrad_host_array(classes, 2, per_sample, MPIGRAD_I64, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step(classifier, &input, &label, NULL), MPIGRAD_ERROR_SHAPE);
    CHECK_ERROR_MENTIONS("cross_entropy needs one class per sample: expected [8]");
  }
  mpigrad_model_destroy(&conv);
  mpigrad_model_destroy(&mlp);
  mpigrad_model_destroy(&classifier);
}

int main(void) {
  int i;
  for (i = 0; i < B * 16; ++i) {
    x[i] = (float)(i % 7) / 7.0f;
    y[i] = (float)(i % 5) / 5.0f;
  }
  for (i = 0; i < B; ++i) classes[i] = i % 3;
  test_inputs();
  test_labels_and_outputs();
  return c_check_exit_code("test_c_api_shapes");
}
