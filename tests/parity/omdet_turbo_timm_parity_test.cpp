// OmDet-Turbo with timm's Swin backbone, the form of omlab/omdet-turbo-swin-tiny-hf
// (use_timm_backbone, a timm model name in `backbone`, backbone_kwargs, backbone_config null;
// weights under vision_backbone.vision_backbone._backbone.* and vision_backbone.layer_norms.*),
// against tests/fixtures/models/omdet_turbo_timm_tiny/make_fixtures.py: a tiny timm Swin (embed
// 4, depths [2, 2, 1, 1], window 5: every map padded to the window) and the cases of
// omdet_turbo_tiny ("batch": astronaut.jpg + coffee.jpg, 3 and 4 classes, default tasks; "task":
// chelsea.jpg with a task of its own).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/core/config.h"
#include "models/model.h"
#include "models/omdet_turbo/config.h"
#include "models/omdet_turbo/omdet_turbo.h"
#include "models/omdet_turbo/postprocess.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

namespace od = models::omdet_turbo;

std::string fixture() { return test::model_fixture("omdet_turbo_timm_tiny"); }

/// A case's pixel_values (its pixel_u8 through the processor's ImageNet mean / std, bit-exact)
/// and the processor's token tensors.
std::pair<at::Tensor, od::TextInputs> case_inputs(const std::string& dir, const std::string& c) {
  const auto u8 = test::expected_tensor(dir, c + "_pixel_u8");
  const auto m = at::tensor({0.485f, 0.456f, 0.406f}).view({1, -1, 1, 1}) * 255.0f;
  const auto s = at::tensor({0.229f, 0.224f, 0.225f}).view({1, -1, 1, 1}) * 255.0f;
  return {(u8.to(at::kFloat) - m) / s,
          {test::expected_tensor(dir, c + "_classes_input_ids"),
           test::expected_tensor(dir, c + "_classes_structure"),
           test::expected_tensor(dir, c + "_tasks_input_ids"),
           test::expected_tensor(dir, c + "_tasks_attention_mask")}};
}

const od::TaskConditioned& task_model(const models::Model& model) {
  const auto* t = dynamic_cast<const od::TaskConditioned*>(&model);
  if (t == nullptr) throw std::runtime_error(model.model_type() + " is not task-conditioned");
  return *t;
}

TEST(OmDetTurboTimmParity, LogitsBoxesAndDetectionsMatchTransformers) {
  // Post-processing of ours at the fixture's threshold and nms_threshold: transformers' labels,
  // scores to 1e-5, boxes to 1e-2 px.
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  const auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "omdet-turbo");
  const auto& tm = task_model(*model);
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : {"batch", "task"}) {
    const auto [pixels, text] = case_inputs(dir, c);
    const auto out = tm.forward_text(pixels, text);
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, c + "_logits"),
                                        test::expected_tensor(dir, c + "_pred_boxes"),
                                        "omdet_turbo_timm_tiny " + c);
    const auto& cm = meta.at("cases").at(c);
    std::vector<std::pair<int64_t, int64_t>> sizes;
    std::vector<int64_t> counts;
    for (const auto& hw : cm.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    for (const auto& l : cm.at("classes")) counts.push_back(static_cast<int64_t>(l.size()));
    const auto dets = od::post_process_grounded_object_detection(
        out.logits, out.pred_boxes, counts, sizes, cm.at("threshold"), meta.at("nms_threshold"));
    ASSERT_EQ(dets.size(), sizes.size());
    for (size_t i = 0; i < dets.size(); ++i) {
      const auto key = c + "_img" + std::to_string(i);
      const auto scores = test::expected_tensor(dir, key + "_scores");
      ASSERT_GT(scores.numel(), 0) << key;
      ASSERT_EQ(dets[i].scores.sizes(), scores.sizes()) << key;
      EXPECT_TRUE(at::equal(dets[i].labels, test::expected_tensor(dir, key + "_labels"))) << key;
      EXPECT_LE(test::max_abs_diff(dets[i].scores, scores), 1e-5) << key;
      EXPECT_LE(test::max_abs_diff(dets[i].boxes, test::expected_tensor(dir, key + "_boxes")), 1e-2)
          << key;
    }
  }
}

TEST(OmDetTurboTimmParity, OnlyTheImgSizeIsAccepted) {
  // timm's PatchEmbed with strict_img_size (its default) refuses any size but img_size (128).
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  const auto model = models::load_model(dir);
  auto [pixels, text] = case_inputs(dir, "task");
  try {
    task_model(*model).forward_text(pixels.slice(2, 0, 64).slice(3, 0, 96).contiguous(), text);
    FAIL() << "a 64x96 image";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "pixel_values: the timm Swin backbone takes 128x128 images only (its img_size; "
              "strict_img_size), got 64x96");
  }
}

TEST(OmDetTurboTimmParity, MissingTimmTensorIsNamed) {
  // The fused qkv of a shifted block, by its timm name (the tokenizer files copied: the loader
  // reads them before the weights).
  const auto src = fixture();
  const std::string key =
      "vision_backbone.vision_backbone._backbone.layers_1.blocks.1.attn.qkv.weight";
  const auto dir = test::corrupted_copy(src, [&](const std::string& k, const at::Tensor& t) {
    return k == key ? std::nullopt : std::optional<at::Tensor>(t);
  });
  const char* const files[] = {"tokenizer.json", "tokenizer_config.json",
                               "special_tokens_map.json"};
  for (const char* f : files) {
    std::ifstream in(src + "/" + f, std::ios::binary);
    std::ofstream out(dir + "/" + f, std::ios::binary);
    out << in.rdbuf();
  }
  EXPECT_EQ(
      test::load_error(dir),
      dir + "/model.safetensors: checkpoint does not match the model: missing keys (1): " + key);
  for (const char* f : files) std::remove((dir + "/" + f).c_str());
  test::remove_copy(dir);
}

/// parse_config of the fixture's config.json after `edit`; the ConfigError's message, or "" when
/// it parses (then into `out`).
std::string parse_edited(const std::function<void(nlohmann::json&)>& edit,
                         od::Config* out = nullptr) {
  auto j = test::read_json(fixture() + "/config.json");
  edit(j);
  try {
    const auto c = od::parse_config(models::core::ConfigView(j, "config.json"));
    if (out) *out = c;
  } catch (const models::core::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(OmDetTurboTimmParity, ConfigForms) {
  // The Hub form: backbone_kwargs' timm.create_model arguments over the name's architecture;
  // timm's 0-based out_indices as stage numbers.
  od::Config hub;
  ASSERT_EQ(parse_edited([](nlohmann::json&) {}, &hub), "");
  const auto& b = hub.backbone;
  EXPECT_TRUE(b.swin.timm);
  EXPECT_EQ(b.swin.embed_dim, 4);
  EXPECT_EQ(b.swin.window_size, 5);
  EXPECT_EQ(b.swin.depths, (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(b.swin.num_heads, (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(b.out_indices, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(b.required_height, 128);
  EXPECT_TRUE(b.always_partition);
  // What transformers 5.17 saves: backbone_config {model_type: timm_backbone, ...}.
  od::Config saved;
  ASSERT_EQ(parse_edited(
                [](nlohmann::json& j) {
                  j["backbone_config"] = j["backbone_kwargs"];
                  j["backbone_config"]["model_type"] = "timm_backbone";
                  j["backbone_config"]["backbone"] = j["backbone"];
                  j["backbone_config"]["features_only"] = true;
                  j["backbone_config"]["return_dict"] = true;  // a PreTrainedConfig field
                  for (const char* k : {"backbone", "backbone_kwargs", "use_timm_backbone"})
                    j.erase(k);
                },
                &saved),
            "");
  EXPECT_EQ(saved.backbone.out_indices, b.out_indices);
  EXPECT_EQ(saved.backbone.swin.depths, b.swin.depths);
  EXPECT_EQ(saved.backbone.required_width, 128);
  // Empty backbone_kwargs: the name's architecture with OmDet's defaults (stages 2..4,
  // image_size, always_partition).
  od::Config tiny;
  ASSERT_EQ(parse_edited(
                [](nlohmann::json& j) {
                  j["backbone_kwargs"] = nlohmann::json::object();
                  j["encoder_in_channels"] = {192, 384, 768};
                },
                &tiny),
            "");
  EXPECT_EQ(tiny.backbone.swin.embed_dim, 96);
  EXPECT_EQ(tiny.backbone.swin.depths, (std::vector<int64_t>{2, 2, 6, 2}));
  EXPECT_EQ(tiny.backbone.swin.window_size, 7);
  EXPECT_EQ(tiny.backbone.out_indices, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(tiny.backbone.required_height, 128);
  EXPECT_TRUE(tiny.backbone.always_partition);
  // Refusals name the field.
  EXPECT_EQ(parse_edited([](nlohmann::json& j) { j["backbone"] = "swin_s3_tiny_224"; }),
            "config.json: field 'backbone': timm model 'swin_s3_tiny_224' is not supported "
            "(supported: swin_tiny_patch4_window7_224, swin_small_patch4_window7_224, "
            "swin_base_patch4_window7_224, swin_base_patch4_window12_384, "
            "swin_large_patch4_window7_224, swin_large_patch4_window12_384)");
  EXPECT_EQ(parse_edited([](nlohmann::json& j) { j["backbone_kwargs"]["head_dim"] = 8; }),
            "config.json: field 'backbone_kwargs.head_dim': not a timm.create_model argument of "
            "SwinTransformer supported here");
  EXPECT_EQ(
      parse_edited([](nlohmann::json& j) { j["apply_layernorm_after_vision_backbone"] = false; }),
      "config.json: field 'apply_layernorm_after_vision_backbone': must be true with a timm "
      "backbone (its maps are channels-last; upstream would feed them to the encoder's "
      "convolutions as they are)");
  EXPECT_EQ(parse_edited([](nlohmann::json& j) {
              j["backbone_kwargs"]["out_indices"] = {2, 1};
            }),
            "config.json: field 'backbone_kwargs.out_indices': must be increasing stage indices in "
            "[0, 4) (or from the end)");
}

}  // namespace
}  // namespace libreyolo
