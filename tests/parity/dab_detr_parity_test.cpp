// DAB-DETR (transformers 5.17 DabDetrForObjectDetection, config.json model_type "dab-detr")
// against its fixture (tests/fixtures/models/conditional_detr_tiny/make_fixtures.py): the HF
// ResNet backbone, hidden_size 16, PReLU feed-forwards, 3 decoder layers refining 30 anchor
// boxes, 5 labels, a batch of two photographs of different sizes (96x96 and 96x144, padded,
// pixel_mask). Inputs are the stored pixels recovered exactly. transformers runs DAB-DETR eagerly
// (no SDPA path): both of our attention paths are held to its outputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/detr_lineage_parity.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

const test::DetrLineageFixture kDab{"dab_detr_tiny", "dab-detr", 30, 5};

TEST(DabDetrParity, LogitsAndBoxesMatchTransformers) {
  test::expect_lineage_logits_and_boxes_match(kDab);
}

TEST(DabDetrParity, PostProcessingMatchesTransformers) {
  test::expect_lineage_detections_match(kDab);
}

TEST(DabDetrParity, ProcessorMatchesPixelU8AndMask) {
  test::expect_lineage_processor_matches(kDab);
}

TEST(DabDetr, RegisteredUnderTheHubModelType) {
  // DabDetrConfig.model_type is "dab-detr" (a hyphen); the family's folder name is dab_detr.
  const auto* f = models::FamilyRegistry::builtin().find("dab-detr");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->name, "dab_detr");
  EXPECT_EQ(models::FamilyRegistry::builtin().find("dab_detr"), nullptr);
}

TEST(DabDetr, MaskDefaultsToAllValidAndAttentionModulesToggle) {
  c10::InferenceMode inference_mode;
  auto model = models::load_model(test::model_fixture(kDab.name));
  const auto x = at::randn({1, 3, 64, 96});
  const auto a = model->forward(x);
  const auto b = model->forward(x, at::ones({1, 64, 96}, at::kLong));
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  EXPECT_TRUE(at::equal(a.pred_boxes, b.pred_boxes));
  auto mask = at::ones({1, 64, 96}, at::kLong);
  mask.narrow(2, 64, 32).zero_();
  EXPECT_FALSE(at::equal(model->forward(x, mask).logits, a.logits));
  // 2 encoder self-attentions + 3 decoder layers x (self, cross).
  const bool fused_default =
      models::FamilyRegistry::builtin().find("dab-detr")->fused_attention_default;
  test::expect_fused_attention_toggles(kDab.name, fused_default, 8);
}

TEST(DabDetr, HalfPrecisionLoadsAndStaysClose) {
  // bfloat16 measured 0.90 of logits up to 51.4 (1.75 %: the anchors refined through 3 layers),
  // boxes 1.0e-2.
  test::expect_lineage_half_precision_close(kDab, 0.03, 0.03);
}

TEST(DabDetrLoading, MissingAndUnexpectedKeysAreNamed) {
  // Strict: a PReLU slope, the anchors, the decoder's heads, the first layer's query position
  // projection; the second layer has none (keep_query_pos false), and the encoder has no final
  // norm (normalize_before false).
  const auto dir = test::model_fixture(kDab.name);
  test::expect_missing_key_named(dir, "model.encoder.layers.1.activation_fn.weight",
                                 "model.encoder.layers.1.activation_fn.weight");
  test::expect_missing_key_named(dir, "model.decoder.layers.2.mlp.activation_fn.weight",
                                 "model.decoder.layers.2.mlp.activation_fn.weight");
  test::expect_missing_key_named(dir, "model.query_refpoint_embeddings.weight",
                                 "model.query_refpoint_embeddings.weight");
  test::expect_missing_key_named(dir, "model.decoder.ref_anchor_head.layers.1.bias",
                                 "model.decoder.ref_anchor_head.layers.1.bias");
  test::expect_missing_key_named(
      dir, "model.decoder.layers.0.cross_attn.cross_attn_query_pos_proj.weight",
      "model.decoder.layers.0.cross_attn.cross_attn_query_pos_proj.weight");
  test::expect_missing_key_named(dir, "model.encoder.query_scale.layers.0.weight",
                                 "model.encoder.query_scale.layers.0.weight");
  test::expect_unexpected_key_named(
      dir, "model.decoder.layers.1.cross_attn.cross_attn_query_pos_proj.weight", {16, 16});
  test::expect_unexpected_key_named(dir, "model.encoder.norm.weight", {16});
}

TEST(DabDetrLoading, TheDecoderCopyOfTheTiedBoxHeadLoadsTheSame) {
  // DabDetrForObjectDetection ties model.decoder.bbox_embed to bbox_predictor: a file with the
  // decoder's copy only, or with both, gives the same outputs.
  c10::InferenceMode inference_mode;
  const auto src = test::model_fixture(kDab.name);
  const auto pixels = test::normalized_pixels(src);
  const auto mask = test::expected_mask(src);
  const auto ref = models::load_model(src)->forward(pixels, mask);
  const std::string prefix = "bbox_predictor.";
  for (bool keep_original : {false, true}) {
    const auto dir = test::edited_copy(src, [&](test::NamedTensors& tensors) {
      test::NamedTensors out;
      for (auto& [key, t] : tensors) {
        if (key.rfind(prefix, 0) == 0) {
          out.emplace_back("model.decoder.bbox_embed." + key.substr(prefix.size()), t);
          if (!keep_original) continue;
        }
        out.emplace_back(key, t);
      }
      tensors = std::move(out);
    });
    const auto out = models::load_model(dir)->forward(pixels, mask);
    EXPECT_TRUE(at::equal(out.pred_boxes, ref.pred_boxes)) << keep_original;
    EXPECT_TRUE(at::equal(out.logits, ref.logits)) << keep_original;
    test::remove_copy(dir);
  }
}

TEST(DabDetrLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture(kDab.name);
  const auto base = test::read_json(src + "/config.json");
  test::ConfigProbe probe(src);
  const std::string file = probe.dir() + "/config.json";
  auto c = base;
  c["query_dim"] = 2;
  EXPECT_EQ(probe.error_of(c), file + ": field 'query_dim': must be 4 (DabDetrConfig)");
  c = base;
  c["encoder_attention_heads"] = 3;
  EXPECT_EQ(probe.error_of(c), file + ": field 'encoder_attention_heads': must divide hidden_size");
  c = base;
  c["activation_function"] = "mish";
  EXPECT_NE(probe.error_of(c).find("field 'activation_function'"), std::string::npos)
      << probe.error_of(c);
  c = base;
  c["activation_function"] = "relu";  // no PReLU slopes then: the file's are unexpected
  EXPECT_NE(probe.error_of(c).find("unexpected keys (5): model.decoder.layers.0.mlp.activation_fn."
                                   "weight"),
            std::string::npos)
      << probe.error_of(c);
  c = base;
  c["num_patterns"] = 3;  // the file has no pattern embeddings
  EXPECT_NE(probe.error_of(c).find("missing keys (1): model.patterns.weight"), std::string::npos)
      << probe.error_of(c);
  c = base;
  c["temperature_width"] = 0;
  EXPECT_EQ(probe.error_of(c), file + ": field 'temperature_width': must be positive");
}

TEST(DabDetrLayouts, DefaultsFoldTheResNetAndConcatenateTheEncoderSelfAttentions) {
  // kernels.layouts default on CPU: batchnorm_fold on transformers' ResNet (1 stem + 4 basic
  // layers x 2 convolutions + 3 projection shortcuts = 12) and qkv_concat on the 2 encoder
  // self-attentions (DAB-DETR's DetrAttention; the decoder's have their own projections).
  const auto model = models::load_model(test::model_fixture(kDab.name));
  const auto& r = model->layouts();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].layout, "batchnorm_fold");
  EXPECT_EQ(r[0].modules, 12);
  EXPECT_EQ(r[1].layout, "qkv_concat");
  EXPECT_EQ(r[1].modules, 2);
  EXPECT_EQ(r[1].classes, std::vector<std::string>{"DetrAttention"});
  EXPECT_EQ(r[1].source, "default (dab-detr)");
}

}  // namespace
}  // namespace libreyolo
