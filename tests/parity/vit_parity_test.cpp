// ViT (vit_tiny fixture, transformers 5.17 ViTForImageClassification) against the stored
// reference logits: `logits` (SDPA, transformers' default) and `logits_eager`, with both of our
// attention paths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>

#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

/// The family's registered Family::fused_attention_default.
bool fused_default() {
  return models::FamilyRegistry::builtin().find("vit")->fused_attention_default;
}

TEST(VitParity, LogitsMatchTransformersWithBothAttentionPaths) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("vit_tiny");
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "vit");
  EXPECT_EQ(model->task(), models::Task::image_classification);
  EXPECT_EQ(model->id2label().size(), 5u);
  EXPECT_EQ(model->id2label().at(4), "LABEL_4");
  const auto pixels = test::normalized_pixels(dir);
  const auto sdpa_ref = test::expected_tensor(dir, "logits");
  const auto eager_ref = test::expected_tensor(dir, "logits_eager");
  test::expect_logits_match_both_paths(*model, pixels, sdpa_ref, eager_ref, "vit_tiny");
  EXPECT_FALSE(model->forward(pixels).pred_boxes.defined());  // a classifier has no boxes
}

TEST(VitParity, InterpolatedPositionEmbeddingsMatchTransformers) {
  // 160x192 random pixels with transformers' interpolate_pos_encoding=True (bicubic 14x14 ->
  // 10x12).
  test::expect_extra_expected_match("vit_tiny", {2, 3, 160, 192}, "vit_tiny 160x192");
}

TEST(VitParity, SetFusedAttentionCountsChangedModules) {
  // Two encoder layers, one attention module each.
  test::expect_fused_attention_toggles("vit_tiny", fused_default(), 2);
}

TEST(VitParity, RejectsBadInput) {
  auto model = test::expect_classifier_rejects_bad_input("vit_tiny");
  EXPECT_THROW(model->forward(at::zeros({1, 3, 224, 224}, at::kDouble)), std::invalid_argument);
}

TEST(VitParity, HalfPrecisionLoadsAndStaysClose) {
  test::expect_half_precision_close("vit_tiny", 0.1);
}

}  // namespace
}  // namespace libreyolo
