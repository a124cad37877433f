// Uses the installed mpigrad: a tiny autograd computation whose gradient is known exactly.
#include <mpigrad/mpigrad.h>

#include <cstdio>

int main() {
  namespace core = mpigrad::core;
  auto w = core::Tensor::from_vector<float>({1, 2, 3}, {3}).set_requires_grad();
  auto x = core::Tensor::from_vector<float>({4, 5, 6}, {3});
  auto loss = core::sum(w * x);  // d loss / d w = x
  loss.backward();
  auto grad = w.grad().to_vector<float>();
  std::printf("mpigrad %s: loss %.1f, grad %.1f %.1f %.1f\n", MPIGRAD_VERSION, loss.item<float>(),
              grad[0], grad[1], grad[2]);
  bool ok = loss.item<float>() == 32.0f && grad[0] == 4.0f && grad[1] == 5.0f && grad[2] == 6.0f;
  return ok ? 0 : 1;
}
