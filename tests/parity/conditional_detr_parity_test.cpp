// Conditional DETR (transformers 5.17 ConditionalDetrForObjectDetection) against its fixture
// (tests/fixtures/models/conditional_detr_tiny/make_fixtures.py): a timm ResNet backbone in the
// Hub's config.json form, d_model 16, 30 queries x 5 labels, a batch of two photographs of
// different sizes (96x96 and 96x144, padded, pixel_mask). Inputs are the stored pixels recovered
// exactly. DAB-DETR's fixture has the same layout (dab_detr_parity_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "models/image/decode.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/detr_lineage_parity.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

const test::DetrLineageFixture kConditional{"conditional_detr_tiny", "conditional_detr", 30, 5};

TEST(ConditionalDetrParity, LogitsAndBoxesMatchTransformers) {
  test::expect_lineage_logits_and_boxes_match(kConditional);
}

TEST(ConditionalDetrParity, PostProcessingMatchesTransformers) {
  test::expect_lineage_detections_match(kConditional);
}

TEST(ConditionalDetrParity, ProcessorMatchesPixelU8AndMask) {
  test::expect_lineage_processor_matches(kConditional);
}

TEST(ConditionalDetr, MaskDefaultsToAllValidAndAttentionModulesToggle) {
  c10::InferenceMode inference_mode;
  auto model = models::load_model(test::model_fixture(kConditional.name));
  const auto x = at::randn({1, 3, 64, 96});
  const auto a = model->forward(x);
  const auto b = model->forward(x, at::ones({1, 64, 96}, at::kLong));
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  EXPECT_TRUE(at::equal(a.pred_boxes, b.pred_boxes));
  // A padded column changes the result (the key padding mask reaches the attentions).
  auto mask = at::ones({1, 64, 96}, at::kLong);
  mask.narrow(2, 64, 32).zero_();
  EXPECT_FALSE(at::equal(model->forward(x, mask).logits, a.logits));
  // 2 encoder self-attentions + 2 decoder layers x (self, cross).
  const bool fused_default =
      models::FamilyRegistry::builtin().find("conditional_detr")->fused_attention_default;
  test::expect_fused_attention_toggles(kConditional.name, fused_default, 6);
}

TEST(ConditionalDetr, RejectsBadInput) {
  auto model = models::load_model(test::model_fixture(kConditional.name));
  const auto x = at::zeros({1, 3, 64, 64});
  EXPECT_THROW(model->forward(at::zeros({1, 4, 64, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 32, 64}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 64, 64}, at::kFloat)), std::invalid_argument);
}

TEST(ConditionalDetr, HalfPrecisionLoadsAndStaysClose) {
  // bfloat16 measured 0.28 of logits up to 36.8 (0.75 %), boxes 5.5e-3.
  test::expect_lineage_half_precision_close(kConditional, 0.02, 0.02);
}

TEST(ConditionalDetrLoading, MissingAndUnexpectedKeysAreNamed) {
  // Strict: the first decoder layer's query position projection (only that layer has one), the
  // reference point head, a backbone tensor; the second layer's ca_qpos_proj is unexpected, as
  // is the "mlp." naming of transformers' in-memory modules.
  const auto dir = test::model_fixture(kConditional.name);
  test::expect_missing_key_named(dir, "model.decoder.layers.0.ca_qpos_proj.weight",
                                 "model.decoder.layers.0.ca_qpos_proj.weight");
  test::expect_missing_key_named(dir, "model.decoder.ref_point_head.layers.1.bias",
                                 "model.decoder.ref_point_head.layers.1.bias");
  test::expect_missing_key_named(dir, "model.decoder.layers.1.encoder_attn.out_proj.bias",
                                 "model.decoder.layers.1.encoder_attn.out_proj.bias");
  test::expect_missing_key_named(dir, "model.backbone.conv_encoder.model.layer4.0.bn2.running_var",
                                 "model.backbone.conv_encoder.model.layer4.0.bn2.running_var");
  test::expect_unexpected_key_named(dir, "model.decoder.layers.1.ca_qpos_proj.weight", {16, 16});
  test::expect_unexpected_key_named(dir, "model.encoder.layers.0.mlp.fc1.weight", {24, 16});
}

TEST(ConditionalDetrLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture(kConditional.name);
  const auto base = test::read_json(src + "/config.json");
  test::ConfigProbe probe(src);
  const std::string file = probe.dir() + "/config.json";
  auto c = base;
  c["decoder_attention_heads"] = 3;
  EXPECT_EQ(probe.error_of(c), file + ": field 'decoder_attention_heads': must divide d_model");
  c = base;
  c["backbone"] = "efficientnet_b0";
  EXPECT_EQ(probe.error_of(c), file +
                                   ": field 'backbone': timm backbone \"efficientnet_b0\" is not "
                                   "supported (timm's plain ResNets: resnet18, resnet34, resnet50, "
                                   "resnet101, ...)");
  c = base;
  c["position_embedding_type"] = "rope";
  EXPECT_NE(probe.error_of(c).find("field 'position_embedding_type'"), std::string::npos)
      << probe.error_of(c);
  c = base;
  c["activation_function"] = "prelu";  // DAB-DETR's, not Conditional DETR's
  EXPECT_NE(probe.error_of(c).find("field 'activation_function'"), std::string::npos)
      << probe.error_of(c);
  c = base;
  c["num_queries"] = 20;  // the object queries are 30 in the file
  const auto shape_error = probe.error_of(c);
  EXPECT_NE(shape_error.find("shape mismatch for 'model.query_position_embeddings.weight': "
                             "expected [20, 16], found [30, 16]"),
            std::string::npos)
      << shape_error;
  c = base;
  c.erase("num_queries");  // ConditionalDetrConfig's default: 300
  EXPECT_NE(probe.error_of(c).find("expected [300, 16], found [30, 16]"), std::string::npos);
}

TEST(ConditionalDetrLayouts, DefaultsFoldTheResNetAndConcatenateTheEncoderSelfAttentions) {
  // kernels.layouts default on CPU: batchnorm_fold on timm's ResNet (the stem and the 4
  // BasicBlocks of the fixture's resnet18 layout, every conv/bn pair of each) and qkv_concat on the
  // 2 encoder self-attentions (the decoder's conditional attentions have their own projections).
  const auto model = models::load_model(test::model_fixture(kConditional.name));
  const auto& r = model->layouts();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].layout, "batchnorm_fold");
  EXPECT_EQ(r[0].modules, 5);
  EXPECT_EQ(r[0].classes, (std::vector<std::string>{"BasicBlock", "ResNet"}));
  EXPECT_EQ(r[0].source, "default (conditional_detr)");
  EXPECT_EQ(r[1].layout, "qkv_concat");
  EXPECT_EQ(r[1].modules, 2);
  EXPECT_EQ(r[1].classes, std::vector<std::string>{"ConditionalDetrSelfAttention"});
  EXPECT_EQ(r[1].source, "default (conditional_detr)");
}

}  // namespace
}  // namespace libreyolo
