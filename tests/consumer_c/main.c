/* Uses the installed C API from C99: a linear model learns y = 2x - 1. */
#include <mpigrad/mpigrad_c.h>
#include <stdio.h>

int main(void) {
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
