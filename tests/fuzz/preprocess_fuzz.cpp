// libFuzzer target: images -> pixel_values as the daemon runs it for each processor type
// (models/image/processor.cpp with the fixtures' preprocessor_config.json files:
// RTDetrImageProcessor (rtdetr_tiny), DeformableDetrImageProcessor (deformable_detr_tiny, with
// padding and pixel_mask), ViTImageProcessor (vit_tiny), DeiTImageProcessor (deit_tiny: resize
// then center crop), LW-DETR's DeformableDetrImageProcessor at a fixed size (lw_detr_tiny)).
// The first byte picks the processor (byte % 5 in that order), the rest is the encoded image,
// decoded with the daemon's options.
// A decoded image either preprocesses into tensors of the size output_size() announces, finite
// and in range, or fails as the core accepts it (c10::Error: INVALID_ARGUMENT "cannot be
// preprocessed", ServerCore::infer_on); crashes, sanitizer reports, other exceptions and wrong
// shapes are bugs. Seed corpus: tests/fuzz/corpus/preprocess/ (make_seeds.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "models/image/processor.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/torch_support.h"

namespace {

using namespace libreyolo::image;
using libreyolo::fuzz::fail;

constexpr int64_t kMaxPixels = int64_t{1} << 22;  // as image_decode_fuzz: the daemon's check

const std::vector<ImageProcessor>& processors() {
  static const std::vector<ImageProcessor> p = [] {
    std::vector<ImageProcessor> v;
    for (const char* m :
         {"rtdetr_tiny", "deformable_detr_tiny", "vit_tiny", "deit_tiny", "lw_detr_tiny"})
      v.emplace_back(ProcessorConfig::from_file(libreyolo::fuzz::fixtures() + "/models/" + m +
                                                "/preprocessor_config.json"));
    return v;
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  (void)processors();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const ImageProcessor& processor = processors()[data[0] % processors().size()];
  DecodeOptions options;
  options.max_pixels = kMaxPixels;
  at::Tensor image;
  try {
    image = decode_image(data + 1, size - 1, options);
  } catch (const ImageError&) {
    return 0;
  }
  const int64_t h = image.size(1), w = image.size(2);
  ProcessorOutput out;
  try {
    out = processor.preprocess({image});
  } catch (const c10::Error&) {
    return 0;  // what the core answers INVALID_ARGUMENT (an image too thin to resize)
  }
  const auto [oh, ow] = processor.output_size(h, w);
  const auto& c = processor.config();
  if (out.pixel_values.sizes() != at::IntArrayRef({1, 3, oh, ow}))
    fail("pixel_values shape differs from output_size()");
  if (out.pixel_u8.sizes() != out.pixel_values.sizes()) fail("pixel_u8 shape");
  if (out.pixel_values.scalar_type() != at::kFloat) fail("pixel_values dtype");
  if (out.original_sizes.size() != 1 || out.original_sizes[0] != std::make_pair(h, w))
    fail("original_sizes");
  if (c.do_pad != out.pixel_mask.defined()) fail("pixel_mask defined iff do_pad");
  if (out.pixel_mask.defined() && !out.pixel_mask.eq(1).all().item<bool>())
    fail("one image: every pixel is real");
  if (!at::isfinite(out.pixel_values).all().item<bool>()) fail("non-finite pixel_values");
  return 0;
}
