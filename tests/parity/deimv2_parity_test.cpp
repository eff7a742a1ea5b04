// DEIMv2 against transformers 5.17 reference outputs (tests/fixtures/models/deimv2_tiny: HGNetV2
// + hybrid encoder; deimv2_tiny_lite: HGNetV2 + lite encoder, no gateway, d_model 48; both
// made on CPU in float32 with the default SDPA attention by deimv2_tiny/make_fixtures.py, a batch
// of two photographs; deimv2_tiny_dinov3: the DINOv3 backbone (3 layers, 2 register tokens, RoPE,
// no key bias) + spatial tuning adapter + hybrid encoder, one ImageNet-normalised photograph, by
// deimv2_tiny_dinov3/make_fixtures.py): logits, boxes, the post-processed detections, strict
// checkpoint loading and the config errors of what is not implemented. share_bbox_head is loaded
// (the one stored copy) but has no fixture: transformers 5.17 re-initialises it at random on
// from_pretrained.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/deimv2/modules.h"
#include "models/image/postprocess.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace {

using libreyolo::models::load_model;
namespace core = libreyolo::models::core;
namespace deimv2 = libreyolo::models::deimv2;
/// DEIMv2's registered Family::fused_attention_default.
const bool kFusedAttentionDefault =
    libreyolo::models::FamilyRegistry::builtin().find("deimv2")->fused_attention_default;

const std::string kFixtures = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/";

struct Variant {
  std::string name;
  int64_t batch;  ///< images in the fixture
  int attention;  ///< modules with a fused_attn flag
};
// hybrid: 1 AIFI layer + 2 decoder self-attentions; lite: 3 decoder self-attentions; DINOv3:
// 3 backbone layers + 1 AIFI layer + 2 decoder self-attentions.
const std::vector<Variant> kVariants = {
    {"deimv2_tiny", 2, 3}, {"deimv2_tiny_lite", 2, 3}, {"deimv2_tiny_dinov3", 1, 6}};
const std::string kDinov3 = "deimv2_tiny_dinov3";

// The model input, exactly: float32(pixel_u8) * float32(rescale_factor) (fixtures/README.md), or
// with do_normalize (the DINOv3 fixture) (float32(u8) - mean * 255) / (std * 255).
at::Tensor pixel_values(const std::string& dir, const core::SafetensorsFile& expected) {
  const auto pre = core::read_json_file(dir + "/preprocessor_config.json");
  if (pre.value("do_normalize", false)) return libreyolo::test::normalized_pixels(dir);
  const double rescale = pre.at("rescale_factor").get<double>();
  return expected.view("pixel_u8").to(at::kFloat) * static_cast<float>(rescale);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(Deimv2Parity, LogitsAndBoxesMatchTransformersWithBothAttentionPaths) {
  for (const auto& [name, batch, attention] : kVariants) {
    SCOPED_TRACE(name);
    const std::string dir = kFixtures + name;
    const auto model = load_model(dir);
    EXPECT_EQ(model->model_type(), "deimv2");
    EXPECT_EQ(model->task(), libreyolo::models::Task::object_detection);
    ASSERT_EQ(model->id2label().size(), 10u);
    const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
    const auto logits_ref = expected->view("logits");
    const auto boxes_ref = expected->view("pred_boxes");
    const auto pixels = pixel_values(dir, *expected);
    ASSERT_EQ(pixels.size(0), batch);
    EXPECT_EQ(model->set_fused_attention(kFusedAttentionDefault), 0);
    std::vector<libreyolo::models::ModelOutput> outs;  // manual, then SDPA
    for (const bool fused : {false, true}) {
      if (fused) EXPECT_EQ(model->set_fused_attention(true), attention) << "attention modules";
      at::InferenceMode inference;
      const auto& out = outs.emplace_back(model->forward(pixels));
      ASSERT_EQ(out.logits.sizes(), logits_ref.sizes());
      ASSERT_EQ(out.pred_boxes.sizes(), boxes_ref.sizes());
      const double dl = max_abs_diff(out.logits, logits_ref);
      const double db = max_abs_diff(out.pred_boxes, boxes_ref);
      std::cout << "[parity] " << name << " fused_attention=" << fused
                << ": max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db << std::endl;
      EXPECT_LE(dl, 1e-4);
      EXPECT_LE(db, 1e-5);
    }
    const double sdpa_vs_manual = std::max(max_abs_diff(outs[0].logits, outs[1].logits),
                                           max_abs_diff(outs[0].pred_boxes, outs[1].pred_boxes));
    std::cout << "[parity] " << name << " max|SDPA - manual| = " << sdpa_vs_manual << std::endl;
    // The fused-attention policy (DESIGN.md): SDPA by default only where it is byte-exact.
    EXPECT_EQ(kFusedAttentionDefault, sdpa_vs_manual == 0.0);
  }
}

TEST(Deimv2Parity, PostProcessedDetectionsMatchTransformers) {
  // Our outputs through the daemon's post-processing (deimv2 -> the RT-DETR head) against
  // transformers' post_process_object_detection of its own outputs, per image and threshold.
  for (const auto& [name, batch, attention] : kVariants) {
    SCOPED_TRACE(name);
    const std::string dir = kFixtures + name;
    const auto model = load_model(dir);
    const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
    const auto meta = core::read_json_file(dir + "/meta.json");
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    ASSERT_EQ(static_cast<int64_t>(sizes.size()), batch);
    at::InferenceMode guard;
    const auto out = model->forward(pixel_values(dir, *expected));
    const auto head = model->description().head;
    double max_box = 0, max_score = 0;
    for (const std::string th : {"0.0", "0.3"}) {
      libreyolo::image::PostProcessOptions opt;
      opt.threshold = std::stod(th);
      const auto dets = libreyolo::image::post_process_object_detection(out.logits, out.pred_boxes,
                                                                        sizes, head, opt);
      ASSERT_EQ(static_cast<int64_t>(dets.size()), batch);
      for (size_t i = 0; i < dets.size(); ++i) {
        const std::string key = "th" + th + "_img" + std::to_string(i);
        const auto s = expected->view(key + "_scores");
        ASSERT_EQ(dets[i].scores.numel(), s.numel()) << key;
        EXPECT_EQ(s.numel(), meta["postprocess"][key]["count"].get<int64_t>());
        EXPECT_TRUE(at::equal(dets[i].labels, expected->view(key + "_labels")))
            << key << ": labels or their order differ";
        max_score = std::max(max_score, max_abs_diff(dets[i].scores, s));
        max_box = std::max(max_box, max_abs_diff(dets[i].boxes, expected->view(key + "_boxes")));
      }
    }
    std::cout << "[parity] " << name << " post-processed: max|score diff| = " << max_score
              << ", max|box diff| = " << max_box << " px" << std::endl;
    EXPECT_LE(max_score, 1e-5);
    EXPECT_LE(max_box, 1e-2);  // ~1e-5 of the 600 px target size
  }
}

TEST(Deimv2Loading, UnknownAndMissingKeysAreNamed) {
  using libreyolo::test::expect_missing_key_named;
  using libreyolo::test::expect_unexpected_key_named;
  const std::string missing = "model.decoder.layers.1.mlp.gate_proj.weight";
  expect_missing_key_named(kFixtures + "deimv2_tiny", missing, missing);
  expect_unexpected_key_named(kFixtures + "deimv2_tiny",
                              "model.decoder.layers.0.mlp.extra_proj.weight", {2, 2});
  // The lite encoder's keys are checked as strictly.
  const std::string lite_key = "model.encoder.bi_fusion_conv.conv.weight";
  expect_missing_key_named(kFixtures + "deimv2_tiny_lite", lite_key, lite_key);
  // The DINOv3 encoder's keys too: a backbone projection missing, and a key bias the config
  // (key_bias false) does not have.
  const std::string dino_key = "model.conv_encoder.backbone.layer.2.attention.k_proj.weight";
  expect_missing_key_named(kFixtures + kDinov3, dino_key, dino_key);
  expect_unexpected_key_named(kFixtures + kDinov3,
                              "model.conv_encoder.backbone.layer.0.attention.k_proj.bias", {32});
}

// deimv2::Config::parse of `edit`(the fixture's config) must fail with exactly `want`.
void expect_config_error(const std::function<void(nlohmann::json&)>& edit, const std::string& want,
                         const std::string& fixture = "deimv2_tiny") {
  auto config = core::read_json_file(kFixtures + fixture + "/config.json");
  edit(config);
  try {
    deimv2::Config::parse(core::ConfigView(config, "config.json"));
    ADD_FAILURE() << "expected a config error: " << want;
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
}

TEST(Deimv2Loading, UnsupportedVariantsAreConfigErrorsNamingTheField) {
  expect_config_error(
      [](nlohmann::json& c) {
        c["backbone_config"] = {{"model_type", "resnet"}};
      },
      "config.json: field 'backbone_config.model_type': unsupported DEIMv2 backbone "
      "\"resnet\" (supported: hgnet_v2, dinov3_vit)");
  // DINOv3: a bare backbone_config has DINOv3ViTConfig's defaults, whose one out stage (the
  // last) cannot feed the encoder's three fusion_proj levels.
  expect_config_error(
      [](nlohmann::json& c) {
        c["backbone_config"] = {{"model_type", "dinov3_vit"}};
      },
      "config.json: field 'backbone_config.out_indices': needs 3 entries "
      "(Deimv2DINOv3ConvEncoder's "
      "3 fusion_proj levels), found [12]");
  expect_config_error([](nlohmann::json& c) { c["backbone_config"]["patch_size"] = 14; },
                      "config.json: field 'backbone_config.patch_size': must be 16: the spatial "
                      "tuning adapter's maps are at strides 8, 16, 32 and Deimv2DINOv3ConvEncoder "
                      "concatenates them with the backbone's resized to patch grids x2, x1, x1/2, "
                      "found 14",
                      kDinov3);
  expect_config_error(
      [](nlohmann::json& c) { c["encoder_type"] = "lite"; },
      "config.json: field 'encoder_type': the lite encoder on a dinov3_vit backbone is not "
      "implemented (the published DINOv3 variants use the hybrid encoder)",
      kDinov3);
  expect_config_error(
      [](nlohmann::json& c) {
        c["backbone_config"]["num_attention_heads"] = 16;  // head size 2
      },
      "config.json: field 'backbone_config.num_attention_heads': the head size hidden_size / "
      "num_attention_heads must be a multiple of 4 (2-D RoPE)",
      kDinov3);
  expect_config_error([](nlohmann::json& c) { c["encoder_type"] = "dino"; },
                      "config.json: field 'encoder_type': unsupported value \"dino\" (supported: "
                      "\"hybrid\", \"lite\")");
  expect_config_error([](nlohmann::json& c) { c["encoder_fuse_op"] = "cat"; },
                      "config.json: field 'encoder_fuse_op': unsupported value \"cat\" "
                      "(supported: \"sum\")");
  expect_config_error([](nlohmann::json& c) { c["model_type"] = "d_fine"; },
                      "config.json: field 'model_type': unsupported value \"d_fine\" "
                      "(supported: \"deimv2\")");
  const auto lite = deimv2::Config::parse(core::ConfigView(
      core::read_json_file(kFixtures + "deimv2_tiny_lite/config.json"), "config.json"));
  EXPECT_TRUE(lite.lite);
  EXPECT_FALSE(lite.use_gateway);
  EXPECT_FALSE(lite.share_bbox_head);
  EXPECT_EQ(lite.decoder_points, (std::vector<int64_t>{4, 2}));
  const auto dino = deimv2::Config::parse(
      core::ConfigView(core::read_json_file(kFixtures + kDinov3 + "/config.json"), "config.json"));
  ASSERT_TRUE(dino.dinov3.has_value());
  EXPECT_EQ(dino.dinov3->out_indices, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(dino.dinov3->num_register_tokens, 2);
  EXPECT_FALSE(dino.dinov3->key_bias);
  EXPECT_FALSE(dino.dinov3->use_gated_mlp);
  EXPECT_EQ(dino.dinov3->adapter_inplanes, 8);
  EXPECT_EQ(dino.backbone_strides(), (std::vector<int64_t>{8, 16, 32}));
}

TEST(Deimv2Model, RejectsBadInputShapes) {
  const auto model = load_model(kFixtures + "deimv2_tiny_lite");
  at::InferenceMode guard;
  // The lite encoder's second level is at twice the backbone's stride 16.
  EXPECT_THROW(model->forward(at::zeros({1, 3, 80, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 1, 64, 64})), std::invalid_argument);
  // 64x64: 16 + 4 = 20 tokens < 25 queries.
  EXPECT_THROW(model->forward(at::zeros({1, 3, 64, 64})), std::invalid_argument);
  const auto out = model->forward(at::zeros({2, 3, 96, 128}));
  EXPECT_EQ(out.logits.sizes(), (at::IntArrayRef{2, 25, 10}));
  EXPECT_EQ(out.pred_boxes.sizes(), (at::IntArrayRef{2, 25, 4}));

  // DINOv3: sides must be multiples of 32 (the backbone's resized maps and the adapter's).
  const auto dino = load_model(kFixtures + kDinov3);
  EXPECT_THROW(dino->forward(at::zeros({1, 3, 320, 336})), std::invalid_argument);
  const auto o = dino->forward(at::zeros({2, 3, 256, 384}));
  EXPECT_EQ(o.logits.sizes(), (at::IntArrayRef{2, 30, 10}));
  EXPECT_EQ(o.pred_boxes.sizes(), (at::IntArrayRef{2, 30, 4}));
}

}  // namespace
