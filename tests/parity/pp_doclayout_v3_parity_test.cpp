// PP-DocLayoutV3 against transformers 5.17 reference outputs
// (tests/fixtures/models/pp_doclayout_v3_tiny, made on CPU in float32 by its make_fixtures.py: a
// rendered document page and a photograph): the processor's pixels, logits, boxes, masks, the
// reading order, PPDocLayoutV3ImageProcessor.post_process_object_detection, and strict loading.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/image/document_layout.h"
#include "models/layouts/layouts.h"
#include "models/model.h"
#include "models/pp_doclayout_v3/modules.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/document_layout_parity.h"

namespace {

namespace test = libreyolo::test;
using libreyolo::models::load_model;
namespace core = libreyolo::models::core;
namespace image = libreyolo::image;
namespace pp_doclayout_v3 = libreyolo::models::pp_doclayout_v3;

const std::string kDir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/pp_doclayout_v3_tiny";

using test::document_layout::max_abs_diff;
using test::document_layout::pixel_values;

TEST(PPDocLayoutV3Parity, ProcessorPixelsMatchTransformers) {
  // PPDocLayoutV3ImageProcessor: 128x128 bicubic without antialias, on the PNG page and a JPEG.
  test::document_layout::expect_processor_pixels_match(kDir);
}

TEST(PPDocLayoutV3Parity, LogitsBoxesMasksAndOrderMatchTransformers) {
  const auto model = load_model(kDir);
  EXPECT_EQ(model->model_type(), "pp_doclayout_v3");
  EXPECT_EQ(model->task(), libreyolo::models::Task::object_detection);
  EXPECT_EQ(model->description().head, image::DetectionHead::pp_doclayout);
  ASSERT_EQ(model->id2label().size(), 5u);
  EXPECT_EQ(model->id2label().at(2), "table");
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  std::vector<libreyolo::models::ModelOutput> outs;
  for (bool fused : {false, true}) {
    // 1 AIFI encoder layer + 2 decoder self-attentions.
    EXPECT_EQ(model->set_fused_attention(fused), fused ? 3 : 0);
    at::InferenceMode guard;
    outs.push_back(model->forward(pixel_values(*expected)));
    test::document_layout::expect_outputs_match(
        kDir, outs.back(),
        "[parity] pp_doclayout_v3_tiny fused_attention=" + std::to_string(fused));
    EXPECT_TRUE(outs.back().pred_masks.defined());
  }
  model->set_fused_attention(false);
  const double sdpa_vs_manual = max_abs_diff(outs[0].logits, outs[1].logits);
  std::cout << "[parity] pp_doclayout_v3_tiny max|SDPA - manual| = " << sdpa_vs_manual << std::endl;
  EXPECT_EQ(
      libreyolo::models::FamilyRegistry::builtin().find("pp_doclayout_v3")->fused_attention_default,
      sdpa_vs_manual == 0.0);
}

TEST(PPDocLayoutV3Parity, PostProcessedLayoutMatchesTransformersInReadingOrder) {
  const auto model = load_model(kDir);
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  at::InferenceMode guard;
  const auto out = model->forward(pixel_values(*expected));
  // Thresholds 0 and one between two ranked scores (make_fixtures.py): some kept, not all.
  test::document_layout::expect_post_processed_layouts_match(kDir, out);
}

TEST(PPDocLayoutV3Parity, PostProcessedMasksAreTheThresholdedQueryMasks) {
  // Upstream's masks = sigmoid(out_masks) gathered per kept candidate > threshold.
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  const auto masks = expected->view("out_masks");
  const auto pages =
      image::post_process_document_layout(expected->view("logits"), expected->view("pred_boxes"),
                                          expected->view("order_logits"), masks, {}, 0.5);
  ASSERT_EQ(pages[0].detections.scores.numel(), 12);
  const auto rank = image::reading_order(expected->view("order_logits"))[0];
  for (int64_t k = 0; k < 12; ++k) {
    const int64_t q = (rank == pages[0].order[k]).nonzero().item<int64_t>();
    EXPECT_TRUE(at::equal(pages[0].masks[k], masks[0][q].sigmoid().gt(0.5))) << k;
  }
  // Every score is above 0.5 in the fixture; the masks have pixels on both sides.
  EXPECT_GT(pages[0].masks.sum().item<int64_t>(), 0);
  EXPECT_GT(pages[0].masks.logical_not().sum().item<int64_t>(), 0);
}

TEST(PPDocLayoutV3Parity, StrictLoadingNamesTheKey) {
  libreyolo::test::expect_missing_key_named(kDir, "model.decoder_global_pointer.dense.bias",
                                            "model.decoder_global_pointer.dense.bias");
  // Tied heads: model.decoder.class_embed is read from model.enc_score_head, so both miss.
  const auto dir =
      libreyolo::test::corrupted_copy(kDir, [](const std::string& k, const at::Tensor& t) {
        return k == "model.enc_score_head.weight" ? std::nullopt : std::optional<at::Tensor>(t);
      });
  EXPECT_EQ(libreyolo::test::load_error(dir),
            dir +
                "/model.safetensors: checkpoint does not match the model: missing keys (2): "
                "model.enc_score_head.weight, model.decoder.class_embed.weight");
  libreyolo::test::remove_copy(dir);
  libreyolo::test::expect_unexpected_key_named(kDir, "model.decoder.order_head.0.weight", {4});
}

TEST(PPDocLayoutV3Parity, ConfigErrorsNameTheField) {
  const auto config = core::read_json_file(kDir + "/config.json");
  auto expect_field = [&](const std::function<void(nlohmann::json&)>& edit,
                          const std::string& message) {
    auto bad = config;
    edit(bad);
    try {
      pp_doclayout_v3::Config::parse(core::ConfigView(bad, "config.json"));
      ADD_FAILURE() << "expected a ConfigError: " << message;
    } catch (const core::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  expect_field([](auto& c) { c["x4_feat_dim"] = 24; },
               "config.json: field 'x4_feat_dim': must equal the channels of the first backbone "
               "output (16)");
  expect_field([](auto& c) { c["mask_feature_channels"] = {8}; },
               "config.json: field 'mask_feature_channels': expected two positive channel counts");
  expect_field(
      [](auto& c) {
        c["encoder_in_channels"] = {16, 24, 48};
      },
      "config.json: field 'encoder_in_channels': entry 2 must equal the backbone's "
      "output channels [16, 16, 24, 32]");
  expect_field([](auto& c) { c.erase("backbone_config"); },
               "config.json: field 'backbone_config': is required (PPDocLayoutV3Config's default "
               "is HGNetV2 arch \"L\"; write it out)");
  // hidden_sizes[0] (the stride-4 map) is not checked, as transformers never reads it; the
  // fixture has 32 against 16 channels.
  EXPECT_EQ(config["backbone_config"]["hidden_sizes"][0].get<int64_t>(), 32);
  const auto c = pp_doclayout_v3::Config::parse(core::ConfigView(config, "config.json"));
  EXPECT_EQ(c.backbone.out_channels(), (std::vector<int64_t>{16, 16, 24, 32}));
  EXPECT_EQ(c.num_prototypes, 8);
}

TEST(PPDocLayoutV3Parity, LayoutsOnStayWithinToleranceOffIsByteIdentical) {
  test::document_layout::expect_layouts_gate(kDir, {"repvgg", "batchnorm_fold", "qkv_concat"},
                                             "[layouts] pp_doclayout_v3_tiny");
}

}  // namespace
