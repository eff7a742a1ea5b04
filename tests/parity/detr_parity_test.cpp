// DETR (transformers 5.17 DetrForObjectDetection) against three fixtures
// (tests/fixtures/models/detr_tiny/make_fixtures.py): transformers' ResNet backbone
// (detr_tiny), timm's ResNet as facebook/detr-resnet-50 lays it out with the Hub's config.json
// form (detr_tiny_timm, Bottleneck) and with transformers 5.17's saved form
// (detr_tiny_timm_basic, BasicBlock). Each is a batch of two photographs of different sizes
// (160x160 and 160x240, padded, pixel_mask). Inputs are the stored pixels recovered exactly.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

const char* const kFixtures[] = {"detr_tiny", "detr_tiny_timm", "detr_tiny_timm_basic"};

std::vector<std::pair<int64_t, int64_t>> target_sizes(const std::string& dir) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  const auto meta = test::read_json(dir + "/meta.json");  // outlives the loop
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  return sizes;
}

class DetrParity : public ::testing::TestWithParam<const char*> {};

TEST_P(DetrParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "detr");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label().size(), 5u);
  EXPECT_EQ(model->description().head, image::DetectionHead::detr);
  const auto pixels = test::normalized_pixels(dir);
  const auto mask = test::expected_mask(dir);
  ASSERT_EQ(pixels.sizes(), (at::IntArrayRef{2, 3, 160, 240}));
  ASSERT_EQ(mask.select(0, 0).sum().item<int64_t>(), 160 * 160);  // image 0 is padded
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = model->forward(pixels, mask);
    // logits (B, Q, num_labels + 1): the last class is "no object".
    ASSERT_EQ(out.logits.sizes(), (at::IntArrayRef{2, 10, 6}));
    const std::string label = std::string(GetParam()) + (fused ? " sdpa" : " manual");
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits"),
                                        test::expected_tensor(dir, "pred_boxes"), label);
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits_eager"),
                                        test::expected_tensor(dir, "pred_boxes_eager"),
                                        label + " vs transformers eager");
  }
}

TEST_P(DetrParity, PostProcessingMatchesTransformers) {
  // Our DetrImageProcessor.post_process_object_detection of our outputs against transformers'
  // of its outputs: counts, labels in query order exactly, scores and boxes (original pixels).
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  auto model = models::load_model(dir);
  const auto out = model->forward(test::normalized_pixels(dir), test::expected_mask(dir));
  const auto sizes = target_sizes(dir);
  int64_t kept_at_03 = 0;
  for (const char* th : {"0.0", "0.3"}) {
    image::PostProcessOptions opt;
    opt.threshold = std::stod(th);
    const auto dets = image::post_process_object_detection(out.logits, out.pred_boxes, sizes,
                                                           image::DetectionHead::detr, opt);
    ASSERT_EQ(dets.size(), 2u);
    for (size_t i = 0; i < dets.size(); ++i) {
      const std::string key = std::string("th") + th + "_img" + std::to_string(i);
      SCOPED_TRACE(key);
      const auto s = test::expected_tensor(dir, key + "_scores");
      ASSERT_EQ(dets[i].scores.numel(), s.numel());
      if (std::string(th) == "0.0") EXPECT_EQ(s.numel(), 10);  // no top-k: every query
      if (std::string(th) == "0.3") kept_at_03 += s.numel();
      EXPECT_TRUE(at::equal(dets[i].labels, test::expected_tensor(dir, key + "_labels")));
      if (s.numel() == 0) continue;
      EXPECT_LE(test::max_abs_diff(dets[i].scores, s), 1e-5);
      EXPECT_LE(test::max_abs_diff(dets[i].boxes, test::expected_tensor(dir, key + "_boxes")),
                1e-2);
    }
  }
  // The fixtures' "no object" bias puts threshold 0.3 inside the scores: some kept, some not.
  EXPECT_GT(kept_at_03, 0);
  EXPECT_LT(kept_at_03, 20);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DetrParity, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return std::string(info.param); });

TEST(DetrPostProcess, TopKKeepsTheBestQueriesNoTopKKeepsQueryOrder) {
  // 1 image, 4 queries, 2 classes + "no object".
  const auto logits = at::tensor({0.f, 0.f, 3.f,  // best 0.0
                                  2.f, 0.f, 0.f,  // label 0
                                  0.f, 4.f, 0.f,  // label 1, the best score
                                  1.f, 1.5f, 0.f})
                          .view({1, 4, 3});
  const auto boxes = at::full({1, 4, 4}, 0.5f);
  const auto prob = at::softmax(logits, -1).narrow(-1, 0, 2);
  const auto [best, label] = prob.max(-1);
  image::PostProcessOptions opt;
  opt.threshold = 0.0;
  auto all = image::post_process_object_detection(logits, boxes, {{10, 20}},
                                                  image::DetectionHead::detr, opt);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(at::equal(all[0].scores, best[0]));  // query order, not sorted
  EXPECT_TRUE(at::equal(all[0].labels, label[0]));
  EXPECT_TRUE(at::allclose(all[0].boxes.select(0, 0), at::tensor({5.f, 2.5f, 15.f, 7.5f})));
  opt.top_k = 2;
  auto two = image::post_process_object_detection(logits, boxes, {{10, 20}},
                                                  image::DetectionHead::detr, opt);
  EXPECT_TRUE(at::equal(two[0].labels, at::tensor({1, 0}, at::kLong)));
  EXPECT_FLOAT_EQ(two[0].scores[0].item<float>(), best[0][2].item<float>());
  EXPECT_FLOAT_EQ(two[0].scores[1].item<float>(), best[0][1].item<float>());
  opt.top_k = 100;  // more than Q: every query, query order
  auto many = image::post_process_object_detection(logits, boxes, {{10, 20}},
                                                   image::DetectionHead::detr, opt);
  EXPECT_TRUE(at::equal(many[0].scores, best[0]));
  try {
    image::post_process_object_detection(logits.narrow(-1, 0, 1), boxes, {},
                                         image::DetectionHead::detr, opt);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "post_process_object_detection: DETR logits need the \"no object\" class and at "
              "least one other, got 1 classes");
  }
}

TEST(DetrParity, ProcessorMatchesPixelU8AndMask) {
  // DetrImageProcessor (shortest_edge 160, longest_edge 256): resize within 1 of torchvision's
  // uint8 kernel, the padded batch's pixel_mask exactly.
  const auto dir = test::model_fixture("detr_tiny");
  const image::ImageProcessor proc(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  std::vector<at::Tensor> images;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  const auto out = proc.preprocess(images);
  const auto ref = test::expected_tensor(dir, "pixel_u8");
  ASSERT_EQ(out.pixel_u8.sizes(), ref.sizes());
  const auto d = (out.pixel_u8.to(at::kInt) - ref.to(at::kInt)).abs();
  const double equal = d.eq(0).sum().item<double>() / static_cast<double>(d.numel());
  std::cout << "[detr_tiny] pixel_u8 " << 100.0 * equal << " % equal, max |diff| "
            << d.max().item<int>() << "\n";
  EXPECT_GE(equal, 0.99);
  EXPECT_LE(d.max().item<int>(), 1);
  ASSERT_TRUE(out.pixel_mask.defined());
  EXPECT_TRUE(at::equal(out.pixel_mask, test::expected_mask(dir)));
}

TEST(Detr, MaskDefaultsToAllValidAndAttentionModulesToggle) {
  c10::InferenceMode inference_mode;
  auto model = models::load_model(test::model_fixture("detr_tiny"));
  const auto x = at::randn({1, 3, 64, 96});
  const auto a = model->forward(x);
  const auto b = model->forward(x, at::ones({1, 64, 96}, at::kLong));
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  EXPECT_TRUE(at::equal(a.pred_boxes, b.pred_boxes));
  // 2 encoder self-attentions + 2 decoder layers x (self, cross).
  const bool fused_default =
      models::FamilyRegistry::builtin().find("detr")->fused_attention_default;
  test::expect_fused_attention_toggles("detr_tiny", fused_default, 6);
}

TEST(Detr, RejectsBadInput) {
  auto model = models::load_model(test::model_fixture("detr_tiny_timm"));
  const auto x = at::zeros({1, 3, 64, 64});
  EXPECT_THROW(model->forward(at::zeros({1, 4, 64, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 32, 64}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 64, 64}, at::kFloat)), std::invalid_argument);
}

TEST(Detr, HalfPrecisionLoadsAndStaysClose) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("detr_tiny_timm");
  const auto pixels = test::normalized_pixels(dir);
  const auto mask = test::expected_mask(dir);
  const auto ref = models::load_model(dir)->forward(pixels, mask);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_model(dir, options);
    const auto out = model->forward(pixels.to(dtype), mask);
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(out.logits, model->forward(pixels, mask).logits));
    const double d = test::max_abs_diff(out.logits, ref.logits);
    const double db = test::max_abs_diff(out.pred_boxes, ref.pred_boxes);
    std::cout << "[detr_tiny_timm " << dtype << "] max|logits - float32| = " << d
              << ", max|pred_boxes - float32| = " << db << "\n";
    EXPECT_LE(d, 0.25);  // bfloat16 measured 0.153 (its 8-bit mantissa through 9 layers)
    EXPECT_LE(db, 0.03);
  }
}

TEST(DetrLoading, MissingAndUnexpectedKeysAreNamed) {
  // Strict: one missing tensor of each backbone naming, of the transformer and of the heads.
  const auto hf = test::model_fixture("detr_tiny");
  test::expect_missing_key_named(hf, "model.decoder.layernorm.weight",
                                 "model.decoder.layernorm.weight");
  test::expect_missing_key_named(hf,
                                 "model.backbone.conv_encoder.model.encoder.stages.2.layers.1."
                                 "layer.1.normalization.running_var",
                                 "model.backbone.conv_encoder.model.encoder.stages.2.layers.1."
                                 "layer.1.normalization.running_var");
  const auto timm = test::model_fixture("detr_tiny_timm");
  test::expect_missing_key_named(timm, "model.backbone.conv_encoder.model.layer2.1.bn2.running_var",
                                 "model.backbone.conv_encoder.model.layer2.1.bn2.running_var");
  test::expect_missing_key_named(timm,
                                 "model.backbone.conv_encoder.model.layer3.0.downsample.1.weight",
                                 "model.backbone.conv_encoder.model.layer3.0.downsample.1.weight");
  // The key the architecture is read from: the same message as the strict loader's.
  test::expect_missing_key_named(timm, "model.backbone.conv_encoder.model.conv1.weight",
                                 "model.backbone.conv_encoder.model.conv1.weight");
  test::expect_missing_key_named(timm, "bbox_predictor.layers.2.bias",
                                 "bbox_predictor.layers.2.bias");
  test::expect_unexpected_key_named(timm, "model.backbone.conv_encoder.model.fc.weight", {5, 32});
  test::expect_unexpected_key_named(hf, "model.encoder.layers.0.mlp.fc1.weight", {40, 32});
}

TEST(DetrLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture("detr_tiny_timm");
  const auto base = test::read_json(src + "/config.json");
  char tmpl[] = "/tmp/libreyolo_detr_cfg_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string tmp = tmpl;
  ASSERT_EQ(symlink((src + "/model.safetensors").c_str(), (tmp + "/model.safetensors").c_str()), 0);
  auto error_of = [&](const nlohmann::json& config) {
    std::ofstream(tmp + "/config.json") << config.dump();
    try {
      models::load_model(tmp);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  const std::string file = tmp + "/config.json";
  auto c = base;
  c["dilation"] = true;  // DC5: the same weights, the last stage dilated: loads
  EXPECT_EQ(error_of(c), "(loaded)");
  c = test::read_json(test::model_fixture("detr_tiny_timm_basic") + "/config.json");
  c["backbone_config"]["output_stride"] = 8;
  EXPECT_EQ(error_of(c), file +
                             ": field 'backbone_config.output_stride': must be 32, or 16 "
                             "(DETR-DC5: the last stage dilated)");
  c = base;
  c["backbone"] = "efficientnet_b0";
  EXPECT_EQ(error_of(c), file +
                             ": field 'backbone': timm backbone \"efficientnet_b0\" is not "
                             "supported (timm's plain ResNets: resnet18, resnet34, resnet50, "
                             "resnet101, ...)");
  c = base;
  c["backbone"] = "timm/resnet50.a1_in1k";  // the tiny checkpoint is not timm's resnet50
  EXPECT_EQ(error_of(c), tmp +
                             "/model.safetensors: checkpoint does not match the model: backbone "
                             "\"timm/resnet50.a1_in1k\" has Bottleneck blocks [3, 4, 6, 3] per "
                             "stage, the checkpoint Bottleneck blocks [1, 2, 1, 1]");
  c["backbone"] = "resnet18";
  EXPECT_EQ(error_of(c), tmp +
                             "/model.safetensors: checkpoint does not match the model: backbone "
                             "\"resnet18\" has BasicBlock blocks [2, 2, 2, 2] per stage, the "
                             "checkpoint Bottleneck blocks [1, 2, 1, 1]");
  c = base;
  c["position_embedding_type"] = "rope";
  EXPECT_NE(error_of(c).find("position_embedding_type"), std::string::npos) << error_of(c);
  c = base;
  c["d_model"] = 30;  // 2 heads divide it, but the weights are 32 wide
  const auto shape_error = error_of(c);
  EXPECT_NE(shape_error.find("model.safetensors: checkpoint does not match the model"),
            std::string::npos)
      << shape_error;
  // Both named, whichever the module order lists first (detr_common.h's ConvStem registers the
  // input_projection before the object queries).
  EXPECT_NE(shape_error.find("'model.input_projection.weight': "
                             "expected [30, 128, 1, 1], found [32, 128, 1, 1]"),
            std::string::npos)
      << shape_error;
  EXPECT_NE(shape_error.find("'model.query_position_embeddings.weight': "
                             "expected [10, 30], found [10, 32]"),
            std::string::npos)
      << shape_error;
  std::remove((tmp + "/config.json").c_str());
  std::remove((tmp + "/model.safetensors").c_str());
  rmdir(tmp.c_str());
}

}  // namespace
}  // namespace libreyolo

namespace libreyolo {
namespace {

TEST(DetrLayouts, DefaultsFoldTheResNetAndConcatenateTheSelfAttentions) {
  // kernels.layouts default on CPU: batchnorm_fold on the ResNet and qkv_concat on the 4
  // DetrSelfAttentions (2 encoder, 2 decoder; the cross-attentions keep their projections).
  // transformers' ResNet: 1 stem + 5 bottlenecks x 3 convolutions + 3 projection shortcuts = 19
  // ResNetConvLayer / ResNetShortCut modules. timm's: the stem (ResNet: conv1 + bn1) and the 5
  // blocks, each folding all its conv/bn pairs (layers::SiblingConvNorms) = 6 modules.
  struct Case {
    const char* name;
    int64_t modules;
    std::vector<std::string> classes;
  };
  for (const auto& c : {Case{"detr_tiny", 19, {"ResNetConvLayer", "ResNetShortCut"}},
                        Case{"detr_tiny_timm", 6, {"Bottleneck", "ResNet"}},
                        Case{"detr_tiny_timm_basic", 6, {"BasicBlock", "ResNet"}}}) {
    SCOPED_TRACE(c.name);
    const auto model = models::load_model(test::model_fixture(c.name));
    const auto& r = model->layouts();
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].layout, "batchnorm_fold");
    EXPECT_EQ(r[0].modules, c.modules);
    EXPECT_EQ(r[0].classes, c.classes);
    EXPECT_EQ(r.back().layout, "qkv_concat");
    EXPECT_EQ(r.back().modules, 4);
    EXPECT_EQ(r.back().classes, std::vector<std::string>{"DetrSelfAttention"});
    EXPECT_EQ(r.back().source, "default (detr)");
  }
}

}  // namespace
}  // namespace libreyolo
