// Table Transformer (transformers 5.17 TableTransformerForObjectDetection) against
// tests/fixtures/models/table_transformer_tiny (make_fixtures.py there): the Hub's config.json
// form (use_timm_backbone, a timm BasicBlock ResNet), a padded batch of two photographs
// (96x96 and 96x144, pixel_mask) and a rendered document page with a table (96x128).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

const char* const kFixture = "table_transformer_tiny";

/// The stored uint8 pixels `key` normalised as DetrImageProcessor does, zero where `mask` is 0.
at::Tensor pixels_of(const std::string& dir, const std::string& key, const at::Tensor& mask) {
  const auto u8 = test::expected_tensor(dir, key);
  const auto m = at::tensor(std::vector<float>{0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}) * 255.0f;
  const auto s = at::tensor(std::vector<float>{0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}) * 255.0f;
  return ((u8.to(at::kFloat) - m) / s).masked_fill(mask.unsqueeze(1) == 0, 0.0f);
}

at::Tensor batch_mask(const std::string& dir) {
  return test::expected_mask(dir);  // stored as uint8
}

std::vector<std::pair<int64_t, int64_t>> target_sizes(const std::string& dir) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  return sizes;
}

TEST(TableTransformerParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "table-transformer");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label(),
            (std::map<int64_t, std::string>{{0, "table"}, {1, "table rotated"}}));
  EXPECT_EQ(model->description().head, image::DetectionHead::detr);
  const auto mask = batch_mask(dir);
  const auto pixels = pixels_of(dir, "pixel_u8", mask);
  ASSERT_EQ(pixels.sizes(), (at::IntArrayRef{2, 3, 96, 144}));
  ASSERT_EQ(mask.select(0, 0).sum().item<int64_t>(), 96 * 96);  // image 0 is padded
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = model->forward(pixels, mask);
    ASSERT_EQ(out.logits.sizes(), (at::IntArrayRef{2, 8, 3}));  // 2 labels + "no object"
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits"),
                                        test::expected_tensor(dir, "pred_boxes"),
                                        std::string(kFixture) + (fused ? " sdpa" : " manual"));
  }
}

TEST(TableTransformerParity, PostProcessingMatchesTransformers) {
  // DetrImageProcessor.post_process_object_detection at thresholds 0.0 (every query) and 0.3
  // (image 0 keeps 3 of 8, image 1 all 8).
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  auto model = models::load_model(dir);
  const auto mask = batch_mask(dir);
  const auto out = model->forward(pixels_of(dir, "pixel_u8", mask), mask);
  test::expect_detections_match(dir, out, target_sizes(dir), image::DetectionHead::detr);
  image::PostProcessOptions opt;
  opt.threshold = 0.3;
  const auto dets = image::post_process_object_detection(
      out.logits, out.pred_boxes, target_sizes(dir), image::DetectionHead::detr, opt);
  EXPECT_EQ(dets[0].scores.numel(), 3);
  EXPECT_EQ(dets[1].scores.numel(), 8);
}

TEST(TableTransformerParity, DocumentPageMatchesTransformers) {
  // The rendered page (tests/fixtures/images/table_page.png, 240x180): the processor's pixels
  // within 1 of torchvision's, then logits, boxes and the detections at threshold 0.3.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  const image::ImageProcessor proc(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  const auto page =
      image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/table_page.png");
  const auto pre = proc.preprocess({page});
  const auto ref_u8 = test::expected_tensor(dir, "doc_pixel_u8");
  ASSERT_EQ(pre.pixel_u8.sizes(), ref_u8.sizes());
  EXPECT_LE((pre.pixel_u8.to(at::kInt) - ref_u8.to(at::kInt)).abs().max().item<int>(), 1);
  auto model = models::load_model(dir);
  const auto mask = at::ones({1, 96, 128}, at::kLong);
  const auto out = model->forward(pixels_of(dir, "doc_pixel_u8", mask), mask);
  test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "doc_logits"),
                                      test::expected_tensor(dir, "doc_pred_boxes"),
                                      "table_transformer_tiny document");
  image::PostProcessOptions opt;
  opt.threshold = 0.3;
  const auto dets = image::post_process_object_detection(out.logits, out.pred_boxes, {{180, 240}},
                                                         image::DetectionHead::detr, opt);
  ASSERT_EQ(dets.size(), 1u);
  const auto scores = test::expected_tensor(dir, "doc_th0.3_img0_scores");
  ASSERT_EQ(dets[0].scores.numel(), scores.numel());
  EXPECT_GT(scores.numel(), 0);
  EXPECT_TRUE(at::equal(dets[0].labels, test::expected_tensor(dir, "doc_th0.3_img0_labels")));
  EXPECT_LE(test::max_abs_diff(dets[0].scores, scores), 1e-5);
  EXPECT_LE(test::max_abs_diff(dets[0].boxes, test::expected_tensor(dir, "doc_th0.3_img0_boxes")),
            1e-2);
}

TEST(TableTransformerParity, ProcessorMatchesPixelU8AndMask) {
  const auto dir = test::model_fixture(kFixture);
  const image::ImageProcessor proc(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  std::vector<at::Tensor> images;
  const auto meta = test::read_json(dir + "/meta.json");  // outlives the loop
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  const auto out = proc.preprocess(images);
  const auto ref = test::expected_tensor(dir, "pixel_u8");
  ASSERT_EQ(out.pixel_u8.sizes(), ref.sizes());
  const auto d = (out.pixel_u8.to(at::kInt) - ref.to(at::kInt)).abs();
  const double equal = d.eq(0).sum().item<double>() / static_cast<double>(d.numel());
  std::cout << "[table_transformer_tiny] pixel_u8 " << 100.0 * equal << " % equal, max |diff| "
            << d.max().item<int>() << "\n";
  EXPECT_GE(equal, 0.99);
  EXPECT_LE(d.max().item<int>(), 1);
  ASSERT_TRUE(out.pixel_mask.defined());
  EXPECT_TRUE(at::equal(out.pixel_mask.to(at::kLong), batch_mask(dir)));
}

TEST(TableTransformerLoading, MissingAndUnexpectedKeysAreNamed) {
  const auto dir = test::model_fixture(kFixture);
  // The final encoder LayerNorm DETR does not have, and a pre-norm layer's norm.
  test::expect_missing_key_named(dir, "model.encoder.layernorm.weight",
                                 "model.encoder.layernorm.weight");
  test::expect_missing_key_named(dir, "model.decoder.layers.1.encoder_attn_layer_norm.bias",
                                 "model.decoder.layers.1.encoder_attn_layer_norm.bias");
  test::expect_missing_key_named(dir, "model.backbone.conv_encoder.model.layer4.0.bn2.weight",
                                 "model.backbone.conv_encoder.model.layer4.0.bn2.weight");
  test::expect_unexpected_key_named(dir, "model.encoder.layers.0.mlp.fc1.weight", {24, 16});
}

TEST(TableTransformerLoading, ADetrCheckpointIsNotATableTransformer) {
  // DETR's weights under model_type "table-transformer": the encoder LayerNorm is missing.
  const auto src = test::model_fixture("detr_tiny_timm");
  const auto dir = test::corrupted_copy(
      src, [](const std::string&, const at::Tensor& t) { return std::optional<at::Tensor>(t); });
  auto config = test::read_json(dir + "/config.json");
  config["model_type"] = "table-transformer";
  std::ofstream(dir + "/config.json") << config.dump();
  EXPECT_EQ(test::load_error(dir),
            dir +
                "/model.safetensors: checkpoint does not match the model: missing keys (2): "
                "model.encoder.layernorm.weight, model.encoder.layernorm.bias");
  test::remove_copy(dir);
}

TEST(TableTransformerLayouts, DefaultsFoldTheResNetAndConcatenateTheSelfAttentions) {
  // kernels.layouts default on CPU: batchnorm_fold on timm's ResNet (the stem and the 4 blocks)
  // and qkv_concat on the 4 self-attentions (2 encoder, 2 decoder).
  const auto model = models::load_model(test::model_fixture(kFixture));
  const auto& r = model->layouts();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].layout, "batchnorm_fold");
  EXPECT_EQ(r[0].modules, 5);
  EXPECT_EQ(r[0].source, "default (table-transformer)");
  EXPECT_EQ(r[1].layout, "qkv_concat");
  EXPECT_EQ(r[1].modules, 4);
  EXPECT_EQ(r[1].classes, std::vector<std::string>{"TableTransformerAttention"});
  EXPECT_EQ(r[1].source, "default (table-transformer)");
}

}  // namespace
}  // namespace libreyolo
