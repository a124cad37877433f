// check-embeddings EMB.h5 DATA.h5 [D]: exits 0 when the output of `mpigrad embed` holds one row
// per sample of DATA.h5 in dataset order (indices 0..N-1, each once), finite float32
// embeddings of width D (when given), and labels equal to DATA.h5's /y; otherwise prints what
// is wrong and exits 1. Used by supcon_checks.sh.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s EMB.h5 DATA.h5 [D]\n", argv[0]);
    return 2;
  }
  using namespace mpigrad;  // NOLINT
  try {
    core::hdf5::File embedded = core::hdf5::File::open(argv[1]);
    core::hdf5::File data = core::hdf5::File::open(argv[2]);
    const core::Tensor embeddings = embedded.read_tensor("embeddings");
    const std::vector<int64_t> indices =
        embedded.read_tensor("indices").to(core::kInt64).to_vector<int64_t>();
    const std::vector<int64_t> labels =
        embedded.read_tensor("labels").to(core::kInt64).to_vector<int64_t>();
    const std::vector<int64_t> truth = data.read_tensor("y").to(core::kInt64).to_vector<int64_t>();
    const size_t n = truth.size();
    auto fail = [](const std::string& why) {
      std::fprintf(stderr, "check-embeddings: %s\n", why.c_str());
      return 1;
    };
    if (embeddings.dtype() != core::kFloat32 || embeddings.dim() != 2) {
      return fail("embeddings are not float32 [N, D]");
    }
    if (size_t(embeddings.size(0)) != n || indices.size() != n || labels.size() != n) {
      return fail("expected " + std::to_string(n) + " rows, got " +
                  std::to_string(embeddings.size(0)) + " embeddings, " +
                  std::to_string(indices.size()) + " indices, " + std::to_string(labels.size()) +
                  " labels");
    }
    if (argc > 3 && embeddings.size(1) != std::atoll(argv[3])) {
      return fail("width " + std::to_string(embeddings.size(1)) + ", expected " + argv[3]);
    }
    for (size_t i = 0; i < n; ++i) {
      if (indices[i] != int64_t(i)) {
        return fail("row " + std::to_string(i) + " holds index " + std::to_string(indices[i]));
      }
      if (labels[i] != truth[i]) return fail("row " + std::to_string(i) + ": wrong label");
    }
    for (float value : embeddings.to_vector<float>()) {
      if (!std::isfinite(value)) return fail("a non-finite embedding value");
    }
    std::printf("check-embeddings: %zu rows in dataset order, width %lld\n", n,
                static_cast<long long>(embeddings.size(1)));
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "check-embeddings: %s\n", error.what());
    return 1;
  }
}
