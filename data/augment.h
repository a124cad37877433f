// Training-time augmentations as batch transforms (DataLoaderOptions::transform), run on the host
// in the loader's threads before the device copy:
//   crop:P   zero-pad P pixels on each side, then crop a random window of the original size
//            (torchvision's RandomCrop(size, padding=P)); the padding is a 0 of the stored dtype,
//            so a black pixel for uint8 images
//   flip     mirror the width axis with probability 0.5 (RandomHorizontalFlip)
//   noise:S  add N(0, S^2) to every value, after the scaling to [0, 1] and the normalization
// The order is fixed: crop, flip (both on the stored values), then scaling / normalization, then
// noise. `mpigrad train` composes them so from [data] augment.
//
// Every draw is a pure function of (seed, epoch, global sample index, view, draw number): the
// Philox 4x32-10 block (kernels/philox.h) under the key `seed` (mixed with a constant, so the
// stream differs from the weight initializer's for the same seed) at the 128-bit counter
//   {draw block, view | (index >> 32) << 16, epoch, index & 0xffffffff}.
// So an augmented sample is the same whichever loader thread or rank reads it, and in whatever
// batch; another epoch or another view draws afresh. The epoch is the loader's (Batch::epoch).
//
// Views (SupCon's two augmented copies per sample): with views = V the field becomes
// [V * batch, ...], view-major (all first views, then all second views, as SupContrast's
// torch.cat([x1, x2])); the other fields keep [batch, ...].
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/data/data_loader.h"

namespace mpigrad::data {

struct AugmentSpec {
  int64_t crop_padding = 0;  // 0: no crop
  bool flip = false;
  double noise_std = 0.0;  // 0: no noise
  bool empty() const { return crop_padding == 0 && !flip && noise_std == 0.0; }
  bool geometric() const { return crop_padding > 0 || flip; }
  friend bool operator==(const AugmentSpec&, const AugmentSpec&) = default;
};

// Parses "crop:4,flip,noise:0.05" (any order, each at most once; "" or "none": nothing). A bad
// item is a core::Error that starts with `where` and lists the accepted items.
AugmentSpec parse_augment(const std::string& text, const std::string& where);
// The canonical text of a spec ("crop:4,flip,noise:0.05"; "" for none): parse_augment reads it
// back to the same spec.
std::string augment_text(const AugmentSpec& spec);

// Crop and flip of `field` (any dtype, [batch, channels, height, width]) into `views` copies per
// sample, view-major. views = 1 without crop or flip returns the batch as it is. A field of
// another rank is a core::Error naming it when crop or flip is asked for.
BatchTransform augment_views_transform(std::string field, AugmentSpec spec, uint64_t seed,
                                       int64_t views);

// Adds N(0, std^2) to the float32 `field` ([views * batch, ...] as augment_views_transform
// leaves it; the view of row r is r / batch). Box-Muller on Philox words, in float.
BatchTransform gaussian_noise_transform(std::string field, double std, uint64_t seed);

}  // namespace mpigrad::data
