// ViT (vit_tiny fixture, transformers 5.17 ViTForImageClassification) against the stored
// reference logits: `logits` (SDPA, transformers' default) and `logits_eager`, with both of our
// attention paths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>

#include "models/model.h"
#include "models/vit/vit.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

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
  // extra_expected.safetensors (tests/fixtures/models/swin_tiny/make_extra_expected.py): 160x192
  // random pixels with transformers' interpolate_pos_encoding=True (bicubic 14x14 -> 10x12).
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("vit_tiny");
  auto model = models::load_model(dir);
  const auto file = models::core::SafetensorsFile::open(dir + "/extra_expected.safetensors");
  const auto x = file->view("pixel_values").clone();
  ASSERT_EQ(x.sizes(), (at::IntArrayRef{2, 3, 160, 192}));
  test::expect_logits_match_both_paths(*model, x, file->view("logits"), file->view("logits_eager"),
                                       "vit_tiny 160x192");
}

TEST(VitParity, SetFusedAttentionCountsChangedModules) {
  const auto dir = test::model_fixture("vit_tiny");
  auto model = models::load_model(dir);
  // Two encoder layers, one attention module each; default is models::vit::kFusedAttentionDefault.
  EXPECT_EQ(model->set_fused_attention(models::vit::kFusedAttentionDefault), 0);
  EXPECT_EQ(model->set_fused_attention(!models::vit::kFusedAttentionDefault), 2);
  EXPECT_EQ(model->set_fused_attention(!models::vit::kFusedAttentionDefault), 0);
}

TEST(VitParity, RejectsBadInput) {
  auto model = models::load_model(test::model_fixture("vit_tiny"));
  EXPECT_THROW(model->forward(at::zeros({1, 1, 224, 224})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({3, 224, 224})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 3, 8, 8})), std::invalid_argument);  // < one patch
  EXPECT_THROW(model->forward(at::zeros({1, 3, 224, 224}, at::kDouble)), std::invalid_argument);
}

TEST(VitParity, HalfPrecisionLoadsAndStaysClose) {
  // LoadOptions dtype float16 / bfloat16 on CPU: outputs are float32 and near the float32 model.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("vit_tiny");
  const auto pixels = test::normalized_pixels(dir);
  const auto ref = models::load_model(dir)->forward(pixels);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_model(dir, options);
    // One input rule (models::check_pixel_values): float32 input is converted to the model's dtype.
    EXPECT_TRUE(at::equal(model->forward(pixels).logits, model->forward(pixels.to(dtype)).logits));
    const auto out = model->forward(pixels.to(dtype));
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    const double d = test::max_abs_diff(out.logits, ref.logits);
    std::cout << "[vit_tiny " << dtype << "] max|logits - float32 logits| = " << d << "\n";
    EXPECT_LE(d, 0.1);
  }
}

}  // namespace
}  // namespace libreyolo
