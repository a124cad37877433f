// Augmentations (data/augment.h): the parser, what each transform does to known images, and that
// an augmented sample depends only on (seed, epoch, sample index, view): not on the number of
// loader threads, not on which rank's shard holds it, not on its batch.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/data/augment.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/transforms.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

namespace {

constexpr int64_t kChannels = 2, kHeight = 4, kWidth = 5;
constexpr int64_t kPixels = kChannels * kHeight * kWidth;

// uint8 images [N, 2, 4, 5]: pixel p of sample g holds 1 + p (never 0, so padding shows), with
// the sample in y.
class ImageDataset final : public data::Dataset {
 public:
  explicit ImageDataset(int64_t n) : n_(n) {
    fields_ = {{"x", core::kUInt8, {kChannels, kHeight, kWidth}}, {"y", core::kInt64, {}}};
  }
  int64_t size() const override { return n_; }
  const std::vector<data::FieldInfo>& fields() const override { return fields_; }
  data::Batch get_batch(std::span<const int64_t> indices) const override {
    const int64_t b = int64_t(indices.size());
    std::vector<uint8_t> x(size_t(b * kPixels));
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t p = 0; p < kPixels; ++p) x[size_t(i * kPixels + p)] = uint8_t(1 + p);
    }
    data::Batch batch;
    batch.indices.assign(indices.begin(), indices.end());
    batch.set("x", Tensor::from_vector<uint8_t>(x, {b, kChannels, kHeight, kWidth}));
    batch.set("y", Tensor::from_vector<int64_t>(batch.indices, {b}));
    return batch;
  }
  std::string describe() const override { return "in-memory images"; }

 private:
  int64_t n_;
  std::vector<data::FieldInfo> fields_;
};

// The transform mpigrad train builds for stage supcon: crop, flip into two views, scaling, noise.
data::BatchTransform full_transform(const data::AugmentSpec& spec, uint64_t seed, int64_t views) {
  std::vector<data::BatchTransform> steps = {
      data::augment_views_transform("x", spec, seed, views),
      data::normalize_transform("x", 1.0 / 255.0, {0.0}, {1.0})};
  if (spec.noise_std > 0) {
    steps.push_back(data::gaussian_noise_transform("x", spec.noise_std, seed));
  }
  return data::compose_transforms(steps);
}

// Sample index -> its views' values, from one epoch of `loader`.
std::map<int64_t, std::vector<float>> by_sample(data::DataLoader& loader, int64_t epoch) {
  std::map<int64_t, std::vector<float>> out;
  loader.set_epoch(epoch);
  for (data::Batch& batch : loader) {
    const Tensor x = batch["x"].contiguous();
    const int64_t n = batch.size(), views = x.size(0) / n, size = x.numel() / x.size(0);
    const std::vector<float> values = x.to(core::kFloat32).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float>& sample = out[batch.indices[size_t(i)]];
      sample.clear();
      for (int64_t v = 0; v < views; ++v) {
        const float* row = values.data() + (v * n + i) * size;
        sample.insert(sample.end(), row, row + size);
      }
    }
  }
  return out;
}

data::DataLoaderOptions loader_options(data::BatchTransform transform, int workers,
                                       int64_t replicas = 1, int64_t rank = 0) {
  data::DataLoaderOptions options;
  options.batch_size = 7;
  options.shuffle = true;
  options.seed = 11;
  options.num_workers = workers;
  options.num_replicas = replicas;
  options.rank = rank;
  options.transform = std::move(transform);
  return options;
}

// The (dy, dx, flip) that explains `image` as a crop with zero padding and a flip of the
// original, or nullopt. Checks every pixel.
struct Window {
  int64_t dy, dx;
  bool flip;
};
std::optional<Window> explain(const uint8_t* image, int64_t pad) {
  for (int flip = 0; flip < 2; ++flip) {
    for (int64_t dy = -pad; dy <= pad; ++dy) {
      for (int64_t dx = -pad; dx <= pad; ++dx) {
        bool all = true;
        for (int64_t c = 0; c < kChannels && all; ++c) {
          for (int64_t y = 0; y < kHeight && all; ++y) {
            for (int64_t x = 0; x < kWidth && all; ++x) {
              const int64_t sy = y + dy, sx = (flip ? kWidth - 1 - x : x) + dx;
              const bool inside = sy >= 0 && sy < kHeight && sx >= 0 && sx < kWidth;
              const int expected = inside ? int(1 + (c * kHeight + sy) * kWidth + sx) : 0;
              all = image[(c * kHeight + y) * kWidth + x] == expected;
            }
          }
        }
        if (all) return Window{dy, dx, flip == 1};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("augment: the [data] augment syntax") {
  CHECK(data::parse_augment("", "[data] augment").empty());
  CHECK(data::parse_augment("none", "[data] augment").empty());
  const data::AugmentSpec spec = data::parse_augment(" crop:4, flip ,noise:0.05", "k");
  CHECK(spec.crop_padding == 4);
  CHECK(spec.flip);
  CHECK(spec.noise_std == doctest::Approx(0.05));
  CHECK(data::augment_text(spec) == "crop:4,flip,noise:0.05");
  CHECK(data::parse_augment(data::augment_text(spec), "k") == spec);
  for (const char* bad : {"rotate", "crop", "crop:0", "crop:x", "noise:-1", "noise:", "flip:1",
                          "flip,flip", "crop:2,crop:3"}) {
    CAPTURE(bad);
    try {
      data::parse_augment(bad, "cfg.ini: [data] augment");
      FAIL("accepted");
    } catch (const core::Error& error) {
      const std::string message = error.what();
      CHECK(message.find("cfg.ini: [data] augment") == 0);
      CHECK(message.find("crop:P") != std::string::npos);
      CHECK(message.find("flip") != std::string::npos);
      CHECK(message.find("noise:S") != std::string::npos);
    }
  }
}

TEST_CASE("augment: a crop keeps the values, shifted within the padding; a flip mirrors") {
  auto dataset = std::make_shared<ImageDataset>(64);
  data::DataLoaderOptions options = loader_options(
      data::augment_views_transform("x", data::AugmentSpec{.crop_padding = 2, .flip = true}, 3, 2),
      0);
  data::DataLoader loader(dataset, options);
  int flips = 0, shifted = 0, windows = 0;
  for (data::Batch& batch : loader) {
    const Tensor x = batch["x"];
    REQUIRE(x.dtype() == core::kUInt8);
    REQUIRE(x.size(0) == 2 * batch.size());  // two views, view-major
    CHECK(batch["y"].size(0) == batch.size());
    const uint8_t* values = x.data<uint8_t>();
    for (int64_t row = 0; row < x.size(0); ++row) {
      std::optional<Window> window = explain(values + row * kPixels, 2);
      REQUIRE(window.has_value());
      ++windows;
      flips += window->flip ? 1 : 0;
      shifted += window->dy != 0 || window->dx != 0 ? 1 : 0;
    }
  }
  CHECK(windows == 128);
  // p = 0.5 over 128 views, and a shift in 24 of 25 windows: far from 0 and from all.
  CHECK(flips > 40);
  CHECK(flips < 88);
  CHECK(shifted > 100);

  // Flip alone: each view is the image or its mirror, nothing else.
  data::BatchTransform flip_only =
      data::augment_views_transform("x", data::AugmentSpec{.flip = true}, 3, 1);
  data::Batch batch = flip_only(dataset->get_batch(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (int64_t i = 0; i < 8; ++i) {
    std::optional<Window> window = explain(batch["x"].data<uint8_t>() + i * kPixels, 0);
    REQUIRE(window.has_value());
  }
}

TEST_CASE("augment: the same samples through 1 or 2 loader threads and 1 or 2 ranks' shards") {
  auto dataset = std::make_shared<ImageDataset>(45);
  const data::AugmentSpec spec{.crop_padding = 1, .flip = true, .noise_std = 0.1};
  data::DataLoader one_thread(dataset, loader_options(full_transform(spec, 9, 2), 0));
  data::DataLoader two_threads(dataset, loader_options(full_transform(spec, 9, 2), 2));
  const auto reference = by_sample(one_thread, 3);
  REQUIRE(reference.size() == 45);
  CHECK(by_sample(two_threads, 3) == reference);  // bitwise: float == float

  std::map<int64_t, std::vector<float>> sharded;
  for (int64_t rank = 0; rank < 2; ++rank) {
    data::DataLoader shard(dataset, loader_options(full_transform(spec, 9, 2), 1, 2, rank));
    for (auto& [index, values] : by_sample(shard, 3)) sharded[index] = values;
  }
  CHECK(sharded == reference);

  // Another epoch, another seed: other draws.
  const auto next_epoch = by_sample(one_thread, 4);
  int64_t differ = 0;
  for (const auto& [index, values] : reference) differ += next_epoch.at(index) != values ? 1 : 0;
  CHECK(differ == 45);  // the noise alone differs everywhere
  data::DataLoader other_seed(dataset, loader_options(full_transform(spec, 10, 2), 0));
  CHECK(by_sample(other_seed, 3) != reference);
  // The two views of a sample are independent draws.
  for (const auto& [index, values] : reference) {
    CHECK(std::vector<float>(values.begin(), values.begin() + kPixels) !=
          std::vector<float>(values.begin() + kPixels, values.end()));
  }
}

TEST_CASE("augment: noise is N(0, S^2) added after the scaling") {
  auto dataset = std::make_shared<ImageDataset>(500);
  data::DataLoader loader(dataset, loader_options(full_transform({.noise_std = 0.5}, 1, 1), 0));
  double sum = 0, squares = 0;
  int64_t count = 0;
  for (const auto& [index, values] : by_sample(loader, 0)) {
    for (int64_t p = 0; p < kPixels; ++p) {
      const double noise = values[size_t(p)] - double(1 + p) / 255.0;
      sum += noise;
      squares += noise * noise;
      ++count;
    }
  }
  const double mean = sum / double(count), std = std::sqrt(squares / double(count) - mean * mean);
  CHECK(std::abs(mean) < 0.01);  // 20000 draws: the mean's std is 0.0035
  CHECK(std == doctest::Approx(0.5).epsilon(0.02));
}

TEST_CASE("augment: crop and flip need images; noise needs float32") {
  data::BatchTransform crop = data::augment_views_transform("x", {.crop_padding = 1}, 0, 1);
  data::Batch flat;
  flat.indices = {0, 1};
  flat.set("x", Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}));
  CHECK_THROWS_WITH_AS(crop(flat), doctest::Contains("crop and flip need images"), core::Error);
  data::BatchTransform noise = data::gaussian_noise_transform("x", 0.1, 0);
  data::Batch bytes;
  bytes.indices = {0};
  bytes.set("x", Tensor::from_vector<uint8_t>({1, 2}, {1, 2}));
  CHECK_THROWS_WITH_AS(noise(bytes), doctest::Contains("float32"), core::Error);
  // Nothing to do: no transform at all.
  CHECK(data::augment_views_transform("x", {}, 0, 1) == nullptr);
}
