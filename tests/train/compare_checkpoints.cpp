// compare-checkpoints A.h5 B.h5 [TOLERANCE] [PART]: exits 0 when every tensor of PART of the two
// checkpoints has the same shape and dtype and differs by at most TOLERANCE (default 0:
// bitwise equal), and their scalars are equal (each printed); otherwise prints the first
// difference and exits 1. PART is "model" (default) or "hooks/<name>" (a hook's state, e.g.
// hooks/ema). Used by train_checks.sh.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpigrad/nn/checkpoint.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s A.h5 B.h5 [TOLERANCE]\n", argv[0]);
    return 2;
  }
  double tolerance = argc > 3 ? std::atof(argv[3]) : 0.0;
  std::string part = argc > 4 ? argv[4] : "model";
  try {
    auto a_file = mpigrad::nn::load_checkpoint(argv[1]);
    auto b_file = mpigrad::nn::load_checkpoint(argv[2]);
    auto pick = [&](mpigrad::nn::CheckpointData& data, const char* path) {
      if (part == "model") return data.model;
      auto found = part.starts_with("hooks/") ? data.hooks.find(part.substr(6)) : data.hooks.end();
      if (found == data.hooks.end()) {
        throw std::runtime_error(std::string(path) + " has no " + part);
      }
      return found->second;
    };
    const mpigrad::nn::StateDict a = pick(a_file, argv[1]), b = pick(b_file, argv[2]);
    for (const auto& [key, value] : a.scalars()) {
      const double* other = b.find_scalar(key);
      if (other == nullptr || *other != value) {
        std::printf("scalar %s: %.17g in %s, missing or different in %s\n", key.c_str(), value,
                    argv[1], argv[2]);
        return 1;
      }
      std::printf("scalar %s = %.17g in both\n", key.c_str(), value);
    }
    size_t compared = 0;
    double worst = 0;
    for (const auto& [key, tensor] : a.tensors()) {
      const mpigrad::core::Tensor* other = b.find(key);
      if (other == nullptr || !(other->shape() == tensor.shape()) ||
          other->dtype() != tensor.dtype()) {
        std::printf("%s: missing or different shape/dtype in %s\n", key.c_str(), argv[2]);
        return 1;
      }
      std::vector<double> x = tensor.to_vector<double>(), y = other->to_vector<double>();
      for (size_t i = 0; i < x.size(); ++i) {
        double diff = std::fabs(x[i] - y[i]);
        if (!(diff <= tolerance)) {
          std::printf("%s[%zu]: %.9g vs %.9g (|diff| %.3g > %.3g)\n", key.c_str(), i, x[i], y[i],
                      diff, tolerance);
          return 1;
        }
        if (diff > worst) worst = diff;
      }
      ++compared;
    }
    // A state of scalars alone (the fp16 loss scaler's) is compared by its scalars.
    if (compared != b.tensors().size() || (compared == 0 && a.scalars().empty()) ||
        a.scalars().size() != b.scalars().size()) {
      std::printf("the checkpoints hold different sets of tensors\n");
      return 1;
    }
    std::printf("%zu tensors and %zu scalars agree (largest difference %.3g)\n", compared,
                a.scalars().size(), worst);
    return 0;
  } catch (const std::exception& e) {
    std::printf("compare-checkpoints: %s\n", e.what());
    return 1;
  }
}
