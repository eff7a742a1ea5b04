// ImageProcessor: preprocessor_config.json parsing, transformers' resize-size rule, padding and
// pixel_mask, on synthetic inputs (the fixture parity is in tests/parity/postprocess_parity_test).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/image/processor.h"

namespace {

using libreyolo::image::ImageProcessor;
using libreyolo::image::ProcessorConfig;
using libreyolo::image::size_with_aspect_ratio;
using HW = std::pair<int64_t, int64_t>;

TEST(ImageProcessor, SizeWithAspectRatioFollowsTransformers) {
  EXPECT_EQ(size_with_aspect_ratio(512, 512, 320, 512), HW(320, 320));
  EXPECT_EQ(size_with_aspect_ratio(400, 600, 320, 512), HW(320, 480));
  EXPECT_EQ(size_with_aspect_ratio(300, 451, 320, 512), HW(320, 481));  // int() truncates 481.07
  EXPECT_EQ(size_with_aspect_ratio(600, 400, 320, 512), HW(480, 320));
  // Long side capped: raw = 512*100/1000 = 51.2 -> short 51, long int(51.2*10) = 512.
  EXPECT_EQ(size_with_aspect_ratio(100, 1000, 320, 512), HW(51, 512));
  // Python round() is half-to-even: raw 2.5 -> 2 (half-up would give 3).
  EXPECT_EQ(size_with_aspect_ratio(1, 4, 3, 10), HW(2, 10));
  // Short side already right: unchanged.
  EXPECT_EQ(size_with_aspect_ratio(320, 700, 320, 1333), HW(320, 700));
  // No longest edge.
  EXPECT_EQ(size_with_aspect_ratio(480, 640, 800, 0), HW(800, 1066));
  // The short side rounds to 0 at 2 * longest_edge times longer than wide (raw 0.5, half to
  // even); one pixel less rounds to 1, which is the height already: the image stays as it is.
  EXPECT_EQ(size_with_aspect_ratio(1, 2665, 800, 1333), HW(1, 2665));
  try {
    size_with_aspect_ratio(1, 2666, 800, 1333);
    ADD_FAILURE() << "no error for a 1x2666 image";
  } catch (const c10::ValueError& e) {
    EXPECT_EQ(
        std::string(e.what_without_backtrace()),
        "ImageProcessor: an image of height 1 and width 2666 resizes to a short side of 0 pixels "
        "(shortest_edge 800, longest_edge 1333): its aspect ratio is too extreme");
  }
  EXPECT_THROW(size_with_aspect_ratio(40000, 1, 320, 512), c10::ValueError);
}

TEST(ImageProcessor, ConfigDefaultsFromProcessorType) {
  const auto rt =
      ProcessorConfig::from_json(R"({"image_processor_type": "RTDetrImageProcessor"})", "x");
  EXPECT_EQ(rt.height, 640);
  EXPECT_FALSE(rt.do_normalize);
  EXPECT_FALSE(rt.do_pad);
  const auto dd = ProcessorConfig::from_json(
      R"({"image_processor_type": "DeformableDetrImageProcessorFast"})", "x");
  EXPECT_EQ(dd.shortest_edge, 800);
  EXPECT_EQ(dd.longest_edge, 1333);
  EXPECT_TRUE(dd.do_pad);
  EXPECT_FLOAT_EQ(dd.image_std[2], 0.225f);
  const auto vit = ProcessorConfig::from_json(
      R"({"image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 48},
          "image_mean": [0.1, 0.2, 0.3]})",
      "x");
  EXPECT_EQ(vit.height, 32);
  EXPECT_EQ(vit.width, 48);
  EXPECT_FLOAT_EQ(vit.image_mean[1], 0.2f);
  EXPECT_FLOAT_EQ(vit.image_std[0], 0.5f);
}

std::string error_of(const std::string& json) {
  try {
    ProcessorConfig::from_json(json, "dir/preprocessor_config.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(ImageProcessor, ConfigErrorsNameFileAndKey) {
  EXPECT_EQ(error_of(R"({"image_processor_type": "CLIPImageProcessor"})"),
            "dir/preprocessor_config.json: image_processor_type \"CLIPImageProcessor\" is not "
            "supported (RTDetrImageProcessor, DeformableDetrImageProcessor, RfDetrImageProcessor, "
            "ViTImageProcessor, DeiTImageProcessor, YolosImageProcessor, OwlViTImageProcessor, "
            "Owlv2ImageProcessor)");
  // Fuzzing finding (model_config_fuzz's campaign, docs/FUZZING.md): a JSON-escaped newline in the
  // type made a two-line error; control characters are written as \xNN.
  EXPECT_EQ(error_of(R"({"image_processor_type": "A\nB"})"),
            "dir/preprocessor_config.json: image_processor_type \"A\\x0aB\" is not "
            "supported (RTDetrImageProcessor, DeformableDetrImageProcessor, RfDetrImageProcessor, "
            "ViTImageProcessor, DeiTImageProcessor, YolosImageProcessor, OwlViTImageProcessor, "
            "Owlv2ImageProcessor)");
  EXPECT_EQ(
      error_of(R"({"image_processor_type": "DeiTImageProcessor", "crop_size": {"height": 4}})"),
      "dir/preprocessor_config.json: crop_size must be an integer or {height, width}");
  EXPECT_EQ(error_of(R"({"image_processor_type": "DeiTImageProcessor", "crop_size": 0})"),
            "dir/preprocessor_config.json: crop_size must be from 1 to 65536 pixels, got 0");
  EXPECT_EQ(error_of(R"({"image_processor_type": "ViTImageProcessor", "do_center_crop": true})"),
            "dir/preprocessor_config.json: do_center_crop without a crop_size");
  EXPECT_EQ(error_of(R"({"size": 3})"),
            "dir/preprocessor_config.json: key \"image_processor_type\" is missing");
  EXPECT_EQ(error_of(R"({"image_processor_type": "ViTImageProcessor", "resample": 1})"),
            "dir/preprocessor_config.json: resample 1 is not supported (0 nearest, 2 bilinear, "
            "3 bicubic)");
  EXPECT_NE(error_of(R"({"image_processor_type": "ViTImageProcessor", "size": {"height": 4}})")
                .find("needs both height and width"),
            std::string::npos);
  // Fuzzing finding (model_config_fuzz): a huge edge overflowed the resize size arithmetic.
  EXPECT_EQ(error_of(R"({"image_processor_type": "DeformableDetrImageProcessor",
                         "size": {"shortest_edge": 9000000000000000000}})"),
            "dir/preprocessor_config.json: size.shortest_edge must be from 1 to 65536 pixels, got "
            "9000000000000000000");
  EXPECT_EQ(error_of(R"({"image_processor_type": "DeformableDetrImageProcessor",
                         "size": {"shortest_edge": 90000000000000000000}})"),
            "dir/preprocessor_config.json size: key \"shortest_edge\" must be an integer, got "
            "9e+19");
  EXPECT_EQ(error_of(R"({"image_processor_type": "ViTImageProcessor", "resample": 1e30})"),
            "dir/preprocessor_config.json: key \"resample\" must be an integer, got 1e+30");
  EXPECT_EQ(error_of(R"({"image_processor_type": "ViTImageProcessor", "size": 0})"),
            "dir/preprocessor_config.json: size must be from 1 to 65536 pixels, got 0");
  EXPECT_EQ(error_of(R"({"image_processor_type": "DeformableDetrImageProcessor",
                         "size": {"shortest_edge": 800}, "max_size": 65537})"),
            "dir/preprocessor_config.json: max_size must be from 1 to 65536 pixels, got 65537");
  EXPECT_EQ(
      ProcessorConfig::from_json(
          R"({"image_processor_type": "ViTImageProcessor", "size": {"height": 65536, "width": 1}})",
          "p.json")
          .height,
      65536);
  EXPECT_NE(error_of("{nope").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"image_processor_type": "ViTImageProcessor", "do_pad": "yes"})")
                .find("\"do_pad\" has a wrong type"),
            std::string::npos);
}

/// Owlv2ImageProcessor pads to a square before its blur: a thin image within the decoder's pixel
/// limit (9000 x 10 here; 40000 x 1000 would be 19 GB of float32) is refused naming both sizes,
/// and the largest accepted square still runs.
TEST(ImageProcessor, Owlv2RefusesSquaresItCannotAfford) {
  const auto v2 = ProcessorConfig::from_json(
      R"({"image_processor_type": "Owlv2ImageProcessor", "size": {"height": 16, "width": 16}})",
      "x");
  try {
    libreyolo::image::owlv2_pixel_values(v2, at::zeros({3, 10, 9000}, at::kByte));
    ADD_FAILURE() << "a 9000x9000 square was preprocessed";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "image 9000x10: Owlv2ImageProcessor pads it to a 9000x9000 square, larger than "
                 "the 8192x8192 this server preprocesses (resize it first)");
  }
  const auto ok = libreyolo::image::owlv2_pixel_values(v2, at::full({3, 40, 64}, 255, at::kByte));
  EXPECT_EQ(ok.sizes(), (std::vector<int64_t>{3, 16, 16}));
}

TEST(ImageProcessor, OwlViTAndOwlv2ClassDefaults) {
  // image_processing_owlvit.py: 768x768 bicubic, CLIP mean/std, no crop; image_processing_owlv2.py:
  // 960x960 bilinear, pad to a square, its own pipeline (owlv2_pixel_values).
  const auto v1 =
      ProcessorConfig::from_json(R"({"image_processor_type": "OwlViTImageProcessor"})", "x");
  EXPECT_EQ(v1.height, 768);
  EXPECT_EQ(v1.resample, 3);
  EXPECT_FALSE(v1.owlv2);
  EXPECT_FALSE(v1.do_pad);
  EXPECT_FLOAT_EQ(v1.image_mean[0], 0.48145466f);
  EXPECT_FLOAT_EQ(v1.image_std[2], 0.27577711f);
  const auto v2 =
      ProcessorConfig::from_json(R"({"image_processor_type": "Owlv2ImageProcessor"})", "x");
  EXPECT_EQ(v2.width, 960);
  EXPECT_EQ(v2.resample, 2);
  EXPECT_TRUE(v2.owlv2);
  EXPECT_TRUE(v2.do_pad);
  // The Hub's early OWL-ViT files name do_rescale "rescale".
  EXPECT_FALSE(ProcessorConfig::from_json(
                   R"({"feature_extractor_type": "OwlViTFeatureExtractor", "rescale": false})", "x")
                   .do_rescale);
  EXPECT_EQ(error_of(R"({"image_processor_type": "Owlv2ImageProcessor", "do_center_crop": true,
                         "crop_size": 4})"),
            "dir/preprocessor_config.json: do_center_crop is not supported for "
            "Owlv2ImageProcessor");
}

TEST(ImageProcessor, DeiTDefaultsResizeThenCenterCrop) {
  // transformers 5.17 DeiTImageProcessor: 256x256 bicubic, center crop 224, mean = std = 0.5;
  // the Hub's legacy ints (size 256, crop_size 224) are squares.
  const auto d =
      ProcessorConfig::from_json(R"({"image_processor_type": "DeiTImageProcessor"})", "x");
  EXPECT_EQ(d.height, 256);
  EXPECT_EQ(d.width, 256);
  EXPECT_EQ(d.resample, 3);
  EXPECT_TRUE(d.do_center_crop);
  EXPECT_EQ(d.crop_height, 224);
  EXPECT_EQ(d.crop_width, 224);
  EXPECT_FLOAT_EQ(d.image_mean[0], 0.5f);
  const auto legacy = ProcessorConfig::from_json(
      R"({"image_processor_type": "DeiTImageProcessor", "size": 192, "crop_size": 160})", "x");
  EXPECT_EQ(legacy.height, 192);
  EXPECT_EQ(legacy.width, 192);
  EXPECT_EQ(legacy.crop_height, 160);
  EXPECT_EQ(legacy.crop_width, 160);
  const ImageProcessor proc(legacy);
  EXPECT_EQ(proc.output_size(480, 640), HW(160, 160));
  const auto out = proc.preprocess({at::full({3, 300, 200}, 77, at::kByte)});
  ASSERT_EQ(out.pixel_u8.sizes(), (std::vector<int64_t>{1, 3, 160, 160}));
  EXPECT_TRUE(at::all(out.pixel_u8.eq(77)).item<bool>());
  // ViT and the others keep no crop.
  const auto vit =
      ProcessorConfig::from_json(R"({"image_processor_type": "ViTImageProcessor"})", "x");
  EXPECT_FALSE(vit.do_center_crop);
  EXPECT_EQ(ImageProcessor(vit).output_size(480, 640), HW(224, 224));
}

TEST(ImageProcessor, CenterCropWindowAndPaddingFollowTorchvisionBackend) {
  auto crop = [](int64_t ch, int64_t cw) {
    return ImageProcessor(ProcessorConfig::from_json(
        R"({"image_processor_type": "DeiTImageProcessor", "do_resize": false, "crop_size": {"height": )" +
            std::to_string(ch) + R"(, "width": )" + std::to_string(cw) + "}}",
        "x"));
  };
  const at::Tensor im = at::arange(3 * 5 * 7, at::kInt).to(at::kByte).view({3, 5, 7});
  // Smaller crop: top = int((5 - 3) / 2) = 1, left = int((7 - 4) / 2) = 1.
  const auto a = crop(3, 4).center_crop(im);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{3, 3, 4}));
  EXPECT_TRUE(at::equal(a, im.slice(1, 1, 4).slice(2, 1, 5)));
  // Larger both ways: zero padding left (8 - 7) // 2 = 0, right 1, top (8 - 5) // 2 = 1,
  // bottom 2, and the padded image is the crop.
  const auto b = crop(8, 8).center_crop(im);
  ASSERT_EQ(b.sizes(), (std::vector<int64_t>{3, 8, 8}));
  EXPECT_TRUE(at::equal(b.slice(1, 1, 6).slice(2, 0, 7), im));
  EXPECT_EQ(b.sum().item<int64_t>(), im.to(at::kLong).sum().item<int64_t>());
  // Taller crop, narrower: pad top 1 / bottom 2 to 8 rows, then left = int((7 - 3) / 2) = 2.
  const auto c = crop(8, 3).center_crop(im);
  ASSERT_EQ(c.sizes(), (std::vector<int64_t>{3, 8, 3}));
  EXPECT_TRUE(at::equal(c.slice(1, 1, 6), im.slice(2, 2, 5)));
  EXPECT_EQ(c.slice(1, 0, 1).sum().item<int64_t>(), 0);
  // A batch of different sizes is one size after the crop (no do_pad needed).
  const auto out = crop(4, 4).preprocess({im, at::zeros({3, 9, 6}, at::kByte)});
  EXPECT_EQ(out.pixel_u8.sizes(), (std::vector<int64_t>{2, 3, 4, 4}));
  EXPECT_FALSE(out.pixel_mask.defined());
}

TEST(ImageProcessor, PadsBottomRightWithMask) {
  auto cfg = ProcessorConfig::from_json(
      R"({"image_processor_type": "DeformableDetrImageProcessor",
          "size": {"shortest_edge": 4, "longest_edge": 8}})",
      "x");
  const ImageProcessor proc(cfg);
  const at::Tensor a = at::full({3, 4, 4}, 200, at::kByte);  // stays 4x4 (already short == 4)
  const at::Tensor b = at::full({3, 2, 4}, 100, at::kByte);  // 2x4 -> 4x8
  const auto out = proc.preprocess({a, b});
  ASSERT_EQ(out.pixel_values.sizes(), (std::vector<int64_t>{2, 3, 4, 8}));
  ASSERT_EQ(out.pixel_mask.sizes(), (std::vector<int64_t>{2, 4, 8}));
  EXPECT_EQ(out.pixel_mask[0].sum().item<int64_t>(), 16);
  EXPECT_EQ(out.pixel_mask[0][3][3].item<int64_t>(), 1);
  EXPECT_EQ(out.pixel_mask[0][3][4].item<int64_t>(), 0);
  EXPECT_EQ(out.pixel_mask[1].sum().item<int64_t>(), 32);
  EXPECT_EQ(out.pixel_values[0][1][0][7].item<float>(), 0.0f);  // padding is 0 after normalize
  // A constant image stays constant through the antialiased resize.
  EXPECT_TRUE(at::all(out.pixel_u8[1].eq(100)).item<bool>());
  const float want = (200.0f - 0.456f * 255.0f) / (0.224f * 255.0f);
  EXPECT_EQ(out.pixel_values[0][1][2][2].item<float>(), want);
  EXPECT_EQ(out.original_sizes[1], HW(2, 4));
}

TEST(ImageProcessor, RejectsBadImagesAndUnpaddableBatches) {
  const ImageProcessor vit(ProcessorConfig::from_json(
      R"({"image_processor_type": "ViTImageProcessor", "do_resize": false})", "x"));
  EXPECT_THROW(vit.preprocess({}), std::invalid_argument);
  EXPECT_THROW(vit.preprocess({at::zeros({4, 2, 2}, at::kByte)}), std::invalid_argument);
  EXPECT_THROW(vit.preprocess({at::zeros({3, 2, 2}, at::kFloat)}), std::invalid_argument);
  EXPECT_THROW(vit.preprocess({at::zeros({3, 2, 2}, at::kByte), at::zeros({3, 2, 3}, at::kByte)}),
               std::invalid_argument);
}

TEST(ImageProcessor, ResizePathsAgreeWithinOne) {
  // Native uint8 and float32 -> round antialiased bilinear differ by at most 1.
  const at::Tensor img =
      at::randint(0, 256, {3, 61, 83}, at::TensorOptions().dtype(at::kByte)).contiguous();
  auto cfg = ProcessorConfig::from_json(R"({"image_processor_type": "ViTImageProcessor"})", "x");
  cfg.uint8_resize = ProcessorConfig::Uint8Resize::native_uint8;
  const at::Tensor a = ImageProcessor(cfg).resize(img);
  cfg.uint8_resize = ProcessorConfig::Uint8Resize::float32_round;
  const at::Tensor b = ImageProcessor(cfg).resize(img);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{3, 224, 224}));
  const int d = (a.to(at::kInt) - b.to(at::kInt)).abs().max().item<int>();
  std::cout << "native uint8 vs float32+round resize: max |diff| " << d << "\n";
  EXPECT_LE(d, 1);
}

// to_chw_tensor hands out the decoder's interleaved buffer as a (3, H, W) view (ATen's uint8
// resize reads it faster than planes); every processor path gives the values and the
// contiguous layout the planar copy gave, byte for byte.
TEST(ImageProcessor, InterleavedDecodedViewPreprocessesAsPlanes) {
  libreyolo::image::RgbImage rgb;
  rgb.height = 37;
  rgb.width = 53;
  rgb.rgb.resize(static_cast<size_t>(rgb.height * rgb.width * 3));
  for (size_t i = 0; i < rgb.rgb.size(); ++i)
    rgb.rgb[i] = static_cast<uint8_t>((i * 97 + 13) % 251);
  const at::Tensor view = libreyolo::image::to_chw_tensor(rgb);
  EXPECT_EQ(view.sizes(), at::IntArrayRef({3, 37, 53}));
  EXPECT_EQ(view.strides(), at::IntArrayRef({1, 53 * 3, 3}));
  EXPECT_EQ(view[2][1][4].item<int>(), rgb.rgb[(1 * 53 + 4) * 3 + 2]);
  const at::Tensor planes = view.contiguous();
  const std::string bases[] = {
      R"("image_processor_type": "RTDetrImageProcessor", "size": {"height": 64, "width": 48})",
      R"("image_processor_type": "ViTImageProcessor", "size": {"height": 24, "width": 24},
         "resample": 3)",
      R"("image_processor_type": "DetrImageProcessor",
         "size": {"shortest_edge": 40, "longest_edge": 60})",
      R"("image_processor_type": "RTDetrImageProcessor", "size": {"height": 64, "width": 48},
         "resample": 0)",
      R"("image_processor_type": "RTDetrImageProcessor", "do_resize": false)"};
  // Every CPU resize kernel: antialiased uint8 bilinear / bicubic, nearest, none (above), plain
  // bicubic (PP-DocLayout), plain bilinear, float32 then round.
  std::vector<ProcessorConfig> configs;
  for (const auto& base : bases)
    configs.push_back(ProcessorConfig::from_json("{" + base + "}", "x"));
  configs.push_back(ProcessorConfig::from_json(
      R"({"image_processor_type": "PPDocLayoutV3ImageProcessor", "size": {"height": 40, "width": 72}})",
      "x"));
  configs.push_back(configs.front());
  configs.back().antialias = false;
  configs.push_back(configs.front());
  configs.back().uint8_resize = ProcessorConfig::Uint8Resize::float32_round;
  for (const auto& config : configs) {
    const std::string label = "resample " + std::to_string(config.resample) + " antialias " +
                              std::to_string(config.antialias) + " uint8_resize " +
                              std::to_string(static_cast<int>(config.uint8_resize)) +
                              " do_resize " + std::to_string(config.do_resize);
    const ImageProcessor p(config);
    const auto a = p.preprocess({view});
    const auto b = p.preprocess({planes});
    EXPECT_TRUE(a.pixel_u8.is_contiguous()) << label;
    EXPECT_TRUE(a.pixel_values.is_contiguous()) << label;
    EXPECT_TRUE(at::equal(a.pixel_u8, b.pixel_u8)) << label;
    EXPECT_TRUE(at::equal(a.pixel_values, b.pixel_values)) << label;
  }
}

}  // namespace
