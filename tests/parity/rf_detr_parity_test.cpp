// RF-DETR (transformers 5.17 RfDetrForObjectDetection and RfDetrForInstanceSegmentation: DINOv2
// backbone with 2x2 windows, window and global blocks, one-level C2F projector with LayerNorm
// ConvNorms, LW-DETR's two-stage queries and deformable decoder, the mask head) against the
// rf_detr_tiny and rf_detr_seg_tiny fixtures (tests/fixtures/models/rf_detr_tiny/
// make_fixtures.py): a batch of two photographs at the non-square 192x256 (the position
// embeddings are bicubic-antialias resized from the 8x8 grid to 12x16 patches; upstream's
// transposed window order for non-square grids). Also RfDetrImageProcessor (rescale, float32
// resize, normalise) bit for bit, the post-processing of both tasks, the loading errors and the
// input checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include "models/core/safetensors.h"
#include "models/image/instance_segmentation.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/layers/layers.h"
#include "models/lw_detr/projector.h"
#include "models/model.h"
#include "models/rf_detr/checkpoint_keys.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

constexpr const char* kDetection = "rf_detr_tiny";
constexpr const char* kSegmentation = "rf_detr_seg_tiny";

std::vector<at::Tensor> fixture_images(const std::string& dir) {
  std::vector<at::Tensor> images;
  const auto meta = test::read_json(dir + "/meta.json");  // outlives the loop
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  return images;
}

/// The fixture's model input: our RfDetrImageProcessor on its photographs (equal to
/// transformers' bit for bit: ProcessorMatchesTransformersBitForBit).
image::ProcessorOutput fixture_input(const std::string& dir) {
  const image::ImageProcessor proc(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  return proc.preprocess(fixture_images(dir));
}

std::vector<std::pair<int64_t, int64_t>> target_sizes(const std::string& dir) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  return sizes;
}

TEST(RfDetrParity, ProcessorMatchesTransformersBitForBit) {
  const auto dir = test::model_fixture(kDetection);
  const auto out = fixture_input(dir);
  const auto ref = test::expected_tensor(dir, "pixel_values");
  ASSERT_EQ(out.pixel_values.sizes(), ref.sizes());
  const double d = test::max_abs_diff(out.pixel_values, ref);
  std::cout << "[" << kDetection << "] pixel_values max |diff| = " << d << "\n";
  EXPECT_EQ(d, 0.0);
  ASSERT_TRUE(out.pixel_mask.defined());
  EXPECT_TRUE(out.pixel_mask.eq(1).all().item<bool>());
  EXPECT_EQ(out.pixel_u8.sizes(), ref.sizes());
  // The segmentation fixture uses the same processor settings.
  EXPECT_EQ(test::read_json(dir + "/preprocessor_config.json"),
            test::read_json(test::model_fixture(kSegmentation) + "/preprocessor_config.json"));
}

TEST(RfDetrProcessor, ClassDefaultsAndUnsupportedKeys) {
  // RfDetrImageProcessor's class defaults (image_processing_rf_detr.py): shortest 800 / longest
  // 1333, ImageNet mean / std, pad; do_center_crop is not part of it.
  const auto c = image::ProcessorConfig::from_json(
      R"({"image_processor_type": "RfDetrImageProcessor"})", "pre.json");
  EXPECT_EQ(c.shortest_edge, 800);
  EXPECT_EQ(c.longest_edge, 1333);
  EXPECT_TRUE(c.do_normalize);
  EXPECT_TRUE(c.do_pad);
  EXPECT_FLOAT_EQ(c.image_mean[0], 0.485f);
  EXPECT_FLOAT_EQ(c.image_std[2], 0.225f);
  try {
    image::ProcessorConfig::from_json(
        R"({"image_processor_type": "RfDetrImageProcessor", "do_center_crop": true,
            "crop_size": {"height": 32, "width": 32}})",
        "pre.json");
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "pre.json: do_center_crop is not supported for RfDetrImageProcessor");
  }
  // Padding: two sizes in one batch, the smaller one's pixel_values 0 outside its pixels.
  image::ProcessorConfig pad = c;
  pad.shortest_edge = 64;
  pad.longest_edge = 0;
  const image::ImageProcessor proc(pad);
  const auto out = proc.preprocess(
      {at::full({3, 64, 96}, 200, at::kByte), at::full({3, 96, 64}, 10, at::kByte)});
  ASSERT_EQ(out.pixel_values.sizes(), (at::IntArrayRef{2, 3, 96, 96}));
  EXPECT_EQ(out.pixel_mask[0].sum().item<int64_t>(), 64 * 96);
  EXPECT_EQ(out.pixel_values[0].slice(1, 64).abs().sum().item<float>(), 0.0f);
  // A constant image stays constant: (200 / 255 - 0.485) / 0.229 in float32.
  const float v = (200.0f * static_cast<float>(1.0 / 255.0) - 0.485f) / 0.229f;
  EXPECT_NEAR(out.pixel_values[0][0][10][10].item<float>(), v, 1e-6);
}

TEST(RfDetrParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kDetection);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "rf_detr");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label().size(), 6u);
  EXPECT_EQ(model->description().head, image::DetectionHead::rt_detr);
  EXPECT_EQ(model->description().num_queries, 12);
  const auto in = fixture_input(dir);
  const auto logits_ref = test::expected_tensor(dir, "logits");
  const auto boxes_ref = test::expected_tensor(dir, "pred_boxes");
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    for (bool with_mask : {true, false}) {
      const auto out = with_mask ? model->forward(in.pixel_values, in.pixel_mask)
                                 : model->forward(in.pixel_values);
      EXPECT_FALSE(out.pred_masks.defined());
      test::expect_logits_and_boxes_match(out, logits_ref, boxes_ref,
                                          std::string(kDetection) + (fused ? " sdpa" : " manual") +
                                              (with_mask ? " pixel_mask" : " no mask") +
                                              " attention");
    }
  }
}

// The CUDA default (the `channels_last` layout, CUDA-only) on the CPU: every Conv2d weight
// converted as the layout converts it, so that the projector reports channels_last, the
// backbone hands its maps over as rows and RfDetr's backbone_maps concatenates them in NHWC.
// The same transformers fixture bars as the NCHW path.
TEST(RfDetrParity, ChannelsLastProjectorMatchesTransformers) {
  c10::InferenceMode inference_mode;
  for (const char* name : {kDetection, kSegmentation}) {
    const auto dir = test::model_fixture(name);
    auto model = models::load_model(dir);
    std::vector<const models::lw_detr::C2FLayerImpl*> c2f;
    std::vector<models::layers::Conv2dImpl*> convs;
    for (const auto& m : model->root().modules(/*include_self=*/false)) {
      if (const auto* c = dynamic_cast<const models::lw_detr::C2FLayerImpl*>(m.get()))
        c2f.push_back(c);
      if (auto* c = dynamic_cast<models::layers::Conv2dImpl*>(m.get())) convs.push_back(c);
    }
    ASSERT_EQ(c2f.size(), 1u) << name;
    ASSERT_FALSE(c2f[0]->bottlenecks.empty()) << name;
    EXPECT_FALSE(c2f[0]->channels_last()) << name;
    int converted = 0;
    for (auto* c : convs)
      if (!c->weight.is_contiguous(at::MemoryFormat::ChannelsLast)) {
        c->weight.set_(c->weight.contiguous(at::MemoryFormat::ChannelsLast));
        ++converted;
      }
    // The patch embedding and the bottlenecks' 3x3 convolutions (1x1 weights and the mask
    // head's depthwise ones are contiguous in both formats): DESIGN.md's layouts table.
    EXPECT_EQ(converted, 5) << name;
    EXPECT_TRUE(c2f[0]->channels_last()) << name;
    const auto in = fixture_input(dir);
    const auto out = model->forward(in.pixel_values, in.pixel_mask);
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits"),
                                        test::expected_tensor(dir, "pred_boxes"),
                                        std::string(name) + " channels_last projector");
    if (std::string(name) == kSegmentation)
      EXPECT_LE(test::max_abs_diff(out.pred_masks, test::expected_tensor(dir, "pred_masks")), 1e-4);
  }
}

TEST(RfDetrParity, MaskLogitsMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kSegmentation);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "rf_detr");
  EXPECT_EQ(model->task(), models::Task::instance_segmentation);
  const auto in = fixture_input(dir);
  const auto logits_ref = test::expected_tensor(dir, "logits");
  const auto boxes_ref = test::expected_tensor(dir, "pred_boxes");
  const auto masks_ref = test::expected_tensor(dir, "pred_masks");
  ASSERT_EQ(masks_ref.sizes(), (at::IntArrayRef{2, 12, 48, 64}));
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = model->forward(in.pixel_values, in.pixel_mask);
    ASSERT_EQ(out.pred_masks.sizes(), masks_ref.sizes());
    EXPECT_EQ(out.pred_masks.scalar_type(), at::kFloat);
    const double dl = test::max_abs_diff(out.logits, logits_ref);
    const double db = test::max_abs_diff(out.pred_boxes, boxes_ref);
    const double dm = test::max_abs_diff(out.pred_masks, masks_ref);
    std::cout << "[" << kSegmentation << "] " << (fused ? "sdpa  " : "manual")
              << " attention: max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
              << ", max|pred_masks diff| = " << dm << "\n";
    EXPECT_LE(dl, 1e-4);
    EXPECT_LE(db, 1e-5);
    EXPECT_LE(dm, 1e-4);
  }
}

TEST(RfDetrParity, PostProcessingMatchesTransformers) {
  // RfDetrImageProcessor.post_process_object_detection of our outputs equals transformers' of
  // its outputs: labels and their order exactly, scores and boxes within float noise.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kDetection);
  auto model = models::load_model(dir);
  const auto out = model->forward(fixture_input(dir).pixel_values);
  const auto sizes = target_sizes(dir);
  test::expect_detections_match(dir, out, sizes, model->description().head, 12);
}

TEST(RfDetrParity, InstanceSegmentationMatchesTransformers) {
  // post_process_instance_segmentation(threshold 0.5, return_binary_maps=True): on
  // transformers' own outputs every mask is equal (COCO RLE counts); on ours the labels and
  // scores are, and at most 1e-4 of the mask pixels differ (logits within 1e-4 of 0 after the
  // bilinear resize may flip).
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kSegmentation);
  const auto sizes = target_sizes(dir);
  image::InstanceSegmentationOptions opt;
  opt.threshold = 0.5;
  const auto ref = image::post_process_instance_segmentation(
      test::expected_tensor(dir, "logits"), test::expected_tensor(dir, "pred_boxes"),
      test::expected_tensor(dir, "pred_masks"), sizes, opt);
  auto model = models::load_model(dir);
  const auto out = model->forward(fixture_input(dir).pixel_values);
  const auto ours = image::post_process_instance_segmentation(out.logits, out.pred_boxes,
                                                              out.pred_masks, sizes, opt);
  const auto meta = test::read_json(dir + "/meta.json");
  ASSERT_EQ(ref.size(), 2u);
  ASSERT_EQ(ours.size(), 2u);
  int64_t differing = 0, pixels = 0;
  for (size_t i = 0; i < 2; ++i) {
    const std::string key = "seg_img" + std::to_string(i);
    SCOPED_TRACE(key);
    const int64_t k = meta.at("instances").at(key).get<int64_t>();
    ASSERT_EQ(ref[i].masks.size(0), k);
    ASSERT_EQ(ours[i].masks.size(0), k);
    EXPECT_EQ(ref[i].masks.size(1), sizes[i].first);
    EXPECT_EQ(ref[i].masks.size(2), sizes[i].second);
    EXPECT_TRUE(at::equal(ref[i].detections.labels, test::expected_tensor(dir, key + "_labels")));
    EXPECT_TRUE(at::equal(ours[i].detections.labels, ref[i].detections.labels));
    // segments_info scores are round(score, 6) upstream.
    EXPECT_LE(
        test::max_abs_diff(ref[i].detections.scores, test::expected_tensor(dir, key + "_scores")),
        1e-6);
    EXPECT_LE(test::max_abs_diff(ours[i].detections.scores, ref[i].detections.scores), 1e-5);
    for (int64_t j = 0; j < k; ++j) {
      const auto counts = test::expected_tensor(dir, key + "_rle" + std::to_string(j));
      const auto rle = image::coco_rle_counts(ref[i].masks[j]);
      EXPECT_EQ(rle, std::vector<int64_t>(counts.data_ptr<int64_t>(),
                                          counts.data_ptr<int64_t>() + counts.numel()))
          << "mask " << j;
    }
    differing += ours[i].masks.ne(ref[i].masks).sum().item<int64_t>();
    pixels += ours[i].masks.numel();
  }
  std::cout << "[" << kSegmentation << "] our masks: " << differing << " of " << pixels
            << " pixels differ from transformers'\n";
  EXPECT_LE(static_cast<double>(differing), 1e-4 * static_cast<double>(pixels));
}

TEST(RfDetr, RejectsBadInput) {
  auto model = models::load_model(test::model_fixture(kDetection));
  const auto x = at::zeros({1, 3, 64, 64});
  EXPECT_THROW(model->forward(at::zeros({1, 4, 64, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 32, 64}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 64, 64}, at::kFloat)), std::invalid_argument);
  // 48 px = 3 patches of 16: not divisible into 2x2 windows.
  try {
    model->forward(at::zeros({1, 3, 48, 64}));
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "rf_detr: the 3x4 patch grid of a 48x64 input is not divisible into 2x2 windows "
              "(input sides must be multiples of patch_size * num_windows = 32)");
  }
  // 16 px < patch_size * num_windows: the one input rule.
  EXPECT_THROW(model->forward(at::zeros({1, 3, 16, 64})), std::invalid_argument);
  // 64x64 = 4x4 patches = 16 projector tokens >= 12 queries: accepted.
  EXPECT_NO_THROW(model->forward(x));
  // 32x64 = 8 tokens < 12 queries (torch.topk would fail upstream too).
  try {
    model->forward(at::zeros({1, 3, 32, 64}));
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "rf_detr: num_queries = 12 exceeds the 8 projector tokens of the input");
  }
}

TEST(RfDetrLoading, OriginalNamesMapToModuleNames) {
  using models::rf_detr::original_key;
  EXPECT_EQ(original_key("model.backbone.backbone.encoder.layer.0.norm1.weight", false),
            "backbone.0.encoder.encoder.encoder.layer.0.norm1.weight");
  EXPECT_EQ(
      original_key("model.backbone.projector.projector_layer.bottlenecks.1.conv2.norm.bias", false),
      "backbone.0.projector.stages.0.0.m.1.cv2.bn.bias");
  EXPECT_EQ(original_key("model.backbone.projector.layer_norm.weight", false),
            "backbone.0.projector.stages.0.1.weight");
  EXPECT_EQ(original_key("model.decoder.layers.1.mlp.fc2.weight", false),
            "transformer.decoder.layers.1.linear2.weight");
  EXPECT_EQ(original_key("model.decoder.layers.0.self_attn.o_proj.bias", false),
            "transformer.decoder.layers.0.self_attn.out_proj.bias");
  EXPECT_EQ(original_key("model.decoder.layernorm.weight", false),
            "transformer.decoder.norm.weight");
  EXPECT_EQ(original_key("model.enc_output_norm.2.bias", false),
            "transformer.enc_output_norm.2.bias");
  EXPECT_EQ(original_key("model.reference_point_embed.weight", false), "refpoint_embed.weight");
  EXPECT_EQ(original_key("model.query_feat.weight", false), "query_feat.weight");
  EXPECT_EQ(original_key("class_embed.weight", false), "class_embed.weight");
  EXPECT_EQ(original_key("model.class_embed.weight", true), "class_embed.weight");
  EXPECT_EQ(original_key("model.model.decoder.layers.1.norm3.weight", true),
            "transformer.decoder.layers.1.norm3.weight");
  EXPECT_EQ(original_key("blocks.1.pointwise_conv.weight", true),
            "segmentation_head.blocks.1.pwconv1.weight");
  EXPECT_EQ(original_key("query_features_block.mlp.fc2.bias", true),
            "segmentation_head.query_features_block.layers.2.bias");
  EXPECT_EQ(original_key("segmentation_bias", true), "segmentation_head.bias");
}

using test::load_error;

TEST(RfDetrLoading, UnknownAndMissingKeysAreNamed) {
  for (const char* fixture : {kDetection, kSegmentation}) {
    SCOPED_TRACE(fixture);
    const auto src = test::model_fixture(fixture);
    const bool seg = std::string(fixture) == kSegmentation;
    // An unused group's head, and the segmentation bias: named by their module keys.
    test::expect_missing_key_named(
        src, seg ? "segmentation_head.bias" : "transformer.enc_out_class_embed.2.bias",
        seg ? "segmentation_bias" : "model.enc_out_class_embed.2.bias");
    test::expect_unexpected_key_named(
        src, "backbone.0.encoder.encoder.encoder.layer.0.attention.attention.extra.bias", {32});
  }
}

TEST(RfDetrLoading, TransformersModuleNamesAreAccepted) {
  // The same weights under transformers' module names (the detector's, q / k / v unpacked)
  // load to the same model.
  c10::InferenceMode inference_mode;
  const auto src = test::model_fixture(kDetection);
  auto model = models::load_model(src);
  const auto dir = test::edited_copy(src, [&](auto& t) {
    t.clear();
    for (const auto& item : model->root().named_parameters(/*recurse=*/true)) {
      const std::string& key = item.key();
      const at::Tensor& value = item.value();
      const auto at = key.find("self_attn.in_proj_");
      if (at == std::string::npos) {
        t.emplace_back(key, value.clone());
        continue;
      }
      const std::string kind = key.substr(at + 18);  // "weight" / "bias"
      const auto parts = value.chunk(3, 0);
      const char* names[] = {"q_proj", "k_proj", "v_proj"};
      for (int i = 0; i < 3; ++i)
        t.emplace_back(key.substr(0, at) + "self_attn." + names[i] + "." + kind,
                       parts[i].contiguous().clone());
    }
    EXPECT_EQ(t.size(), 203u);  // the 195 original tensors, 2 layers x 2 packed ones split in 3
  });
  const auto x = fixture_input(src).pixel_values.slice(0, 0, 1);
  const auto a = model->forward(x);
  const auto b = models::load_model(dir)->forward(x);
  EXPECT_LE(test::max_abs_diff(a.logits, b.logits), 1e-6);
  EXPECT_LE(test::max_abs_diff(a.pred_boxes, b.pred_boxes), 1e-7);
  test::remove_copy(dir);
}

TEST(RfDetrLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture(kDetection);
  const auto base = test::read_json(src + "/config.json");
  char tmpl[] = "/tmp/libreyolo_rfdetr_cfg_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string tmp = tmpl;
  auto expect_error = [&](nlohmann::json config, const std::string& message) {
    std::ofstream(tmp + "/config.json") << config.dump();
    EXPECT_EQ(load_error(tmp), tmp + "/config.json: " + message);
  };
  auto c = base;
  c["architectures"] = {"RfDetrModel"};
  expect_error(c,
               "field 'architectures': only RfDetrForObjectDetection and "
               "RfDetrForInstanceSegmentation are supported");
  c = base;
  c["backbone_config"]["model_type"] = "dinov2";
  expect_error(c,
               "field 'backbone_config.model_type': unsupported value \"dinov2\" (supported: "
               "\"rf_detr_dinov2\")");
  c = base;
  c["num_feature_levels"] = 2;
  expect_error(c, "field 'num_feature_levels': RF-DETR supports one feature level only");
  c = base;
  c["backbone_config"]["reshape_hidden_states"] = false;
  expect_error(c,
               "field 'backbone_config.reshape_hidden_states': must be true (the projector takes "
               "2-D feature maps)");
  c = base;
  c["decoder_cross_attention_heads"] = 5;
  expect_error(c, "field 'decoder_cross_attention_heads': must divide d_model");
  std::remove((tmp + "/config.json").c_str());
  rmdir(tmp.c_str());
}

TEST(RfDetr, HalfPrecisionLoadsAndRuns) {
  // float16 / bfloat16 on CPU: float32, finite outputs of every task, the same without a mask as
  // with an all-ones one.
  c10::InferenceMode inference_mode;
  for (const char* fixture : {kDetection, kSegmentation}) {
    const auto dir = test::model_fixture(fixture);
    const auto pixels = fixture_input(dir).pixel_values.slice(0, 1, 2).contiguous();
    for (auto dtype : {at::kHalf, at::kBFloat16}) {
      models::LoadOptions options;
      options.dtype = dtype;
      const auto model = models::load_model(dir, options);
      const auto out = model->forward(pixels);
      ASSERT_EQ(out.logits.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::isfinite(out.logits).all().item<bool>()) << fixture << " " << dtype;
      EXPECT_TRUE(at::isfinite(out.pred_boxes).all().item<bool>()) << fixture << " " << dtype;
      if (std::string(fixture) == kSegmentation)
        EXPECT_TRUE(at::isfinite(out.pred_masks).all().item<bool>()) << dtype;
      // Without a mask (no padding: the mask, valid ratios and proposals are skipped or kept per
      // geometry) the same bits as with an all-ones pixel_mask.
      const auto masked =
          model->forward(pixels, at::ones({1, pixels.size(2), pixels.size(3)}, at::kLong));
      EXPECT_TRUE(at::equal(out.logits, masked.logits)) << fixture << " " << dtype;
      EXPECT_TRUE(at::equal(out.pred_boxes, masked.pred_boxes)) << fixture << " " << dtype;
      if (std::string(fixture) == kSegmentation)
        EXPECT_TRUE(at::equal(out.pred_masks, masked.pred_masks)) << dtype;
    }
  }
}

}  // namespace
}  // namespace libreyolo
