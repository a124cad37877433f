#include "mpigrad/data/transforms.h"

#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"

namespace mpigrad::data {

BatchTransform normalize_transform(std::string field, double scale, std::vector<double> mean,
                                   std::vector<double> std) {
  MPIGRAD_CHECK(!mean.empty() && mean.size() == std.size(), "normalize_transform(", field,
                "): mean and std need the same, non-zero number of values (got ", mean.size(),
                " and ", std.size(), ")");
  for (double s : std)
    MPIGRAD_CHECK(s > 0, "normalize_transform(", field, "): std must be > 0, got ", s);
  return [field = std::move(field), scale, mean = std::move(mean),
          std = std::move(std)](Batch batch) {
    core::Tensor input = batch[field].contiguous();
    MPIGRAD_CHECK(input.dtype() != core::kBool, "normalize_transform(", field, "): bool input");
    const int64_t n = input.numel();
    const int64_t channels = input.dim() >= 2 ? input.size(1) : 1;
    const int64_t inner = input.dim() >= 2 ? n / std::max<int64_t>(1, input.size(0) * channels) : 1;
    MPIGRAD_CHECK(mean.size() == 1 || int64_t(mean.size()) == channels, "normalize_transform(",
                  field, "): ", mean.size(), " mean/std values for ", channels,
                  " channels of shape ", input.shape());
    std::vector<float> multiplier(static_cast<size_t>(channels)),
        addend(static_cast<size_t>(channels));
    for (int64_t c = 0; c < channels; ++c) {
      size_t k = mean.size() == 1 ? 0 : size_t(c);
      multiplier[size_t(c)] = float(scale / std[k]);
      addend[size_t(c)] = float(-mean[k] / std[k]);
    }
    core::Tensor output = empty_batch_tensor(input.shape(), core::kFloat32);
    float* out = output.data<float>();
    kernels::visit_dtype(input.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = static_cast<const T*>(input.data_ptr());
      // One channel plane at a time: the inner loop has no division and vectorizes (a divide
      // and a modulo per element made this 0.5 ms of a 64-image Fashion-MNIST batch).
      for (int64_t start = 0, plane = 0; inner > 0 && start < n; start += inner, ++plane) {
        const size_t c = size_t(plane % channels);
        const float m = multiplier[c], a = addend[c];
        for (int64_t i = start; i < start + inner; ++i) out[i] = float(in[i]) * m + a;
      }
    });
    batch.set(field, std::move(output));
    return batch;
  };
}

BatchTransform compose_transforms(std::vector<BatchTransform> transforms) {
  return [transforms = std::move(transforms)](Batch batch) {
    for (const auto& transform : transforms) {
      if (transform) batch = transform(std::move(batch));
    }
    return batch;
  };
}

}  // namespace mpigrad::data
