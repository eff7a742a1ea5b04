// The `image_preprocess` slot without a GPU (kernels/image/image_preprocess.h,
// models/image/preprocess_slot.h): the spec an image processor gives the slot, the exact reason
// the `cuda` implementation declines each processor step it does not do as the processor does,
// and the portable path every declined call takes (the processor's own numbers, counted per
// reason in the binding), into outputs of the model's dtype and of a larger size. The kernel
// itself: tests/gpu/image_preprocess_cuda_test.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/image/image_preprocess.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/image/preprocess_slot.h"
#include "models/image/processor.h"

namespace libreyolo::kernels {
namespace {

namespace image = libreyolo::image;

at::Tensor photo(const std::string& name) {
  return image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" + name);
}

image::ImageProcessor processor(const std::string& json) {
  return image::ImageProcessor(image::ProcessorConfig::from_json(json, "test"));
}

const char* const kRtDetr64 =
    R"({"image_processor_type": "RTDetrImageProcessor", "size": {"height": 64, "width": 64}})";
const char* const kDetr64 =
    R"({"image_processor_type": "DetrImageProcessor",
        "size": {"shortest_edge": 64, "longest_edge": 100}})";

/// What the `cuda` implementation does on a machine without its kernel: decline with the real
/// predicate's reason (a CPU output is always one).
Outcome<at::Tensor> predicate_only(const std::vector<at::Tensor>& images,
                                   const ImagePreprocessSpec& spec, const at::Tensor& out) {
  const char* why = image_preprocess_decline_reason(images, spec, out);
  if (why == nullptr) ADD_FAILURE() << "a CPU output was accepted";
  return Decline{why ? why : "accepted"};
}

std::map<std::string, std::uint64_t> declines(Registry& reg) {
  for (const auto& b : reg.bindings())
    if (b.slot == kImagePreprocess.name)
      for (const auto& c : b.candidates)
        if (c.name == "cuda") return c.declined;
  return {};
}

TEST(ImagePreprocessSlot, SpecCarriesTheProcessorsNumbers) {
  const auto im = photo("jpeg_set/q90_420_161x97.jpg");  // (3, 97, 161)
  const auto rt = image::preprocess_spec(processor(kRtDetr64), {im});
  ASSERT_EQ(rt.sizes.size(), 1u);
  EXPECT_EQ(rt.sizes[0], (std::pair<int64_t, int64_t>{64, 64}));
  EXPECT_EQ(rt.values, ImagePreprocessSpec::Values::rescale);
  EXPECT_EQ(rt.rescale_factor, static_cast<float>(1.0 / 255.0));
  const auto detr = image::preprocess_spec(processor(kDetr64), {im});
  EXPECT_EQ(detr.sizes[0], (std::pair<int64_t, int64_t>{60, 100}));  // longest edge 100 wins
  EXPECT_EQ(detr.values, ImagePreprocessSpec::Values::normalize);
  EXPECT_EQ(detr.mean_scaled[0], 0.485f * 255.0f);
  EXPECT_EQ(detr.std_scaled[2], 0.225f * 255.0f);
  // RF-DETR: the rescale before the resize, then the unscaled ImageNet mean and std.
  const auto rf =
      image::preprocess_spec(processor(R"({"image_processor_type": "RfDetrImageProcessor",
                    "size": {"height": 64, "width": 64}})"),
                             {im});
  EXPECT_TRUE(rf.rescale_before_resize);
  EXPECT_EQ(rf.values, ImagePreprocessSpec::Values::normalize);
  EXPECT_EQ(rf.rescale_factor, static_cast<float>(1.0 / 255.0));
  EXPECT_EQ(rf.mean[0], 0.485f);
  EXPECT_EQ(rf.std[2], 0.225f);
  const auto rf_raw = image::preprocess_spec(
      processor(R"({"image_processor_type": "RfDetrImageProcessor", "do_rescale": false,
                    "do_normalize": false, "size": {"height": 64, "width": 64}})"),
      {im});
  EXPECT_EQ(rf_raw.values, ImagePreprocessSpec::Values::raw);
  EXPECT_EQ(rf_raw.rescale_factor, 1.0f);
  const auto rf_unscaled = image::preprocess_spec(
      processor(R"({"image_processor_type": "RfDetrImageProcessor", "do_rescale": false,
                    "size": {"height": 64, "width": 64}})"),
      {im});
  EXPECT_EQ(rf_unscaled.values, ImagePreprocessSpec::Values::normalize);
  EXPECT_EQ(rf_unscaled.rescale_factor, 1.0f);
  EXPECT_EQ(rf_unscaled.mean[1], 0.456f);  // unscaled: no 1 / rescale_factor without do_rescale
  EXPECT_EQ(rf_unscaled.std[0], 0.229f);
  // ATen's support widths: an upscale and a 1:1 resize take 3 taps, 150x down 301.
  EXPECT_EQ(resize_taps(480, 640), 3);
  EXPECT_EQ(resize_taps(640, 640), 3);
  EXPECT_EQ(resize_taps(96000, 640), 301);
  EXPECT_EQ(resize_taps(96001, 640), 303);
}

TEST(ImagePreprocessSlot, DeclinesEachStepItDoesNotDoAsTheProcessor) {
  const std::vector<at::Tensor> images = {photo("jpeg_set/q90_420_48x32.jpg")};
  const at::Tensor cpu_out = at::empty({1, 3, 64, 64});
  auto reason = [&](const std::string& json, auto&& edit) -> std::string {
    auto config = image::ProcessorConfig::from_json(json, "test");
    edit(config);
    const image::ImageProcessor p(config);
    const char* why =
        image_preprocess_decline_reason(images, image::preprocess_spec(p, images), cpu_out);
    return why ? why : "taken";
  };
  auto as_is = [](image::ProcessorConfig&) {};
  EXPECT_EQ(reason(kRtDetr64, as_is),
            "cuda: output not a CUDA float32/float16/bfloat16 tensor, contiguous or "
            "channels_last");
  EXPECT_EQ(reason(R"({"image_processor_type": "DeiTImageProcessor"})", as_is),
            "cuda: center crop");
  // RF-DETR's rescale before the resize is taken: only the CPU output declines it.
  EXPECT_EQ(reason(R"({"image_processor_type": "RfDetrImageProcessor"})", as_is),
            "cuda: output not a CUDA float32/float16/bfloat16 tensor, contiguous or "
            "channels_last");
  EXPECT_EQ(reason(R"({"image_processor_type": "Owlv2ImageProcessor"})", as_is),
            "cuda: Owlv2ImageProcessor pipeline");
  EXPECT_EQ(reason(R"({"image_processor_type": "PPDocLayoutV3ImageProcessor"})", as_is),
            "cuda: resample is not bilinear");
  EXPECT_EQ(reason(kRtDetr64, [](image::ProcessorConfig& c) { c.resample = 0; }),
            "cuda: resample is not bilinear");
  EXPECT_EQ(reason(kRtDetr64, [](image::ProcessorConfig& c) { c.antialias = false; }),
            "cuda: resize without antialias");
  EXPECT_EQ(reason(kRtDetr64,
                   [](image::ProcessorConfig& c) {
                     c.uint8_resize = image::ProcessorConfig::Uint8Resize::native_uint8;
                   }),
            "cuda: native uint8 resize (CPU numerics)");
}

TEST(ImagePreprocessSlot, DeclinedCallsTakeTheProcessorsPathCountedPerReason) {
  Registry reg;
  register_builtin_slots(reg);
  reg.register_impl(kImagePreprocess, "cuda", ImagePreprocessImpl(&predicate_only));
  BindContext ctx;
  ctx.model = "m";
  const auto handle = reg.bind(kImagePreprocess, ctx);
  ASSERT_FALSE(handle.empty());
  const std::vector<at::Tensor> images = {photo("jpeg_set/q90_420_161x97.jpg"),
                                          photo("jpeg_set/q90_420_48x32.jpg")};
  // Exact resize (RT-DETR): the processor's float32 values, and their bfloat16 rounding.
  const auto rt = processor(kRtDetr64);
  const at::Tensor expected = rt.preprocess(images).pixel_values;
  const auto f32 = image::preprocess(handle, rt, images, at::kFloat);
  EXPECT_TRUE(at::equal(f32.pixel_values, expected));
  EXPECT_FALSE(f32.pixel_mask.defined());
  EXPECT_EQ(f32.original_sizes, (std::vector<std::pair<int64_t, int64_t>>{{97, 161}, {32, 48}}));
  const auto bf16 =
      image::preprocess(handle, rt, images, at::kBFloat16, at::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(bf16.pixel_values.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(bf16.pixel_values, expected.to(at::kBFloat16)));
  // Aspect-preserving resize + pad (DETR): the same padding and pixel_mask.
  const auto detr = processor(kDetr64);
  const auto want = detr.preprocess(images);
  const auto got = image::preprocess(handle, detr, images, at::kFloat);
  EXPECT_TRUE(at::equal(got.pixel_values, want.pixel_values));
  EXPECT_TRUE(at::equal(got.pixel_mask, want.pixel_mask));
  // Center crop declines before the output is looked at.
  const auto deit = processor(R"({"image_processor_type": "DeiTImageProcessor"})");
  EXPECT_TRUE(at::equal(image::preprocess(handle, deit, {images[0]}, at::kFloat).pixel_values,
                        deit.preprocess({images[0]}).pixel_values));
  const std::map<std::string, std::uint64_t> counted = {
      {"cuda: center crop", 1},
      {"cuda: output not a CUDA float32/float16/bfloat16 tensor, contiguous or channels_last", 3}};
  EXPECT_EQ(declines(reg), counted);
}

TEST(ImagePreprocessSlot, PortablePathFillsALargerOutputAndChecksItsShape) {
  const image::ImageProcessor rt = processor(kRtDetr64);
  const std::vector<at::Tensor> images = {photo("jpeg_set/q90_420_48x32.jpg")};
  const at::Tensor out = at::full({1, 3, 70, 80}, 7.0f, at::kHalf);
  image::preprocess_into(ImagePreprocessHandle(), rt, images, out);
  EXPECT_TRUE(at::equal(out.narrow(2, 0, 64).narrow(3, 0, 64),
                        rt.preprocess(images).pixel_values.to(at::kHalf)));
  EXPECT_EQ(out.narrow(2, 64, 6).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(out.narrow(3, 64, 16).abs().sum().item<float>(), 0.0f);
  auto message = [&](const at::Tensor& o) -> std::string {
    try {
      image::preprocess_into(ImagePreprocessHandle(), rt, images, o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message(at::empty({2, 3, 64, 64})),
            "preprocess_into: the output must be (1, 3, H, W), got [2, 3, 64, 64]");
  EXPECT_EQ(message(at::empty({1, 3, 64, 63})),
            "preprocess_into: image 0 processes to 64x64, larger than the output's 64x63");
}

TEST(ImagePreprocessSlot, ProcessRegistryDeclaresTheSlot) {
  auto& reg = Registry::process_default();
  reg.resolve();
  const auto active = reg.active();
  ASSERT_EQ(active.count("image_preprocess"), 1u);
  // The `cuda` provider loads only with a device: without one the portable path serves.
  if (at::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present (tests/gpu covers it)";
  EXPECT_EQ(active.at("image_preprocess"), kUnavailable);
}

}  // namespace
}  // namespace libreyolo::kernels
