// PP-DocLayoutV3 against transformers 5.17 reference outputs
// (tests/fixtures/models/pp_doclayout_v3_tiny, made on CPU in float32 by its make_fixtures.py: a
// rendered document page and a photograph): the processor's pixels, logits, boxes, masks, the
// reading order, PPDocLayoutV3ImageProcessor.post_process_object_detection, and strict loading.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "models/image/document_layout.h"
#include "models/image/processor.h"
#include "models/layouts/layouts.h"
#include "models/model.h"
#include "models/pp_doclayout_v3/modules.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"

namespace {

using libreyolo::models::load_model;
namespace core = libreyolo::models::core;
namespace image = libreyolo::image;
namespace pp_doclayout_v3 = libreyolo::models::pp_doclayout_v3;

const std::string kDir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/pp_doclayout_v3_tiny";
const std::string kImages = std::string(LIBREYOLO_TEST_FIXTURES) + "/images";

at::Tensor pixel_values(const core::SafetensorsFile& expected) {
  // pixel_values = float32(u8) / 255 (rescale 1/255 fused with mean 0, std 1), bit for bit.
  return expected.view("pixel_u8").to(at::kFloat) / 255.0f;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(PPDocLayoutV3Parity, ProcessorPixelsMatchTransformers) {
  // PPDocLayoutV3ImageProcessor: 128x128 bicubic without antialias, on the PNG page and a JPEG.
  const auto processor = image::load_image_processor(kDir);
  EXPECT_FALSE(processor->config().antialias);
  std::vector<at::Tensor> images;
  for (const char* name : {"document_page.png", "coffee.jpg"}) {
    const auto bytes = read_bytes(kImages + "/" + name);
    images.push_back(image::decode_image(bytes.data(), bytes.size()));
  }
  const auto out = processor->preprocess(images);
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  EXPECT_TRUE(at::equal(out.pixel_u8, expected->view("pixel_u8")));
  EXPECT_TRUE(at::equal(out.pixel_values, pixel_values(*expected)));
  EXPECT_EQ(out.original_sizes, (std::vector<std::pair<int64_t, int64_t>>{{240, 180}, {400, 600}}));
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
    const auto& out = outs.back();
    ASSERT_EQ(out.logits.sizes(), expected->view("logits").sizes());
    ASSERT_EQ(out.pred_masks.sizes(), expected->view("out_masks").sizes());
    ASSERT_EQ(out.order_logits.sizes(), expected->view("order_logits").sizes());
    const double dl = max_abs_diff(out.logits, expected->view("logits"));
    const double db = max_abs_diff(out.pred_boxes, expected->view("pred_boxes"));
    const double dm = max_abs_diff(out.pred_masks, expected->view("out_masks"));
    const double dord = max_abs_diff(out.order_logits, expected->view("order_logits"));
    std::cout << "[parity] pp_doclayout_v3_tiny fused_attention=" << fused
              << ": max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
              << ", max|masks diff| = " << dm << ", max|order_logits diff| = " << dord << std::endl;
    EXPECT_LE(dl, 1e-4);
    EXPECT_LE(db, 1e-5);
    EXPECT_LE(dm, 2e-4);
    EXPECT_LE(dord, 1e-4);
    EXPECT_TRUE(at::equal(image::reading_order(out.order_logits), expected->view("order_seq")));
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
  const auto meta = core::read_json_file(kDir + "/meta.json");
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  at::InferenceMode guard;
  const auto out = model->forward(pixel_values(*expected));
  int thresholds = 0;
  for (const auto& [key0, entry] : meta.at("postprocess").items()) {
    if (key0.size() < 5 || key0.substr(key0.size() - 5) != "_img0") continue;
    ++thresholds;
    const double th = entry.at("threshold").get<double>();
    const auto pages = image::post_process_document_layout(
        out.logits, out.pred_boxes, out.order_logits, out.pred_masks, sizes, th);
    ASSERT_EQ(pages.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const std::string key = key0.substr(0, key0.size() - 1) + std::to_string(i);
      const auto& p = pages[i];
      ASSERT_EQ(p.detections.scores.numel(), meta["postprocess"][key]["count"].get<int64_t>())
          << key;
      EXPECT_TRUE(at::equal(p.order, expected->view(key + "_order_seq"))) << key;
      EXPECT_TRUE(at::equal(p.detections.labels, expected->view(key + "_labels"))) << key;
      EXPECT_LE(max_abs_diff(p.detections.scores, expected->view(key + "_scores")), 1e-5) << key;
      // 1e-5 of the 600 px target width.
      EXPECT_LE(max_abs_diff(p.detections.boxes, expected->view(key + "_boxes")), 6e-3) << key;
      ASSERT_EQ(p.masks.size(0), p.detections.scores.size(0));
      EXPECT_EQ(p.masks.sizes().slice(1), expected->view("out_masks").sizes().slice(2));
    }
  }
  EXPECT_EQ(thresholds, 2);
  // The second threshold keeps some detections, not all (make_fixtures.py picks it so).
  EXPECT_EQ(meta["postprocess"].size(), 4u);
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
  // The layouts gate of tests/parity/layouts_parity_test.cpp for this family (its fixture has
  // its own post-processing keys): every layout on stays within the bars on every output.
  c10::InferenceMode guard;
  at::set_num_threads(1);
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  auto with_mode = [](libreyolo::kernels::LayoutMode mode) {
    libreyolo::models::LoadOptions o;
    o.layouts.mode.value = mode;
    o.layouts.mode.source = libreyolo::kernels::Source::flag;
    return o;
  };
  const auto on = load_model(kDir, with_mode(libreyolo::kernels::LayoutMode::on));
  const auto off = load_model(kDir, with_mode(libreyolo::kernels::LayoutMode::off));
  EXPECT_TRUE(off->layouts().empty());
  std::vector<std::string> applied;
  for (const auto& r : on->layouts()) applied.push_back(r.layout);
  std::cout << "[layouts] pp_doclayout_v3_tiny (on):\n"
            << libreyolo::models::layouts::describe(on->layouts());
  EXPECT_EQ(applied, (std::vector<std::string>{"repvgg", "batchnorm_fold", "qkv_concat"}));
  const auto pixels = pixel_values(*expected);
  const auto a = on->forward(pixels), b = off->forward(pixels),
             c = load_model(kDir)->forward(pixels);
  EXPECT_TRUE(at::equal(b.logits, c.logits));
  const double dl = max_abs_diff(a.logits, expected->view("logits"));
  const double db = max_abs_diff(a.pred_boxes, expected->view("pred_boxes"));
  const double dm = max_abs_diff(a.pred_masks, expected->view("out_masks"));
  const double dord = max_abs_diff(a.order_logits, expected->view("order_logits"));
  std::cout << "[layouts] pp_doclayout_v3_tiny on: logits " << dl << ", boxes " << db << ", masks "
            << dm << ", order_logits " << dord << std::endl;
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
  EXPECT_LE(dm, 2e-4);
  EXPECT_LE(dord, 1e-4);
  EXPECT_TRUE(at::equal(image::reading_order(a.order_logits), expected->view("order_seq")));
}

}  // namespace
