// A small end-to-end use of the core: logistic regression on synthetic 2-class data, trained with
// autograd and plain SGD. It prints the loss falling and the final accuracy, and exits non-zero
// if the model did not learn (so the README's main-job command fails loudly).
#include <mpigrad/mpigrad.h>

#include <cstdio>

using namespace mpigrad::core;

int main() {
  Generator generator(42);
  const int64_t samples = 512, features = 8;
  // Labels come from a fixed random hyperplane, so a linear model can reach ~100%.
  Tensor x = randn({samples, features}, generator);
  Tensor true_w = randn({features, 1}, generator);
  Tensor y = gt(matmul(x, true_w), scalar_like(0.0, x)).to(kFloat32);

  Tensor w = zeros({features, 1}).set_requires_grad();
  Tensor b = zeros({1}).set_requires_grad();
  const double lr = 0.5;
  for (int step = 0; step <= 200; ++step) {
    Tensor logits = matmul(x, w) + b;
    // Binary cross-entropy on logits: softplus(z) - y*z, written with stable primitives.
    Tensor loss = mean(relu(logits) - logits * y + log(1.0 + exp(neg(abs(logits)))));
    loss.backward();
    {
      NoGradGuard no_grad;
      w.sub_(w.grad() * lr);
      b.sub_(b.grad() * lr);
      w.grad().zero_();
      b.grad().zero_();
    }
    if (step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, loss.item<double>());
  }
  NoGradGuard no_grad;
  Tensor predicted = gt(matmul(x, w) + b, scalar_like(0.0, x)).to(kFloat32);
  double accuracy = mean(eq(predicted, y).to(kFloat32)).item<double>();
  std::printf("train accuracy %.3f (threads %d, BLAS core %s)\n", accuracy, num_threads(),
              blas_core_name().c_str());
  return accuracy > 0.95 ? 0 : 1;
}
