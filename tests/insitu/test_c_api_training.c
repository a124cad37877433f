/* The C API's training options, one process, no MPI: [loss] name is required; gradient
 * accumulation ([train] grad_accum_steps) equals one step on the whole batch; clip_grad_norm
 * bounds a step; the linear and polynomial LR schedules; the step callback; the mean loss; the
 * CUDA stream calls' checks (their GPU behaviour needs a GPU); cuda_graphs on the CPU; [train]
 * precision = bf16 and fp16 (loss scaling) train like fp32, and a bad precision is refused at
 * create time. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "c_check.h"

#define B 8
#define IN 4
#define OUT 3
#define LINEAR_MODEL \
  "[model]\nname = mlp\nhidden =\ninput_shape = 4\noutputs = 3\n[loss]\nname = mse\n"
#define SGD "[optim]\nname = sgd\nlr = 0.1\nmomentum = 0\n"

static float x[B][IN], y[B][OUT];

static mpigrad_model create(const char* config) {
  mpigrad_model model = {0};
  CHECK_STATUS(mpigrad_model_create(&model, config, "cpu"), MPIGRAD_SUCCESS);
  return model;
}

/* A step on samples [first, first + count). */
static void step(mpigrad_model model, int first, int count) {
  int64_t xs[2] = {0, IN}, ys[2] = {0, OUT};
  mpigrad_array input, label;
  xs[0] = ys[0] = count;
  input = mpigrad_host_array(x[first], 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  label = mpigrad_host_array(y[first], 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_train_step(model, &input, &label, NULL), MPIGRAD_SUCCESS);
}

static void predict(mpigrad_model model, float prediction[B][OUT]) {
  int64_t xs[2] = {B, IN}, ys[2] = {B, OUT};
  mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array output = mpigrad_host_array(prediction, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
  CHECK_STATUS(mpigrad_predict(model, &input, &output), MPIGRAD_SUCCESS);
}

static double largest_difference(float a[B][OUT], float b[B][OUT]) {
  double worst = 0;
  int s, o;
  for (s = 0; s < B; ++s) {
    for (o = 0; o < OUT; ++o) {
      if (fabs((double)a[s][o] - (double)b[s][o]) > worst) worst = fabs(a[s][o] - b[s][o]);
    }
  }
  return worst;
}

static void test_loss_is_required(void) {
  mpigrad_model model = {0};
  CHECK_STATUS(
      mpigrad_model_create(&model, "[model]\nname = mlp\ninput_shape = 4\noutputs = 1\n", "cpu"),
      MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("[loss] name is required");
  CHECK_STATUS(mpigrad_model_create(&model,
                                    "[model]\nname = conv\ninput_shape = 1,4,4\n"
                                    "outputs = 1\n[loss]\nname = cross_entropy\n",
                                    "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("cross_entropy needs a classifier");
  /* A key with its section on the line counts too. */
  model = create("loss.name = l1\n[model]\nname = mlp\ninput_shape = 4\noutputs = 1\n");
  mpigrad_model_destroy(&model);
}

static void test_accumulation_and_clipping(void) {
  float whole[B][OUT], halves[B][OUT], before[B][OUT], after[B][OUT];
  int64_t steps = -1;
  double norm = 0;
  int i;
  mpigrad_model one = create(LINEAR_MODEL SGD "[train]\nseed = 5\nclip_grad_norm = 0.5\n");
  mpigrad_model two =
      create(LINEAR_MODEL SGD "[train]\nseed = 5\nclip_grad_norm = 0.5\ngrad_accum_steps = 2\n");
  mpigrad_model clipped = create(LINEAR_MODEL
                                 "[optim]\nname = sgd\nlr = 1\nmomentum = 0\n"
                                 "[train]\nclip_grad_norm = 0.001\n");
  step(one, 0, B);
  step(two, 0, B / 2);
  CHECK_STATUS(mpigrad_steps(two, &steps), MPIGRAD_SUCCESS);
  CHECK(steps == 0); /* a micro-step: no optimizer step yet */
  step(two, B / 2, B / 2);
  CHECK_STATUS(mpigrad_steps(two, &steps), MPIGRAD_SUCCESS);
  CHECK(steps == 1);
  predict(one, whole);
  predict(two, halves);
  CHECK(largest_difference(whole, halves) < 1e-6);

  /* Clipping to 0.001 with lr 1: no output moves by more than 0.001 * (|x| + 1). */
  predict(clipped, before);
  step(clipped, 0, B);
  predict(clipped, after);
  for (i = 0; i < B * IN; ++i) norm = fmax(norm, fabs(x[i / IN][i % IN])); /* |x| <= 2 norm */
  CHECK(largest_difference(before, after) > 0);
  CHECK(largest_difference(before, after) <= 0.001 * (2.0 * norm + 1.0) + 1e-6);
  mpigrad_model_destroy(&one);
  mpigrad_model_destroy(&two);
  mpigrad_model_destroy(&clipped);
}

/* The same steps in fp32, bf16 and fp16 (with its loss scaler) end near each other: 16-bit
 * operands round to 8 (bf16) or 11 (fp16) bits, the sums and the weights stay fp32. */
static void test_precision(void) {
  float reference[B][OUT], low[B][OUT];
  const char* precisions[2] = {"[train]\nseed = 5\nprecision = bf16\n",
                               "[train]\nseed = 5\nprecision = fp16\n"};
  const double tolerance[2] = {0.05, 0.01};
  mpigrad_model fp32 = create(LINEAR_MODEL SGD "[train]\nseed = 5\n");
  mpigrad_model bad = {0};
  int p, s;
  for (s = 0; s < 5; ++s) step(fp32, 0, B);
  predict(fp32, reference);
  for (p = 0; p < 2; ++p) {
    char config[512];
    mpigrad_model model;
    snprintf(config, sizeof config, "%s%s%s", LINEAR_MODEL, SGD, precisions[p]);
    model = create(config);
    for (s = 0; s < 5; ++s) step(model, 0, B);
    predict(model, low);
    CHECK(largest_difference(reference, low) > 0); /* it did run in 16 bits */
    CHECK(largest_difference(reference, low) < tolerance[p]);
    mpigrad_model_destroy(&model);
  }
  CHECK(mpigrad_model_create(&bad, LINEAR_MODEL "[train]\nprecision = fp8\n", "cpu") !=
        MPIGRAD_SUCCESS);
  mpigrad_model_destroy(&fp32);
}

/* What the step callback saw. */
typedef struct Seen {
  int calls;
  int64_t steps[8];
  double lrs[8];
} Seen;

static void record(mpigrad_model model, int64_t step_count, double lr, void* user_data) {
  Seen* seen = (Seen*)user_data;
  double loss = -1;
  CHECK_STATUS(mpigrad_last_loss(model, &loss), MPIGRAD_SUCCESS);
  CHECK(loss >= 0);
  if (seen->calls < 8) {
    seen->steps[seen->calls] = step_count;
    seen->lrs[seen->calls] = lr;
  }
  ++seen->calls;
}

static void test_schedules_and_callback(void) {
  static const double linear[6] = {0.1, 0.0875, 0.075, 0.0625, 0.05, 0.05};
  static const double polynomial[6] = {0.1, 0.05625, 0.025, 0.00625, 0, 0};
  Seen seen_linear = {0, {0}, {0}}, seen_polynomial = {0, {0}, {0}}, seen_accum = {0, {0}, {0}};
  int i;
  double last = -1, mean = -2;
  mpigrad_model a =
      create(LINEAR_MODEL SGD "[sched]\nname = linear\ntotal_steps = 4\nend_factor = 0.5\n");
  mpigrad_model b =
      create(LINEAR_MODEL SGD "[sched]\nname = polynomial\ntotal_steps = 4\npower = 2\n");
  mpigrad_model c = create(LINEAR_MODEL SGD "[train]\ngrad_accum_steps = 2\n");
  mpigrad_model none = {0};
  CHECK_STATUS(mpigrad_set_step_callback(a, record, &seen_linear), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_set_step_callback(b, record, &seen_polynomial), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_set_step_callback(c, record, &seen_accum), MPIGRAD_SUCCESS);
  for (i = 0; i < 6; ++i) {
    step(a, 0, B);
    step(b, 0, B);
  }
  for (i = 0; i < 4; ++i) step(c, 0, B);
  CHECK(seen_linear.calls == 6 && seen_polynomial.calls == 6);
  for (i = 0; i < 6; ++i) {
    CHECK(seen_linear.steps[i] == i + 1);
    CHECK(fabs(seen_linear.lrs[i] - linear[i]) < 1e-12);
    CHECK(fabs(seen_polynomial.lrs[i] - polynomial[i]) < 1e-12);
  }
  CHECK(seen_accum.calls == 2 && seen_accum.steps[1] == 2); /* once per optimizer step */
  CHECK_STATUS(mpigrad_set_step_callback(a, NULL, NULL), MPIGRAD_SUCCESS);
  step(a, 0, B);
  CHECK(seen_linear.calls == 6);
  CHECK_STATUS(mpigrad_set_step_callback(none, record, NULL), MPIGRAD_ERROR_INVALID_HANDLE);
  /* Without MPI the mean loss over the ranks is this process's loss. */
  CHECK_STATUS(mpigrad_last_loss(a, &last), MPIGRAD_SUCCESS);
  CHECK_STATUS(mpigrad_mean_loss(a, &mean), MPIGRAD_SUCCESS);
  CHECK(last == mean);
  CHECK_STATUS(mpigrad_mean_loss(a, NULL), MPIGRAD_ERROR_NULL_POINTER);
  /* A CUDA stream is for a model on a GPU; NULL is the plain call. */
  {
    int64_t xs[2] = {B, IN}, ys[2] = {B, OUT};
    float prediction[B][OUT];
    int stream_stand_in = 0;
    mpigrad_array input = mpigrad_host_array(x, 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array label = mpigrad_host_array(y, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array output = mpigrad_host_array(prediction, 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    CHECK_STATUS(mpigrad_train_step_on_stream(a, &input, &label, NULL, &stream_stand_in),
                 MPIGRAD_ERROR_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("stream: a CUDA stream for a model on cpu");
    CHECK_STATUS(mpigrad_predict_on_stream(a, &input, &output, &stream_stand_in),
                 MPIGRAD_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(mpigrad_train_step_on_stream(a, &input, &label, NULL, NULL), MPIGRAD_SUCCESS);
    CHECK_STATUS(mpigrad_predict_on_stream(a, &input, &output, NULL), MPIGRAD_SUCCESS);
  }
  /* A schedule's length is required where no run length is known. */
  CHECK_STATUS(mpigrad_model_create(&none, LINEAR_MODEL "[sched]\nname = linear\n", "cpu"),
               MPIGRAD_ERROR_CONFIG);
  CHECK_ERROR_MENTIONS("[sched] total_steps: linear needs its length");
  mpigrad_model_destroy(&a);
  mpigrad_model_destroy(&b);
  mpigrad_model_destroy(&c);
}

/* [train] cuda_graphs on a CPU model is accepted and changes nothing (it says why once): the
 * same config with and without it trains to the same predictions. */
static void test_cuda_graphs_on_cpu(void) {
  float with[B][OUT], without[B][OUT];
  mpigrad_model a = create(LINEAR_MODEL SGD "[train]\ncuda_graphs = true\ncuda_graph_warmup = 1\n");
  mpigrad_model b = create(LINEAR_MODEL SGD);
  int s;
  for (s = 0; s < 4; ++s) {
    step(a, 0, B);
    step(b, 0, B);
  }
  predict(a, with);
  predict(b, without);
  CHECK(largest_difference(with, without) == 0.0);
  mpigrad_model_destroy(&a);
  mpigrad_model_destroy(&b);
}

int main(void) {
  int b, i, o;
  for (b = 0; b < B; ++b) {
    for (i = 0; i < IN; ++i) x[b][i] = (float)sin(0.9 * b + 0.4 * i);
    for (o = 0; o < OUT; ++o) y[b][o] = 10.0f * x[b][o] - 3.0f * x[b][o + 1];
  }
  test_loss_is_required();
  test_accumulation_and_clipping();
  test_schedules_and_callback();
  test_cuda_graphs_on_cpu();
  test_precision();
  return c_check_exit_code("test_c_api_training");
}
