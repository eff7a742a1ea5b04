// YOLOS (transformers 5.17 YolosForObjectDetection) against two fixtures
// (tests/fixtures/models/yolos_tiny/make_fixtures.py): yolos_tiny (no mid-position embeddings,
// YolosImageProcessor's 5.17 preprocessor_config.json) and yolos_tiny_mid
// (use_mid_position_embeddings, the Hub's legacy YolosFeatureExtractor file). Each is a batch of
// two photographs resized to 112x112 and 96x160 (multiples of 16) and padded to 112x160; the
// model (image_size 64x96) resamples its position embeddings to that grid. Inputs are the stored
// pixels recovered exactly.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include "models/image/decode.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

const char* const kFixtures[] = {"yolos_tiny", "yolos_tiny_mid"};

std::vector<std::pair<int64_t, int64_t>> sizes_of(const std::string& dir, const char* key) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  const auto meta = test::read_json(dir + "/meta.json");  // outlives the loop
  for (const auto& hw : meta.at(key)) sizes.emplace_back(hw[0], hw[1]);
  return sizes;
}

std::vector<at::Tensor> fixture_images(const std::string& dir) {
  std::vector<at::Tensor> images;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  return images;
}

class YolosParity : public ::testing::TestWithParam<const char*> {};

TEST_P(YolosParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "yolos");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label().size(), 5u);
  EXPECT_EQ(model->description().head, image::DetectionHead::detr);
  const auto pixels = test::normalized_pixels(dir);
  ASSERT_EQ(pixels.sizes(), (at::IntArrayRef{2, 3, 112, 160}));
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = model->forward(pixels);
    // logits (B, detection tokens, num_labels + 1): the last class is "no object".
    ASSERT_EQ(out.logits.sizes(), (at::IntArrayRef{2, 10, 6}));
    const std::string label = std::string(GetParam()) + (fused ? " sdpa" : " manual");
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits"),
                                        test::expected_tensor(dir, "pred_boxes"), label);
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits_eager"),
                                        test::expected_tensor(dir, "pred_boxes_eager"),
                                        label + " vs transformers eager");
  }
  // YolosForObjectDetection takes no pixel_mask: a given one changes nothing.
  const auto mask = at::zeros({2, 112, 160}, at::kLong);
  EXPECT_TRUE(at::equal(model->forward(pixels, mask).logits, model->forward(pixels).logits));
}

TEST_P(YolosParity, PostProcessingMatchesTransformers) {
  // YolosImageProcessor.post_process_object_detection (DETR's: softmax, "no object" dropped,
  // score > threshold, query order) of our outputs against transformers' of its outputs.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  auto model = models::load_model(dir);
  const auto out = model->forward(test::normalized_pixels(dir));
  const auto sizes = sizes_of(dir, "target_sizes_hw");
  test::expect_detections_match(dir, out, sizes, image::DetectionHead::detr);
  // Every detection token at threshold 0; the calibrated "no object" bias keeps some at 0.3.
  int64_t kept = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string key = "_img" + std::to_string(i) + "_scores";
    EXPECT_EQ(test::expected_tensor(dir, "th0.0" + key).numel(), 10);
    kept += test::expected_tensor(dir, "th0.3" + key).numel();
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 20);
}

TEST_P(YolosParity, ProcessorMatchesTransformersPixelValues) {
  // YolosImageProcessor: both fixtures' preprocessor_config.json forms resize the photographs to
  // multiples of 16 (512x512 -> 112x112; 400x600 -> 107x160 -> 96x160) and pad them bottom/right
  // with zeros after normalising; pixel_values equal transformers' (rebuilt exactly from
  // pixel_u8), the pixel_mask marks the resized images.
  const auto dir = test::model_fixture(GetParam());
  const auto proc = image::load_image_processor(dir);
  EXPECT_EQ(proc->config().image_processor_type, "YolosImageProcessor");
  EXPECT_EQ(proc->config().shortest_edge, 112);
  EXPECT_EQ(proc->config().longest_edge, 160);
  const auto images = fixture_images(dir);
  const auto resized = sizes_of(dir, "resized_sizes_hw");
  for (size_t i = 0; i < images.size(); ++i)
    EXPECT_EQ(proc->output_size(images[i].size(1), images[i].size(2)), resized[i]);
  const auto out = proc->preprocess(images);
  const auto ref_u8 = test::expected_tensor(dir, "pixel_u8");
  ASSERT_EQ(out.pixel_u8.sizes(), ref_u8.sizes());
  const auto d = (out.pixel_u8.to(at::kInt) - ref_u8.to(at::kInt)).abs();
  const auto ref = test::normalized_pixels(dir);
  const double dv = test::max_abs_diff(out.pixel_values, ref);
  std::cout << "[" << GetParam() << "] pixel_u8 max |diff| " << d.max().item<int>()
            << ", pixel_values max |diff| " << dv << "\n";
  EXPECT_EQ(d.max().item<int>(), 0);
  EXPECT_LE(dv, 1e-6);
  ASSERT_TRUE(out.pixel_mask.defined());
  EXPECT_TRUE(at::equal(out.pixel_mask, test::expected_mask(dir)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, YolosParity, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return std::string(info.param); });

TEST(YolosProcessor, SizeWithAspectRatioFloorsToMultiplesOf16) {
  // get_size_with_aspect_ratio_yolos (image_processing_yolos.py), the values its Python gives.
  EXPECT_EQ(image::size_with_aspect_ratio_yolos(512, 512, 112, 160), std::make_pair(112L, 112L));
  EXPECT_EQ(image::size_with_aspect_ratio_yolos(400, 600, 112, 160), std::make_pair(96L, 160L));
  // hustvl/yolos-small's 800/1333 on COCO's 480x640: 800x1066 -> 800x1056.
  EXPECT_EQ(image::size_with_aspect_ratio_yolos(480, 640, 800, 1333), std::make_pair(800L, 1056L));
  // Portrait, the longest edge binding: raw size 750 -> 750x1333 before the floor.
  EXPECT_EQ(image::size_with_aspect_ratio_yolos(1333, 750, 800, 1333), std::make_pair(1328L, 736L));
  // DETR's rule keeps an image already at the size; YOLOS takes the width < height branch first.
  EXPECT_EQ(image::size_with_aspect_ratio(1333, 750, 800, 1333), std::make_pair(1333L, 750L));
  try {
    image::size_with_aspect_ratio_yolos(4000, 20, 800, 1333);
    ADD_FAILURE() << "expected c10::ValueError";
  } catch (const c10::ValueError& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "YolosImageProcessor: a 4000x20 image resizes to 1328x0 (sides floored to multiples "
              "of 16)");
  }
}

TEST(YolosProcessor, ConfigForms) {
  auto parse = [](const std::string& text) {
    return image::ProcessorConfig::from_json(text, "dir/preprocessor_config.json");
  };
  // The class defaults: shortest 800, longest 1333, ImageNet mean/std, pad.
  auto c = parse(R"({"image_processor_type": "YolosImageProcessorFast"})");
  EXPECT_TRUE(c.yolos_resize);
  EXPECT_EQ(c.shortest_edge, 800);
  EXPECT_EQ(c.longest_edge, 1333);
  EXPECT_TRUE(c.do_pad);
  EXPECT_TRUE(c.do_normalize);
  EXPECT_FLOAT_EQ(c.image_std[2], 0.225f);
  // The Hub's legacy form: an int size takes max_size, else 1333 (YolosImageProcessor.__init__).
  c = parse(R"({"feature_extractor_type": "YolosFeatureExtractor", "size": 512})");
  EXPECT_EQ(c.image_processor_type, "YolosImageProcessor");
  EXPECT_EQ(c.shortest_edge, 512);
  EXPECT_EQ(c.longest_edge, 1333);
  c = parse(R"({"feature_extractor_type": "YolosFeatureExtractor", "size": 512, "max_size": 864})");
  EXPECT_EQ(c.longest_edge, 864);
  // DETR's processors keep their own rule.
  EXPECT_FALSE(parse(R"({"image_processor_type": "DetrImageProcessor"})").yolos_resize);
  try {
    parse(R"({"image_processor_type": "YolosImageProcessor", "size": {"shortest_edge": 512}})");
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "dir/preprocessor_config.json: YolosImageProcessor needs size.longest_edge with "
              "size.shortest_edge");
  }
  try {
    parse(R"({"feature_extractor_type": "CLIPFeatureExtractor"})");
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "dir/preprocessor_config.json: image_processor_type \"CLIPImageProcessor\" is "
                  "not supported",
                  0),
              0u)
        << e.what();
  }
}

TEST(Yolos, RejectsBadInputAndAttentionModulesToggle) {
  auto model = models::load_model(test::model_fixture("yolos_tiny"));
  EXPECT_THROW(model->forward(at::zeros({1, 4, 64, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 3, 8, 64})), std::invalid_argument);  // < one patch
  const bool fused_default =
      models::FamilyRegistry::builtin().find("yolos")->fused_attention_default;
  test::expect_fused_attention_toggles("yolos_tiny", fused_default, 2);  // 2 layers
}

TEST(Yolos, HalfPrecisionLoadsAndStaysClose) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("yolos_tiny_mid");
  const auto pixels = test::normalized_pixels(dir);
  const auto ref = models::load_model(dir)->forward(pixels);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_model(dir, options);
    const auto out = model->forward(pixels.to(dtype));
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(out.logits, model->forward(pixels).logits));
    const double d = test::max_abs_diff(out.logits, ref.logits);
    const double db = test::max_abs_diff(out.pred_boxes, ref.pred_boxes);
    std::cout << "[yolos_tiny_mid " << dtype << "] max|logits - float32| = " << d
              << ", max|pred_boxes - float32| = " << db << "\n";
    EXPECT_LE(d, 0.25);
    EXPECT_LE(db, 0.03);
  }
}

TEST(YolosLoading, MissingAndUnexpectedKeysAreNamed) {
  const auto plain = test::model_fixture("yolos_tiny");
  const auto mid = test::model_fixture("yolos_tiny_mid");
  test::expect_missing_key_named(mid, "vit.encoder.mid_position_embeddings",
                                 "vit.encoder.mid_position_embeddings");
  test::expect_missing_key_named(plain, "vit.embeddings.detection_tokens",
                                 "vit.embeddings.detection_tokens");
  test::expect_missing_key_named(plain, "class_labels_classifier.layers.2.bias",
                                 "class_labels_classifier.layers.2.bias");
  test::expect_missing_key_named(plain, "vit.encoder.layer.1.attention.attention.key.weight",
                                 "vit.encoder.layer.1.attention.attention.key.weight");
  // The plain fixture has no mid-position embeddings: a checkpoint with them is refused.
  test::expect_unexpected_key_named(plain, "vit.encoder.mid_position_embeddings", {1, 1, 35, 32});
}

TEST(YolosLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture("yolos_tiny");
  const auto base = test::read_json(src + "/config.json");
  char tmpl[] = "/tmp/libreyolo_yolos_cfg_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string tmp = tmpl;
  ASSERT_EQ(symlink((src + "/model.safetensors").c_str(), (tmp + "/model.safetensors").c_str()), 0);
  auto error_of = [&](const nlohmann::json& config) {
    std::ofstream(tmp + "/config.json") << config.dump();
    return test::load_error(tmp);
  };
  const std::string file = tmp + "/config.json";
  auto c = base;
  c["image_size"] = {64, 96, 3};
  EXPECT_EQ(error_of(c), file + ": field 'image_size': must be [height, width] or an int");
  c["image_size"] = {8, 96};
  EXPECT_EQ(error_of(c), file + ": field 'image_size': each side must be at least patch_size");
  c = base;
  c["num_detection_tokens"] = 0;
  EXPECT_EQ(error_of(c), file + ": field 'num_detection_tokens': must be positive");
  c = base;
  c["architectures"] = {"YolosModel"};
  EXPECT_EQ(error_of(c),
            file + ": field 'architectures': only YolosForObjectDetection is supported");
  c = base;
  c["num_attention_heads"] = 3;
  EXPECT_EQ(error_of(c), file +
                             ": field 'num_attention_heads': hidden_size must be a positive "
                             "multiple of it");
  c = base;
  c["image_size"] = {64, 112};  // 4x7 positions: the checkpoint has 4x6
  const auto shape_error = error_of(c);
  EXPECT_NE(shape_error.find("shape mismatch for 'vit.embeddings.position_embeddings': "
                             "expected [1, 39, 32], found [1, 35, 32]"),
            std::string::npos)
      << shape_error;
  c = base;
  c.erase("architectures");  // absent: YolosForObjectDetection
  c["image_size"] = 80;      // an int: square 80x80 = 5x5 positions
  EXPECT_NE(error_of(c).find("expected [1, 36, 32], found [1, 35, 32]"), std::string::npos);
  std::remove((tmp + "/config.json").c_str());
  std::remove((tmp + "/model.safetensors").c_str());
  rmdir(tmp.c_str());
}

}  // namespace
}  // namespace libreyolo
