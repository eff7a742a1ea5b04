// D-FINE against transformers 5.17 reference outputs (tests/fixtures/models/dfine_tiny, made on
// CPU in float32 with the default SDPA attention; fixtures/README.md): logits, boxes, the
// post-processed detections, the weighting function, and strict checkpoint loading.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/dfine/modules.h"
#include "models/image/postprocess.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/checkpoint_copy.h"

namespace {

using libreyolo::models::load_model;
using libreyolo::models::LoadOptions;
namespace core = libreyolo::models::core;
namespace dfine = libreyolo::models::dfine;
/// D-FINE's registered Family::fused_attention_default.
const bool kFusedAttentionDefault =
    libreyolo::models::FamilyRegistry::builtin().find("d_fine")->fused_attention_default;

const std::string kDir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/dfine_tiny";

// fixtures/README.md: pixel_values = float32(u8) * float32(rescale_factor), bit for bit.
at::Tensor pixel_values(const core::SafetensorsFile& expected) {
  const auto pre = core::read_json_file(kDir + "/preprocessor_config.json");
  const float rescale = static_cast<float>(pre.at("rescale_factor").get<double>());
  return expected.view("pixel_u8").to(at::kFloat) * rescale;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(DFineParity, LogitsAndBoxesMatchTransformersWithBothAttentionPaths) {
  const auto model = load_model(kDir);
  EXPECT_EQ(model->model_type(), "d_fine");
  EXPECT_EQ(model->task(), libreyolo::models::Task::object_detection);
  ASSERT_EQ(model->id2label().size(), 10u);
  EXPECT_EQ(model->id2label().at(7), "LABEL_7");
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  const auto logits_ref = expected->view("logits");
  const auto boxes_ref = expected->view("pred_boxes");
  const auto pixels = pixel_values(*expected);
  // 1 AIFI encoder layer + 2 decoder self-attentions; the default is the manual math.
  EXPECT_EQ(model->set_fused_attention(kFusedAttentionDefault), 0);
  EXPECT_EQ(model->set_fused_attention(false), 0);
  std::vector<libreyolo::models::ModelOutput> outs;
  for (bool fused : {false, true}) {
    if (fused) EXPECT_EQ(model->set_fused_attention(true), 3);
    at::InferenceMode guard;
    outs.push_back(model->forward(pixels));
    const auto& out = outs.back();
    ASSERT_EQ(out.logits.sizes(), logits_ref.sizes());
    ASSERT_EQ(out.pred_boxes.sizes(), boxes_ref.sizes());
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    const double dl = max_abs_diff(out.logits, logits_ref);
    const double db = max_abs_diff(out.pred_boxes, boxes_ref);
    std::cout << "[parity] dfine_tiny fused_attention=" << fused << ": max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << std::endl;
    EXPECT_LE(dl, 1e-4);
    EXPECT_LE(db, 1e-5);
  }
  // The fused-attention policy (DESIGN.md): SDPA by default only where it is byte-exact.
  const double sdpa_vs_manual = std::max(max_abs_diff(outs[0].logits, outs[1].logits),
                                         max_abs_diff(outs[0].pred_boxes, outs[1].pred_boxes));
  std::cout << "[parity] dfine_tiny max|SDPA - manual| = " << sdpa_vs_manual << std::endl;
  EXPECT_EQ(kFusedAttentionDefault, sdpa_vs_manual == 0.0);
}

TEST(DFineParity, PostProcessedDetectionsMatchTransformers) {
  // Our model's outputs through the daemon's post-processing (d_fine -> the RT-DETR head)
  // against transformers' post_process_object_detection of its own outputs.
  const auto model = load_model(kDir);
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  const auto meta = core::read_json_file(kDir + "/meta.json");
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  at::InferenceMode guard;
  const auto out = model->forward(pixel_values(*expected));
  const auto head = model->description().head;
  double max_score = 0, max_box = 0;
  for (const char* th : {"0.0", "0.3"}) {
    libreyolo::image::PostProcessOptions opt;
    opt.threshold = std::stod(th);
    const auto dets = libreyolo::image::post_process_object_detection(out.logits, out.pred_boxes,
                                                                      sizes, head, opt);
    ASSERT_EQ(dets.size(), 1u);
    const std::string key = std::string("th") + th + "_img0";
    const auto s = expected->view(key + "_scores");
    ASSERT_EQ(dets[0].scores.numel(), s.numel()) << key;
    EXPECT_EQ(s.numel(), meta["postprocess"][key]["count"].get<int64_t>());
    EXPECT_TRUE(at::equal(dets[0].labels, expected->view(key + "_labels")))
        << key << ": labels or their order differ";
    max_score = std::max(max_score, max_abs_diff(dets[0].scores, s));
    max_box = std::max(max_box, max_abs_diff(dets[0].boxes, expected->view(key + "_boxes")));
  }
  std::cout << "[parity] dfine_tiny post-processed: max|score diff| = " << max_score
            << ", max|box diff| = " << max_box << " px" << std::endl;
  EXPECT_LE(max_score, 1e-5);
  EXPECT_LE(max_box, 1e-2);  // 1e-5 of the 512 px target size
}

TEST(DFineParity, WeightingFunctionMatchesTransformers) {
  // transformers 5.17 weighting_function(32, tensor([0.5]), tensor([4.0])), float32.
  const std::vector<float> want = {-4.0f,
                                   -1.9999990463256836f,
                                   -1.788130283355713f,
                                   -1.591224193572998f,
                                   -1.408224105834961f,
                                   -1.2381482124328613f,
                                   -1.0800833702087402f,
                                   -0.9331817626953125f,
                                   -0.7966545820236206f,
                                   -0.6697695255279541f,
                                   -0.5518454313278198f,
                                   -0.4422494173049927f,
                                   -0.34039342403411865f,
                                   -0.24573087692260742f,
                                   -0.157753586769104f,
                                   -0.07598960399627686f,
                                   0.0f};
  const auto w = dfine::weighting_function(32, at::full({1}, 0.5f), at::full({1}, 4.0f));
  ASSERT_EQ(w.sizes(), (at::IntArrayRef{33}));
  ASSERT_EQ(w.scalar_type(), at::kFloat);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(w[i].item<float>()) - want[i]));
    worst = std::max(worst, std::abs(double(w[32 - i].item<float>()) + want[i]));  // symmetric
  }
  std::cout << "[parity] weighting_function(32, 0.5, 4): max|diff| = " << worst << std::endl;
  EXPECT_EQ(worst, 0.0);  // same float32 operations: bit-identical
  // hf-models.md 4.5's numbers (10 digits): W[1] is not exactly -2 (float32 pow).
  EXPECT_NEAR(w[1].item<float>(), -1.9999990463, 1e-9);
  EXPECT_NE(w[1].item<float>(), -2.0f);
  EXPECT_NEAR(w[2].item<float>(), -1.7881302834, 1e-9);
  EXPECT_NEAR(w[3].item<float>(), -1.5912241936, 1e-9);
  EXPECT_NEAR(w[27].item<float>(), 1.2381482124, 1e-9);
  EXPECT_EQ(w[16].item<float>(), 0.0f);
  EXPECT_EQ(w[32].item<float>(), 4.0f);
  // Other parameters (transformers: weighting_function(16, [0.7], [3.0])).
  const auto w2 = dfine::weighting_function(16, at::full({1}, 0.7f), at::full({1}, 3.0f));
  ASSERT_EQ(w2.numel(), 17);
  EXPECT_EQ(w2[0].item<float>(), -4.199999809265137f);
  EXPECT_EQ(w2[1].item<float>(), -2.1000008583068848f);
  EXPECT_EQ(w2[9].item<float>(), 0.1754239797592163f);
}

TEST(DFineParity, Distance2BBoxDecodesEdgeDistances) {
  // reg_scale 4: zero distances give the box (cx, cy, w, h) itself; distances are in units of
  // w / 4 (x) and h / 4 (y): left 1 -> x0 moves by w / 4.
  const auto p = at::tensor({0.5f, 0.5f, 0.4f, 0.2f}).view({1, 1, 4});
  const auto rs = at::full({1}, 4.0f);
  auto b = dfine::distance2bbox(p, at::zeros({1, 1, 4}), rs);
  EXPECT_TRUE(at::allclose(b, p)) << b;
  b = dfine::distance2bbox(p, at::tensor({1.0f, 0.0f, 0.0f, 2.0f}).view({1, 1, 4}), rs);
  // x0 = 0.3 - 0.1 = 0.2, x1 = 0.7; y0 = 0.4, y1 = 0.6 + 2 * 0.05 = 0.7.
  const auto want = at::tensor({0.45f, 0.55f, 0.5f, 0.3f}).view({1, 1, 4});
  EXPECT_TRUE(at::allclose(b, want)) << b;
}

std::string corrupted_copy(
    const std::function<std::optional<at::Tensor>(const std::string&, const at::Tensor&)>& edit) {
  return libreyolo::test::corrupted_copy(kDir, edit);
}
using libreyolo::test::remove_copy;

// Loads `dir` expecting an error whose message contains every `needle`.
void expect_load_error(const std::string& dir, const std::vector<std::string>& needles) {
  try {
    load_model(dir);
    ADD_FAILURE() << "expected a loading error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    std::cout << "[dfine load error] " << what.substr(0, 400) << std::endl;
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << n << " in " << what;
  }
}

TEST(DFineLoading, MissingKeyAndWrongShapeAreNamed) {
  const std::string missing = "model.decoder.lqe_layers.1.reg_conf.layers.0.weight";
  auto tmp = corrupted_copy([&](const std::string& k, const at::Tensor& t) {
    return k == missing ? std::nullopt : std::optional<at::Tensor>(t);
  });
  expect_load_error(tmp, {missing, "missing"});
  remove_copy(tmp);

  // The backbone's learnable affine block: (1,) -> (2,).
  const std::string lab = "model.backbone.model.embedder.stem1.lab.scale";
  tmp = corrupted_copy([&](const std::string& k, const at::Tensor& t) {
    return std::optional<at::Tensor>(k == lab ? at::cat({t, t}) : t);
  });
  expect_load_error(tmp, {lab, "shape mismatch", "[1]", "[2]"});
  remove_copy(tmp);
}

TEST(DFineLoading, ConfigErrorsNameTheField) {
  auto config = core::read_json_file(kDir + "/config.json");
  auto bad = config;
  bad["decoder_n_points"] = {3, 6};
  EXPECT_THROW(
      {
        try {
          dfine::Config::parse(core::ConfigView(bad, "config.json"));
        } catch (const core::ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("decoder_n_points"), std::string::npos);
          throw;
        }
      },
      core::ConfigError);
  bad = config;
  bad["eval_idx"] = 0;
  EXPECT_THROW(dfine::Config::parse(core::ConfigView(bad, "config.json")), core::ConfigError);
  bad = config;
  bad["backbone_config"]["hidden_sizes"] = {64, 128, 256, 1024};
  try {
    dfine::Config::parse(core::ConfigView(bad, "config.json"));
    FAIL() << "hidden_sizes differing from stage_out_channels in a returned stage was accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'backbone_config.hidden_sizes': must equal "
                                         "stage_out_channels for the stages in out_indices"),
              std::string::npos)
        << e.what();
  }
  // The stage the backbone does not return (stage1; out_indices 2, 3, 4) may differ: DFineConfig's
  // default HGNetV2 (D-FINE L as published) has hidden_sizes[0] 256, stage_out_channels[0] 128.
  auto unreturned = config;
  unreturned["backbone_config"]["hidden_sizes"] = {256, 128, 256, 512};
  EXPECT_EQ(
      dfine::Config::parse(core::ConfigView(unreturned, "config.json")).backbone.out_channels(),
      (std::vector<int64_t>{128, 256, 512}));
  const auto c = dfine::Config::parse(core::ConfigView(config, "config.json"));
  EXPECT_EQ(c.decoder_points, (std::vector<int64_t>{3, 6, 3}));
  EXPECT_EQ(c.backbone.out_channels(), (std::vector<int64_t>{128, 256, 512}));
  EXPECT_EQ(c.backbone.out_strides(), (std::vector<int64_t>{8, 16, 32}));
  EXPECT_TRUE(c.backbone.use_learnable_affine_block);
}

TEST(DFineModel, HalfPrecisionLoadsAndReturnsFloat32) {
  // float16 / bfloat16 weights on the CPU (a 96x96 crop keeps the half convolutions fast):
  // float32 outputs of the right shapes. Closeness to the float32 model is reported, not
  // asserted (other queries may win the top-k at this precision).
  const auto expected = core::SafetensorsFile::open(kDir + "/expected.safetensors");
  const auto pixels = pixel_values(*expected).slice(2, 272, 368).slice(3, 272, 368).contiguous();
  const auto reference = load_model(kDir);
  at::InferenceMode guard;
  const auto want = reference->forward(pixels);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    LoadOptions options;
    options.dtype = dtype;
    const auto model = load_model(kDir, options);
    EXPECT_EQ(model->options().dtype, dtype);
    const auto out = model->forward(pixels);
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    EXPECT_EQ(out.pred_boxes.scalar_type(), at::kFloat);
    EXPECT_EQ(out.logits.sizes(), want.logits.sizes());
    EXPECT_EQ(out.pred_boxes.sizes(), want.pred_boxes.sizes());
    std::cout << "[parity] dfine_tiny " << c10::toString(dtype)
              << " (96x96 crop): max|pred_boxes diff| vs float32 = "
              << max_abs_diff(out.pred_boxes, want.pred_boxes) << std::endl;
  }
}

TEST(DFineModel, RejectsBadInputShapes) {
  const auto model = load_model(kDir);
  at::InferenceMode guard;
  EXPECT_THROW(model->forward(at::zeros({1, 3, 100, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 1, 64, 64})), std::invalid_argument);
  // 32x32 gives 16 + 4 + 1 = 21 tokens < 30 queries.
  EXPECT_THROW(model->forward(at::zeros({1, 3, 32, 32})), std::invalid_argument);
  const auto out = model->forward(at::zeros({2, 3, 64, 96}));
  EXPECT_EQ(out.logits.sizes(), (at::IntArrayRef{2, 30, 10}));
  EXPECT_EQ(out.pred_boxes.sizes(), (at::IntArrayRef{2, 30, 4}));
}

}  // namespace
