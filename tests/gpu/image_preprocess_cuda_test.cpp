// The `cuda` image_preprocess (kernels/image/cuda/image_preprocess_cuda.h) against the portable
// path on the same CUDA pixels (the image processor's ATen ops on the GPU, then .to(dtype)):
// the fixture photographs (512x512, 451x300, 600x400) and the small committed JPEGs (48x32,
// 161x97, 256x192), in one call per batch, for RT-DETR's exact 640x640 resize (rescale only, and
// with ImageNet normalisation), a non-square downscale, a 23x37 resize (a 14-22x downscale), and
// DETR's aspect-preserving resize with padding and pixel_mask, RF-DETR's rescale before the
// resize (fixed 384x384, padded, rescale only, normalise only); float32, float16, bfloat16 into
// contiguous and channels_last outputs; more images than one launch takes. The kernel repeats
// ATen's float32 resize operation for operation, so the uint8 values it rounds should be the
// same: each case prints the largest difference and the share of differing values, and fails
// above one uint8 level in output units or 0.1% of the values; RF-DETR's cases, which round no
// uint8, fail on any difference. Declines (a CPU image) and
// LIBREYOLO_KERNELS=off run the portable path. Skips without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/image/cuda/image_preprocess_cuda.h"
#include "kernels/image/image_preprocess.h"
#include "models/image/preprocess_slot.h"
#include "models/image/processor.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

namespace image = libreyolo::image;

std::vector<at::Tensor> on_gpu(const std::vector<std::string>& names) {
  std::vector<at::Tensor> out;
  for (const auto& n : names)
    out.push_back(
        image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" + n)
            .contiguous()  // planes, as nvJPEG writes them (decode_image's view is interleaved)
            .cuda());
  return out;
}

const std::vector<std::string> kPhotos = {"astronaut.jpg",
                                          "chelsea.jpg",
                                          "coffee.jpg",
                                          "jpeg_set/q90_420_48x32.jpg",
                                          "jpeg_set/q90_420_161x97.jpg",
                                          "jpeg_set/q90_444_256x192.jpg"};

struct Case {
  const char* name;
  const char* json;
  double level;        ///< one uint8 level in output units: rescale_factor, or 1 / (255 * min std)
  bool exact = false;  ///< every value equal (RF-DETR's order rounds no uint8)
};

const Case kCases[] = {
    {"rtdetr_640", R"({"image_processor_type": "RTDetrImageProcessor"})", 1.0 / 255},
    {"rtdetr_640_imagenet",
     R"({"image_processor_type": "RTDetrImageProcessor", "do_normalize": true})",
     1.0 / (255 * 0.224)},
    {"rtdetr_320x256",
     R"({"image_processor_type": "RTDetrImageProcessor", "size": {"height": 256, "width": 320}})",
     1.0 / 255},
    {"rtdetr_23x37",
     R"({"image_processor_type": "RTDetrImageProcessor", "size": {"height": 23, "width": 37}})",
     1.0 / 255},
    {"detr_pad", R"({"image_processor_type": "DetrImageProcessor"})", 1.0 / (255 * 0.224)},
    // RF-DETR's rescale before the resize rounds nothing to uint8 and repeats the ATen path's
    // float32 operations one by one: every value equal (H100, 2026-12-07: max |diff| 0).
    {"rfdetr_384",
     R"({"image_processor_type": "RfDetrImageProcessor", "size": {"height": 384, "width": 384}})",
     0, true},
    {"rfdetr_pad", R"({"image_processor_type": "RfDetrImageProcessor"})", 0, true},
    {"rfdetr_rescale_only",
     R"({"image_processor_type": "RfDetrImageProcessor", "do_normalize": false,
         "size": {"height": 384, "width": 384}})",
     0, true},
    {"rfdetr_normalize_only",
     R"({"image_processor_type": "RfDetrImageProcessor", "do_rescale": false,
         "size": {"height": 384, "width": 384}})",
     0, true},
};

/// Calls of `cuda` for image_preprocess made while `f` runs.
template <class F>
std::uint64_t cuda_calls(F&& f) {
  CallRecording rec;
  f();
  return rec.calls().of(kImagePreprocess.name, "cuda");
}

TEST(ImagePreprocessCuda, MatchesTheProcessorsAtenPathOnTheGpu) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kImagePreprocess, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  const auto images = on_gpu(kPhotos);
  for (const auto& c : kCases) {
    const image::ImageProcessor p(image::ProcessorConfig::from_json(c.json, c.name));
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      for (auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
        const auto want = image::preprocess(ImagePreprocessHandle(), p, images, dtype, format);
        image::ProcessorOutput got;
        EXPECT_EQ(cuda_calls([&] { got = image::preprocess(handle, p, images, dtype, format); }),
                  1u)
            << c.name;
        ASSERT_EQ(got.pixel_values.sizes(), want.pixel_values.sizes()) << c.name;
        EXPECT_EQ(got.pixel_values.scalar_type(), dtype);
        EXPECT_TRUE(got.pixel_values.is_contiguous(format));
        if (want.pixel_mask.defined()) EXPECT_TRUE(at::equal(got.pixel_mask, want.pixel_mask));
        const auto diff =
            (got.pixel_values.to(at::kFloat) - want.pixel_values.to(at::kFloat)).abs();
        const double max = diff.max().item<double>();
        const double share = diff.gt(0).sum().item<double>() / static_cast<double>(diff.numel());
        std::cout << "[ image_preprocess ] " << c.name << " " << c10::toString(dtype)
                  << (format == at::MemoryFormat::ChannelsLast ? " channels_last" : " contiguous")
                  << ": max |diff| " << max << ", differing " << share * 100 << " %\n";
        // One uint8 level, and the output dtype's rounding of the largest value (|v| < 3).
        const double ulp = dtype == at::kBFloat16 ? 1.0 / 64 : dtype == at::kHalf ? 1.0 / 512 : 0;
        if (c.exact) {
          EXPECT_EQ(max, 0.0) << c.name << " " << dtype;
          continue;
        }
        EXPECT_LE(max, c.level + ulp) << c.name << " " << dtype;
        EXPECT_LE(share, 1e-3) << c.name << " " << dtype;
      }
    }
  }
}

TEST(ImagePreprocessCuda, MoreImagesThanOneLaunchAndALargerOutput) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kImagePreprocess, test::cuda_context());
  const image::ImageProcessor p(image::ProcessorConfig::from_json(
      R"({"image_processor_type": "RTDetrImageProcessor", "size": {"height": 64, "width": 64}})",
      "test"));
  const auto small = on_gpu({"jpeg_set/q90_420_48x32.jpg", "jpeg_set/q90_420_161x97.jpg"});
  std::vector<at::Tensor> images;
  for (int i = 0; i < 2 * cuda::kMaxImagesPerLaunch + 3; ++i) images.push_back(small[i % 2]);
  const auto want = image::preprocess(ImagePreprocessHandle(), p, images, at::kBFloat16);
  // A batch buffer larger than the images' size: their rows top-left, zeros around.
  const auto out = at::full({static_cast<int64_t>(images.size()), 3, 70, 72}, 9.0,
                            at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
  EXPECT_EQ(cuda_calls([&] { image::preprocess_into(handle, p, images, out); }), 1u);
  const auto inner = out.narrow(2, 0, 64).narrow(3, 0, 64).to(at::kFloat);
  EXPECT_LE((inner - want.pixel_values.to(at::kFloat)).abs().max().item<double>(),
            1.0 / 255 + 1.0 / 64);
  EXPECT_EQ(out.narrow(2, 64, 6).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(out.narrow(3, 64, 8).abs().sum().item<float>(), 0.0f);
}

TEST(ImagePreprocessCuda, ACpuImageAndKernelsOffTakeThePortablePath) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  BindContext ctx = test::cuda_context();
  ctx.model = "m";
  const auto handle = reg.bind(kImagePreprocess, ctx);
  const image::ImageProcessor p(image::ProcessorConfig::from_json(
      R"({"image_processor_type": "RTDetrImageProcessor", "size": {"height": 64, "width": 64}})",
      "test"));
  const auto cpu = on_gpu({"jpeg_set/q90_420_48x32.jpg"})[0].cpu();  // a decline's pixels
  const auto out = at::empty({1, 3, 64, 64}, at::TensorOptions().device(at::kCUDA));
  EXPECT_EQ(cuda_calls([&] { image::preprocess_into(handle, p, {cpu}, out); }), 0u);
  test::expect_calls_and_declines(reg, kImagePreprocess.name, "cuda", 0, {{kPreprocessImage, 1}});
  EXPECT_TRUE(at::equal(out.cpu(), p.preprocess({cpu}).pixel_values));
  Filter off;
  off.mode = Filter::Mode::reference_only;  // LIBREYOLO_KERNELS=off
  EXPECT_TRUE(reg.bind(kImagePreprocess, ctx, &off).empty());
  // The process's registry binds `cuda` where a device is usable (/active shows it).
  auto& process = Registry::process_default();
  process.resolve();
  EXPECT_EQ(process.resolve(kImagePreprocess.name), std::optional<std::string>("cuda"));
}

}  // namespace
}  // namespace libreyolo::kernels
