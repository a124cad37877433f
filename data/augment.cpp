#include "mpigrad/data/augment.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>

#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"
#include "mpigrad/kernels/philox.h"

namespace mpigrad::data {

namespace {

constexpr const char* kAccepted = "crop:P (P an integer >= 1), flip, noise:S (S a number > 0)";
// Mixed into the seed so augmentation never reuses the weight initializer's stream words.
constexpr uint64_t kAugmentKeyTag = 0x6175676d656e7421ull;  // "augment!"
// Block 0 of a (sample, view) holds the geometric draws; noise uses blocks 1, 2, ...
constexpr uint32_t kCropRowWord = 0, kCropColumnWord = 1, kFlipWord = 2;

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

[[noreturn]] void bad_item(const std::string& where, const std::string& item,
                           const std::string& why) {
  core::fail(where, ": ", why, " '", item, "'; accepted: ", kAccepted,
             ", comma-separated, or empty for none");
}

// The Philox block of draw `block` for one (epoch, sample, view).
kernels::PhiloxBlock draw(uint64_t seed, int64_t epoch, int64_t index, int64_t view,
                          uint32_t block) {
  const uint64_t sample = uint64_t(index);
  uint32_t counter[4] = {block, uint32_t(view) | (uint32_t(sample >> 32) << 16), uint32_t(epoch),
                         uint32_t(sample)};
  const uint64_t key = seed ^ kAugmentKeyTag;
  uint32_t key_words[2] = {uint32_t(key), uint32_t(key >> 32)};
  return kernels::philox4x32_10(counter, key_words);
}

// An integer in [0, n) from 32 random bits (multiply-shift: no division, bias below 2^-32 * n).
int64_t below(uint32_t bits, int64_t n) {
  return int64_t((uint64_t(bits) * uint64_t(n)) >> 32);
}

}  // namespace

AugmentSpec parse_augment(const std::string& text, const std::string& where) {
  AugmentSpec spec;
  std::stringstream in(text);
  bool crop = false, noise = false;
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    if (item.empty() || item == "none") continue;
    const size_t colon = item.find(':');
    const std::string name = trim(item.substr(0, colon));
    const std::string value = colon == std::string::npos ? "" : trim(item.substr(colon + 1));
    if (name == "flip") {
      if (colon != std::string::npos) bad_item(where, item, "flip takes no value, got");
      if (spec.flip) bad_item(where, item, "given twice:");
      spec.flip = true;
    } else if (name == "crop") {
      int64_t padding = 0;
      auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), padding);
      if (value.empty() || error != std::errc() || end != value.data() + value.size() ||
          padding < 1) {
        bad_item(where, item, "crop needs a padding >= 1 (crop:4), got");
      }
      if (crop) bad_item(where, item, "given twice:");
      crop = true;
      spec.crop_padding = padding;
    } else if (name == "noise") {
      double std = 0;
      auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), std);
      if (value.empty() || error != std::errc() || end != value.data() + value.size() ||
          !std::isfinite(std) || std <= 0) {
        bad_item(where, item, "noise needs a standard deviation > 0 (noise:0.05), got");
      }
      if (noise) bad_item(where, item, "given twice:");
      noise = true;
      spec.noise_std = std;
    } else {
      bad_item(where, item, "unknown augmentation");
    }
  }
  return spec;
}

std::string augment_text(const AugmentSpec& spec) {
  std::string text;
  auto add = [&](const std::string& item) {
    if (!text.empty()) text.push_back(',');
    text += item;
  };
  if (spec.crop_padding > 0) add("crop:" + std::to_string(spec.crop_padding));
  if (spec.flip) add("flip");
  if (spec.noise_std > 0) {
    char number[64];
    auto [end, error] = std::to_chars(number, number + sizeof(number), spec.noise_std);
    add("noise:" +
        (error == std::errc() ? std::string(number, end) : std::to_string(spec.noise_std)));
  }
  return text;
}

BatchTransform augment_views_transform(std::string field, AugmentSpec spec, uint64_t seed,
                                       int64_t views) {
  MPIGRAD_CHECK(views >= 1 && views < (1 << 16), "augment_views_transform(", field,
                "): views must be in [1, 65535], got ", views);
  MPIGRAD_CHECK(spec.crop_padding >= 0, "augment_views_transform(", field,
                "): negative crop padding ", spec.crop_padding);
  if (views == 1 && !spec.geometric()) return nullptr;
  return [field = std::move(field), spec, seed, views](Batch batch) {
    const core::Tensor input = batch[field].contiguous();
    const int64_t n = batch.size();
    MPIGRAD_CHECK(input.dim() >= 1 && input.size(0) == n, "augment(", field, "): shape ",
                  input.shape(), " for a batch of ", n);
    MPIGRAD_CHECK(!spec.geometric() || input.dim() == 4, "augment(", field,
                  "): crop and flip need images [batch, channels, height, width], got ",
                  input.shape());
    std::vector<int64_t> shape = input.shape().vec();
    const int64_t sample_elements = n > 0 ? input.numel() / n : 0;
    const size_t element = core::element_size(input.dtype());
    shape[0] = views * n;
    core::Tensor output = empty_batch_tensor(core::Shape(shape), input.dtype());
    const auto* in = static_cast<const unsigned char*>(input.data_ptr());
    auto* out = static_cast<unsigned char*>(output.data_ptr());
    const int64_t channels = input.dim() == 4 ? input.size(1) : 1;
    const int64_t height = input.dim() == 4 ? input.size(2) : 1;
    const int64_t width = input.dim() == 4 ? input.size(3) : 1;
    const int64_t pad = spec.crop_padding;
    for (int64_t view = 0; view < views; ++view) {
      for (int64_t i = 0; i < n; ++i) {
        const unsigned char* source = in + size_t(i * sample_elements) * element;
        unsigned char* target = out + size_t((view * n + i) * sample_elements) * element;
        if (!spec.geometric()) {
          std::memcpy(target, source, size_t(sample_elements) * element);
          continue;
        }
        const kernels::PhiloxBlock bits =
            draw(seed, batch.epoch, batch.indices[size_t(i)], view, 0);
        // Window offsets in the padded image, in [0, 2P]; relative to the original: minus P.
        const int64_t dy = pad > 0 ? below(bits.word[kCropRowWord], 2 * pad + 1) - pad : 0;
        const int64_t dx = pad > 0 ? below(bits.word[kCropColumnWord], 2 * pad + 1) - pad : 0;
        const bool flip = spec.flip && (bits.word[kFlipWord] >> 31) != 0;
        for (int64_t c = 0; c < channels; ++c) {
          for (int64_t y = 0; y < height; ++y) {
            const int64_t sy = y + dy;
            unsigned char* row = target + size_t((c * height + y) * width) * element;
            if (sy < 0 || sy >= height) {
              std::memset(row, 0, size_t(width) * element);
              continue;
            }
            const unsigned char* source_row = source + size_t((c * height + sy) * width) * element;
            for (int64_t x = 0; x < width; ++x) {
              // Crop first, then the flip mirrors the cropped window.
              const int64_t sx = (flip ? width - 1 - x : x) + dx;
              if (sx < 0 || sx >= width) {
                std::memset(row + size_t(x) * element, 0, element);
              } else {
                std::memcpy(row + size_t(x) * element, source_row + size_t(sx) * element, element);
              }
            }
          }
        }
      }
    }
    batch.set(field, std::move(output));
    return batch;
  };
}

BatchTransform gaussian_noise_transform(std::string field, double std, uint64_t seed) {
  MPIGRAD_CHECK(std > 0 && std::isfinite(std), "gaussian_noise_transform(", field,
                "): std must be > 0, got ", std);
  return [field = std::move(field), std, seed](Batch batch) {
    core::Tensor values = batch[field].contiguous();
    MPIGRAD_CHECK(values.dtype() == core::kFloat32, "gaussian_noise(", field,
                  "): expected float32 (after the input transform), got ", values.dtype());
    const int64_t n = batch.size();
    MPIGRAD_CHECK(n > 0 && values.dim() >= 1 && values.size(0) % n == 0, "gaussian_noise(", field,
                  "): ", values.size(0), " rows for a batch of ", n);
    const int64_t views = values.size(0) / n;
    const int64_t sample_elements = values.numel() / values.size(0);
    core::Tensor output = empty_batch_tensor(values.shape(), core::kFloat32);
    const float* in = values.data<float>();
    float* out = output.data<float>();
    const float scale = float(std);
    constexpr float kTwoPi = 6.28318530717958647692f;
    for (int64_t row = 0; row < views * n; ++row) {
      const int64_t view = row / n, i = row % n;
      const float* source = in + row * sample_elements;
      float* target = out + row * sample_elements;
      // Four words give two Box-Muller pairs: element e uses block 1 + e / 4.
      for (int64_t e = 0; e < sample_elements; e += 4) {
        const kernels::PhiloxBlock bits =
            draw(seed, batch.epoch, batch.indices[size_t(i)], view, uint32_t(1 + e / 4));
        float normal[4];
        for (int pair = 0; pair < 2; ++pair) {
          // 1 - u lies in (0, 1], so the log is finite.
          const float u1 = 1.0f - kernels::uniform_from_bits(bits.word[2 * pair]);
          const float u2 = kernels::uniform_from_bits(bits.word[2 * pair + 1]);
          const float radius = std::sqrt(-2.0f * std::log(u1));
          normal[2 * pair] = radius * std::cos(kTwoPi * u2);
          normal[2 * pair + 1] = radius * std::sin(kTwoPi * u2);
        }
        for (int64_t k = 0; k < 4 && e + k < sample_elements; ++k) {
          target[e + k] = source[e + k] + scale * normal[k];
        }
      }
    }
    batch.set(field, std::move(output));
    return batch;
  };
}

}  // namespace mpigrad::data
