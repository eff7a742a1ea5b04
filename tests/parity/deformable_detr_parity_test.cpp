// Deformable DETR (transformers 5.17 DeformableDetrForObjectDetection, HF ResNet backbone)
// against the stored reference outputs of three fixtures: default (tied heads, batch of two
// padded sizes with pixel_mask), with_box_refine, and two_stage. Inputs are the stored pixels
// recovered exactly; the batched case uses the stored pixel_mask.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include "models/core/safetensors.h"
#include "models/deformable_detr/geometry.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

/// The family's registered Family::fused_attention_default.
bool fused_default() {
  return models::FamilyRegistry::builtin().find("deformable_detr")->fused_attention_default;
}

class DeformableDetrParity : public ::testing::TestWithParam<const char*> {};

TEST_P(DeformableDetrParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "deformable_detr");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label().size(), 10u);
  const auto pixels = test::normalized_pixels(dir);
  const auto mask = test::expected_mask(dir);
  const auto logits_ref = test::expected_tensor(dir, "logits");
  const auto boxes_ref = test::expected_tensor(dir, "pred_boxes");
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    test::expect_logits_and_boxes_match(
        model->forward(pixels, mask), logits_ref, boxes_ref,
        std::string(GetParam()) + (fused ? " sdpa" : " manual") + " decoder self-attention");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeformableDetrParity,
                         ::testing::Values("deformable_detr_tiny", "deformable_detr_tiny_refine",
                                           "deformable_detr_tiny_two_stage"));

TEST(DeformableDetr, MaskDefaultsToAllValid) {
  c10::InferenceMode inference_mode;
  auto model = models::load_model(test::model_fixture("deformable_detr_tiny"));
  const auto x = at::randn({1, 3, 64, 96});
  const auto a = model->forward(x);
  const auto b = model->forward(x, at::ones({1, 64, 96}, at::kLong));
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  EXPECT_TRUE(at::equal(a.pred_boxes, b.pred_boxes));
  // Two decoder layers, one self-attention module each.
  EXPECT_EQ(model->set_fused_attention(!fused_default()), 2);
}

TEST(DeformableDetr, RejectsBadInput) {
  auto model = models::load_model(test::model_fixture("deformable_detr_tiny"));
  const auto x = at::zeros({1, 3, 64, 64});
  EXPECT_THROW(model->forward(at::zeros({1, 4, 64, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 32, 64}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 64, 64}, at::kFloat)), std::invalid_argument);
  // Two-stage: 12 proposals need at least 12 encoder tokens (a 16x16 input has 8 = 4+2+1+1).
  auto two_stage = models::load_model(test::model_fixture("deformable_detr_tiny_two_stage"));
  EXPECT_THROW(two_stage->forward(at::zeros({1, 3, 16, 16})), std::invalid_argument);
}

TEST(DeformableDetrGeometry, SineEmbeddingAndValidRatios) {
  // One image, 2x4 level whose last column is padding.
  auto mask = at::ones({1, 2, 4}, at::kBool);
  mask.select(2, 3).fill_(false);
  const auto r = models::deformable_detr::valid_ratio(mask, at::kFloat);
  EXPECT_TRUE(at::allclose(r, at::tensor({0.75f, 1.0f}).view({1, 2})));
  const auto pos = models::deformable_detr::sine_position_embedding(mask, 4, at::kFloat);
  EXPECT_EQ(pos.sizes(), (at::IntArrayRef{1, 8, 2, 4}));
  // Channel 0 = sin(y) with y = (1 - 0.5) / (2 + 1e-6) * 2pi at row 0.
  const double y0 = 0.5 / (2 + 1e-6) * 2 * M_PI;
  EXPECT_NEAR(pos[0][0][0][0].item<double>(), std::sin(y0), 1e-6);
  // Channel 4 = sin(x) with x = (1 - 0.5) / (3 + 1e-6) * 2pi at column 0 (3 valid columns).
  const double x0 = 0.5 / (3 + 1e-6) * 2 * M_PI;
  EXPECT_NEAR(pos[0][4][0][0].item<double>(), std::sin(x0), 1e-6);
}

TEST(DeformableDetrLoading, RefineBoxHeadsAreNotSilentlyTied) {
  // with_box_refine heads are distinct: a checkpoint without model.decoder.bbox_embed.1.* must
  // fail (not fall back to bbox_embed.0), naming the missing key.
  const auto tmp = test::corrupted_copy(test::model_fixture("deformable_detr_tiny_refine"),
                                        [](const std::string& k, const at::Tensor& t) {
                                          return k.rfind("model.decoder.bbox_embed.1.", 0) == 0
                                                     ? std::nullopt
                                                     : std::optional<at::Tensor>(t);
                                        });
  try {
    models::load_model(tmp);
    FAIL() << "expected a CheckpointError";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    std::cout << "[refine missing head] " << what.substr(0, 300) << "\n";
    EXPECT_NE(what.find("bbox_embed.1.layers.0.weight"), std::string::npos) << what;
  }
  test::remove_copy(tmp);
}

TEST(DeformableDetr, HalfPrecisionLoadsAndStaysClose) {
  // LoadOptions dtype float16 / bfloat16 on CPU: outputs are float32 and near the float32 model.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("deformable_detr_tiny");
  // Image 1 (the padded one), cropped to 160x240 to keep float16 CPU convolutions fast.
  const auto pixels =
      test::normalized_pixels(dir).slice(0, 1, 2).slice(2, 0, 160).slice(3, 0, 240).contiguous();
  const auto mask =
      test::expected_mask(dir).slice(0, 1, 2).slice(1, 0, 160).slice(2, 0, 240).contiguous();
  const auto ref = models::load_model(dir)->forward(pixels, mask);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_model(dir, options);
    // One input rule (models::check_pixel_values): float32 input is converted to the model's dtype.
    EXPECT_TRUE(at::equal(model->forward(pixels, mask).logits,
                          model->forward(pixels.to(dtype), mask).logits));
    const auto out = model->forward(pixels.to(dtype), mask);
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    const double d = test::max_abs_diff(out.logits, ref.logits);
    std::cout << "[deformable_detr_tiny " << dtype << "] max|logits - float32 logits| = " << d
              << "\n";
    EXPECT_LE(d, 0.15);
    ASSERT_TRUE(out.pred_boxes.defined());
    EXPECT_EQ(out.pred_boxes.scalar_type(), at::kFloat);
    const double db = test::max_abs_diff(out.pred_boxes, ref.pred_boxes);
    std::cout << "[deformable_detr_tiny " << dtype
              << "] max|pred_boxes - float32 pred_boxes| = " << db << "\n";
    EXPECT_LE(db, 0.03);
  }
}

TEST(DeformableDetrLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture("deformable_detr_tiny");
  const auto base = test::read_json(src + "/config.json");
  char tmpl[] = "/tmp/libreyolo_ddetr_cfg_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string tmp = tmpl;
  auto expect_error = [&](nlohmann::json config, const std::string& needle) {
    std::ofstream(tmp + "/config.json") << config.dump();
    try {
      models::load_model(tmp);
      ADD_FAILURE() << "expected an error naming " << needle;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("config.json"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  auto c = base;
  c["use_timm_backbone"] = true;
  expect_error(c, "backbone_config");
  c = base;
  c["two_stage"] = true;  // without with_box_refine
  expect_error(c, "two_stage");
  c = base;
  c["position_embedding_type"] = "learned";
  expect_error(c, "position_embedding_type");
  c = base;
  c["d_model"] = 48;  // GroupNorm(32, d_model)
  expect_error(c, "d_model");
  c = base;
  c["backbone_config"]["layer_type"] = "preact";
  expect_error(c, "backbone_config.layer_type");
  std::remove((tmp + "/config.json").c_str());
  rmdir(tmp.c_str());
}

}  // namespace
}  // namespace libreyolo
