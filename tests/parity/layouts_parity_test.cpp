// The layouts' parity gate (issue "kernels layer: layouts"): with every layout on, each model
// fixture stays within the model tolerances of the transformers reference outputs (CPU float32:
// logits <= 1e-4, boxes <= 1e-5) on both attention paths, and the post-processed detections
// equal the transformers ones; with layouts off, nothing is rewritten and the outputs are
// byte-identical to the modules as loaded. Prints the measured table ([layouts] lines).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "models/core/safetensors.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/layers/attention.h"
#include "models/layouts/catalog.h"
#include "models/layouts/layouts.h"
#include "models/model.h"
#include "models/rtdetr/modules.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

using kernels::LayoutMode;
using models::LayoutOptions;
using models::LoadOptions;

const std::vector<std::string> kFixtures{"rtdetr_tiny",
                                         "rtdetr_tiny_basic",
                                         "rtdetr_v2_tiny",
                                         "rtdetr_v2_tiny_discrete",
                                         "dfine_tiny",
                                         "deformable_detr_tiny",
                                         "deformable_detr_tiny_refine",
                                         "deformable_detr_tiny_two_stage",
                                         "detr_tiny",
                                         "detr_tiny_timm",
                                         "conditional_detr_tiny",
                                         "dab_detr_tiny",
                                         "table_transformer_tiny",
                                         "vit_tiny",
                                         "deit_tiny",
                                         "deit_tiny_distilled",
                                         "swin_tiny",
                                         "yolos_tiny",
                                         "yolos_tiny_mid",
                                         "deimv2_tiny",
                                         "deimv2_tiny_lite",
                                         "deimv2_tiny_dinov3",
                                         "lw_detr_tiny",
                                         "rf_detr_tiny",
                                         "rf_detr_seg_tiny"};

LoadOptions with_mode(LayoutMode mode) {
  LoadOptions o;
  o.layouts.mode.value = mode;
  o.layouts.mode.source = kernels::Source::flag;
  return o;
}

/// The model input as the transformers processor made it (fixtures/README.md), and the mask.
/// The RF-DETR fixtures store no pixel_u8: our RfDetrImageProcessor on their photographs (bit
/// for bit transformers': rf_detr_parity_test.cpp).
std::pair<at::Tensor, at::Tensor> inputs(const std::string& dir) {
  const auto pre = test::read_json(dir + "/preprocessor_config.json");
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  if (!file->contains("pixel_u8")) {
    std::vector<at::Tensor> images;
    const auto meta = test::read_json(dir + "/meta.json");
    for (const auto& name : meta.at("images"))
      images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                                name.get<std::string>()));
    const image::ImageProcessor proc(
        image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
    auto out = proc.preprocess(images);
    return {out.pixel_values, out.pixel_mask};
  }
  at::Tensor mask =
      file->contains("pixel_mask") ? file->view("pixel_mask").clone().to(at::kLong) : at::Tensor();
  if (pre.value("do_normalize", true)) return {test::normalized_pixels(dir), mask};
  const float rescale = static_cast<float>(pre.at("rescale_factor").get<double>());
  return {file->view("pixel_u8").to(at::kFloat) * rescale, mask};
}

/// Detectors and instance segmentation (RF-DETR's mask head): logits and boxes.
bool is_detector(const models::Model& m) {
  return m.task() == models::Task::object_detection ||
         m.task() == models::Task::instance_segmentation;
}

class LayoutsParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutsParity, OnStaysWithinToleranceOffIsByteIdentical) {
  c10::InferenceMode inference_mode;
  // Bit equality of two forwards needs a fixed thread count: on a loaded machine MKL's dynamic
  // threading may give one GEMM fewer threads than the other, which reorders its sums
  // (rtdetr_v2_tiny's "off" forwards differed by 1 ulp under ctest -j2). One thread per process
  // (CTest runs each case in its own) keeps it exact.
  at::set_num_threads(1);
  const std::string name = GetParam();
  const std::string dir = test::model_fixture(name);
  const auto [pixels, mask] = inputs(dir);
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");

  const auto off = models::load_model(dir, with_mode(LayoutMode::off));
  const auto on = models::load_model(dir, with_mode(LayoutMode::on));
  EXPECT_TRUE(off->layouts().empty());
  ASSERT_FALSE(on->layouts().empty()) << name << ": no layout applied with layouts on";
  std::cout << "[layouts] " << name << " (on):\n" << models::layouts::describe(on->layouts());

  // Off: two loads without layouts agree bit for bit, and so does a load whose kernel_config
  // sets every class to off while the mode is on (nothing may be rewritten either way).
  LoadOptions all_off = with_mode(LayoutMode::on);
  for (const auto& info : models::layouts::layout_catalog())
    for (const auto& cls : info.replaces)
      all_off.layouts.kernel_config.push_back({cls, {{cls, ""}}, "off"});
  const auto denied = models::load_model(dir, all_off);
  EXPECT_TRUE(denied->layouts().empty());
  const auto plain = models::load_model(dir, with_mode(LayoutMode::off));

  for (bool fused : {false, true}) {
    for (auto* m : {off.get(), on.get(), denied.get(), plain.get()}) m->set_fused_attention(fused);
    const auto out_off = off->forward(pixels, mask);
    const auto out_on = on->forward(pixels, mask);
    EXPECT_TRUE(at::equal(out_off.logits, plain->forward(pixels, mask).logits)) << name;
    EXPECT_TRUE(at::equal(out_off.logits, denied->forward(pixels, mask).logits)) << name;
    const char* path = fused ? "sdpa  " : "manual";
    if (is_detector(*on)) {
      const auto logits_ref = file->view("logits"), boxes_ref = file->view("pred_boxes");
      const double dl = test::max_abs_diff(out_on.logits, logits_ref);
      const double db = test::max_abs_diff(out_on.pred_boxes, boxes_ref);
      const double dl_off = test::max_abs_diff(out_off.logits, logits_ref);
      const double db_off = test::max_abs_diff(out_off.pred_boxes, boxes_ref);
      std::cout << std::setprecision(3) << "[layouts] " << std::left << std::setw(32) << name
                << path << " on: logits " << dl << ", boxes " << db << " | off: logits " << dl_off
                << ", boxes " << db_off << "\n";
      EXPECT_LE(dl, 1e-4) << name << " " << path;
      EXPECT_LE(db, 1e-5) << name << " " << path;
      EXPECT_TRUE(at::equal(out_off.pred_boxes, plain->forward(pixels, mask).pred_boxes)) << name;
      if (file->contains("pred_masks")) {
        const double dm = test::max_abs_diff(out_on.pred_masks, file->view("pred_masks"));
        std::cout << "[layouts] " << std::left << std::setw(32) << name << path << " on: masks "
                  << dm << "\n";
        EXPECT_LE(dm, 1e-4) << name << " " << path;  // rf_detr_parity_test.cpp's bound
      }

      // Post-processed detections at threshold 0.3 in the fixture's target sizes: the same
      // labels in the same order as transformers' (and the same count).
      const auto meta = test::read_json(dir + "/meta.json");
      std::vector<std::pair<int64_t, int64_t>> sizes;
      for (const auto& hw : meta.at("target_sizes_hw"))
        sizes.emplace_back(hw.at(0).get<int64_t>(), hw.at(1).get<int64_t>());
      image::PostProcessOptions pp;
      pp.threshold = 0.3;
      const auto head = on->description().head;
      const auto dets =
          image::post_process_object_detection(out_on.logits, out_on.pred_boxes, sizes, head, pp);
      for (size_t i = 0; i < dets.size(); ++i) {
        const std::string key = "th0.3_img" + std::to_string(i) + "_";
        const auto labels_ref = file->view(key + "labels");
        ASSERT_EQ(dets[i].labels.numel(), labels_ref.numel()) << name << " image " << i;
        EXPECT_TRUE(at::equal(dets[i].labels, labels_ref.to(at::kLong))) << name << " image " << i;
        EXPECT_LE(test::max_abs_diff(dets[i].scores, file->view(key + "scores")), 1e-4) << name;
      }
    } else {
      const auto ref = file->view(fused ? "logits" : "logits_eager");
      const double d = test::max_abs_diff(out_on.logits, ref);
      const double d_off = test::max_abs_diff(out_off.logits, ref);
      std::cout << std::setprecision(3) << "[layouts] " << std::left << std::setw(32) << name
                << path << " on: logits " << d << " | off: logits " << d_off << "\n";
      EXPECT_LE(d, 1e-4) << name << " " << path;
      EXPECT_TRUE(at::equal(at::argmax(out_on.logits, -1), at::argmax(ref, -1))) << name;
    }
  }
}

// What each layout did to rtdetr_tiny (ResNet-vd bottleneck backbone, hybrid encoder with 4 CSP
// blocks of 3 RepVGG blocks, 1 AIFI + 2 decoder self-attentions), counted from its config.json:
// repvgg 12 blocks, 32256 -> 27840 elements (each 3x3+1x1 conv-BN pair of 32 channels becomes
// one 3x3 kernel with bias); batchnorm_fold the other 37 conv-norm modules (3 stem + 4 stages of
// bottlenecks + shortcuts, encoder 1x1/3x3), 4 BN tensors per module -> 1 bias, and the 3 + 4
// encoder_input_proj / decoder_input_proj Sequential(Conv2d, BatchNorm2d) pairs of 32 channels
// (1x1 from 32/48/64 channels: 4608 + 384 BN elements; 3 x 1x1 32->32 and the extra level's 3x3
// stride 2: 12288 + 512; each BN -> a 32 bias: -96), 49848 + 17792 -> 47304 + 17120;
// avgpool_fold the 3 pooled shortcuts (LayoutsAvgPoolFold below); qkv_concat keeps the element
// count (the projections become views).
TEST(LayoutsReport, RtdetrTinyExactCounts) {
  const auto model =
      models::load_model(test::model_fixture("rtdetr_tiny"), with_mode(LayoutMode::on));
  const auto& r = model->layouts();
  ASSERT_EQ(r.size(), 4u) << models::layouts::describe(r);
  EXPECT_EQ(r[0].layout, "repvgg");
  EXPECT_EQ(r[0].modules, 12);
  EXPECT_EQ(r[0].params_before, 32256);
  EXPECT_EQ(r[0].params_after, 27840);
  EXPECT_EQ(r[0].classes, std::vector<std::string>{"RTDetrRepVggBlock"});
  EXPECT_EQ(r[0].source, "kernels.layouts: on");
  EXPECT_EQ(r[1].layout, "batchnorm_fold");
  EXPECT_EQ(r[1].modules, 44);
  EXPECT_EQ(r[1].params_before, 67640);
  EXPECT_EQ(r[1].params_after, 64424);
  EXPECT_EQ(r[1].classes, (std::vector<std::string>{"RTDetrConvNormLayer", "RTDetrResNetConvLayer",
                                                    "RTDetrResNetShortCut", "Sequential"}));
  EXPECT_EQ(r[2].layout, "avgpool_fold");
  EXPECT_EQ(r[2].modules, 3);
  EXPECT_EQ(r[3].layout, "qkv_concat");
  EXPECT_EQ(r[3].modules, 3);
  EXPECT_EQ(r[3].params_before, r[3].params_after);
  // The default for rt_detr on the CPU is the same set but avgpool_fold (its 2x2 convolution's 4x
  // FLOPs cost more at the CPU's FMA rate than the pooling pass it removes; on by default for
  // CUDA models with tensor cores), with its own source.
  const auto by_default = models::load_model(test::model_fixture("rtdetr_tiny"));
  ASSERT_EQ(by_default->layouts().size(), 3u) << models::layouts::describe(by_default->layouts());
  EXPECT_EQ(by_default->layouts()[1].source, "default (rt_detr)");
  EXPECT_EQ(by_default->layouts()[1].modules, 44);
  EXPECT_EQ(by_default->layouts()[2].layout, "qkv_concat");
}

TEST(LayoutsReport, KernelConfigPathPatternOffAndHub) {
  c10::InferenceMode inference_mode;
  const std::string dir = test::model_fixture("rtdetr_tiny");
  // Only the RepVGG blocks of fpn_blocks.0, by path; everything else explicitly off.
  LoadOptions o = with_mode(LayoutMode::off);
  o.layouts.mode.value = LayoutMode::family_default;
  o.layouts.kernel_config.push_back(
      {"[[RTDetrRepVggBlock, model.encoder.fpn_blocks.0.bottlenecks.*]]",
       {{"RTDetrRepVggBlock", "model.encoder.fpn_blocks.0.bottlenecks.*"}},
       "repvgg",
       "",
       "",
       false,
       "s.yaml:1:1"});
  for (const auto& cls : {"RTDetrRepVggBlock", "RTDetrConvNormLayer", "RTDetrResNetConvLayer",
                          "RTDetrResNetShortCut", "Sequential", "RTDetrSelfAttention", "AvgPool2d"})
    o.layouts.kernel_config.push_back({cls, {{cls, ""}}, "off"});
  const auto model = models::load_model(dir, o);
  ASSERT_EQ(model->layouts().size(), 1u) << models::layouts::describe(model->layouts());
  const auto& r = model->layouts()[0];
  EXPECT_EQ(r.layout, "repvgg");
  EXPECT_EQ(r.modules, 3);
  EXPECT_EQ(r.source,
            "kernel_config: [[RTDetrRepVggBlock, model.encoder.fpn_blocks.0.bottlenecks.*]] "
            "(s.yaml:1:1)");
  const auto [pixels, mask] = inputs(dir);
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  EXPECT_LE(test::max_abs_diff(model->forward(pixels).logits, file->view("logits")), 1e-4);

  // kernels.layouts: off wins over kernel_config.
  LoadOptions off = with_mode(LayoutMode::off);
  off.layouts.kernel_config.push_back({"RTDetrRepVggBlock", {{"RTDetrRepVggBlock", ""}}, "repvgg"});
  EXPECT_TRUE(models::load_model(dir, off)->layouts().empty());

  // A hub layout is refused at load, naming the entry.
  LoadOptions hub = with_mode(LayoutMode::family_default);
  hub.layouts.kernel_config.push_back({"RTDetrSelfAttention",
                                       {{"RTDetrSelfAttention", ""}},
                                       "acme/attn:Fused",
                                       "",
                                       "v1",
                                       true,
                                       "m/serving.yaml:3:3"});
  try {
    models::load_model(dir, hub);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "kernel_config: RTDetrSelfAttention (m/serving.yaml:3:3): 'acme/attn:Fused' "
                 "cannot be loaded: the pinned hub provider (kernels.lock) supplies kernel slot "
                 "ops, not layouts (use a built-in layout name or off)");
  }
}

/// The loaded module at dotted `path` of `model`'s tree, as T (null when absent or not a T).
template <class T>
std::shared_ptr<T> module_at(models::Model& model, const std::string& path) {
  for (const auto& item : model.root().named_modules("", /*include_self=*/false))
    if (item.key() == path) return std::dynamic_pointer_cast<T>(item.value());
  return nullptr;
}

LoadOptions on_except(const std::vector<std::string>& classes_off) {
  LoadOptions o = with_mode(LayoutMode::on);
  for (const auto& cls : classes_off) o.layouts.kernel_config.push_back({cls, {{cls, ""}}, "off"});
  return o;
}

// avgpool_fold on rtdetr_tiny (bottleneck ResNet-vd, hidden_sizes 16/32/48/64, embedding 16):
// the three stride-2 stages' first layers have AvgPool2d(2, 2, ceil_mode) + 1x1 conv-BN
// shortcuts (32x16, 48x32, 64x48 weights = 5120 elements). The fold adds a 2x2 kernel per
// shortcut (4 x 5120) with its bias (32 + 48 + 64): +20624 elements. With even sides the layer
// runs the 2x2 stride-2 convolution (within float rounding of the pool path: the sum order
// differs); with an odd side it runs the pool path, bit for bit the model without the fold.
TEST(LayoutsAvgPoolFold, EvenSidesFoldOddSidesKeepThePool) {
  c10::InferenceMode inference_mode;
  using models::rtdetr::ResNetLayerImpl;
  const std::string dir = test::model_fixture("rtdetr_tiny");
  const auto on = models::load_model(dir, with_mode(LayoutMode::on));
  const auto off = models::load_model(dir, on_except({"AvgPool2d"}));
  const models::LayoutReport* fold = nullptr;
  for (const auto& r : on->layouts())
    if (r.layout == "avgpool_fold") fold = &r;
  ASSERT_NE(fold, nullptr) << models::layouts::describe(on->layouts());
  EXPECT_EQ(fold->modules, 3);
  EXPECT_EQ(fold->classes, std::vector<std::string>{"AvgPool2d"});
  EXPECT_EQ(fold->source, "kernels.layouts: on");
  EXPECT_EQ(fold->params_after - fold->params_before, 20624);
  for (const auto& r : off->layouts()) EXPECT_NE(r.layout, "avgpool_fold");

  const int64_t in_channels[] = {16, 32, 48}, out_channels[] = {32, 48, 64};
  for (int s = 1; s <= 3; ++s) {
    const std::string path =
        "model.backbone.model.encoder.stages." + std::to_string(s) + ".layers.0";
    const auto layer_on = module_at<ResNetLayerImpl>(*on, path);
    const auto layer_off = module_at<ResNetLayerImpl>(*off, path);
    ASSERT_TRUE(layer_on && layer_off) << path;
    const auto sc = layer_on->pooled_shortcut();
    ASSERT_TRUE(sc && sc->pooled) << path;
    ASSERT_FALSE(layer_off->pooled_shortcut()->pooled) << path;
    const int64_t ci = in_channels[s - 1], co = out_channels[s - 1];
    ASSERT_EQ(sc->pooled->weight.sizes(), (std::vector<int64_t>{co, ci, 2, 2}));
    // Every tap is the folded 1x1 weight / 4, exactly (a power of two), and the bias is the
    // folded bias.
    const auto w1 = sc->conv->weight;  // (co, ci, 1, 1), folded by batchnorm_fold
    EXPECT_TRUE(at::equal(sc->pooled->weight * 4, w1.expand({co, ci, 2, 2}))) << path;
    EXPECT_TRUE(at::equal(sc->pooled->bias, sc->conv->bias)) << path;

    at::manual_seed(s);
    const auto even = at::randn({2, ci, 16, 12});
    const double d_even = test::max_abs_diff(layer_on->forward(even), layer_off->forward(even));
    std::cout << "[layouts] avgpool_fold " << path << " even 16x12: max |diff| " << d_even << "\n";
    EXPECT_LE(d_even, 1e-5) << path;
    const auto pooled = at::avg_pool2d(even, {2, 2}, {2, 2}, {0, 0}, true, true);
    EXPECT_LE(test::max_abs_diff(sc->forward_pooled(even), sc->forward(pooled)), 1e-5) << path;
    for (const auto& hw : {std::pair<int64_t, int64_t>{15, 13}, {16, 11}, {9, 12}}) {
      const auto odd = at::randn({2, ci, hw.first, hw.second});
      const auto y = layer_on->forward(odd);
      EXPECT_EQ(y.size(2), (hw.first + 1) / 2) << path;  // ceil_mode
      EXPECT_EQ(y.size(3), (hw.second + 1) / 2) << path;
      EXPECT_TRUE(at::equal(y, layer_off->forward(odd)))
          << path << " " << hw.first << "x" << hw.second;
      try {
        sc->forward_pooled(odd);
        ADD_FAILURE() << "forward_pooled accepted " << hw.first << "x" << hw.second;
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("ConvNorm::forward_pooled: input must be (B, C, H, "
                                             "W) with even H and W, got [2, " +
                                             std::to_string(ci) + ", " + std::to_string(hw.first) +
                                             ", " + std::to_string(hw.second) + "]"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  // The whole backbone (the model refuses sides that are not multiples of 32): 72x88 -> stem
  // 36x44 -> max-pool 18x22 = stage 1's input (fold) -> stage 2's 9x11 and stage 3's 5x6 (pool
  // path); 64x64: every pooled shortcut folds; 70x50 -> 18x13: none does.
  const auto backbone_on = module_at<models::rtdetr::ResNetBackboneImpl>(*on, "model.backbone");
  const auto backbone_off = module_at<models::rtdetr::ResNetBackboneImpl>(*off, "model.backbone");
  ASSERT_TRUE(backbone_on && backbone_off);
  for (const auto& hw : {std::pair<int64_t, int64_t>{72, 88}, {64, 64}, {70, 50}}) {
    const auto pixels = at::rand({1, 3, hw.first, hw.second});
    const auto a = backbone_on->forward(pixels), b = backbone_off->forward(pixels);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].sizes(), b[i].sizes());
      EXPECT_LE(test::max_abs_diff(a[i], b[i]), 1e-5) << hw.first << "x" << hw.second << " " << i;
    }
  }
}

// batchnorm_fold on the encoder_input_proj / decoder_input_proj nn.Sequential(Conv2d,
// BatchNorm2d) pairs: rtdetr_tiny has 3 + 4 (num_feature_levels 4: one extra 3x3 stride-2
// level), rtdetr_tiny_basic 3 + 3, dfine_tiny 3 (its decoder_input_proj is the identity:
// d_model == decoder_in_channels[-1]). Only those folded, the model stays within tolerance of
// transformers.
TEST(LayoutsInputProjFold, SequentialConvBatchNormPairsFold) {
  c10::InferenceMode inference_mode;
  std::vector<std::string> all_but_sequential;
  for (const auto& info : models::layouts::layout_catalog())
    for (const auto& cls : info.replaces)
      if (cls != "Sequential") all_but_sequential.push_back(cls);
  for (const auto& [name, count] : std::vector<std::pair<std::string, int64_t>>{
           {"rtdetr_tiny", 7}, {"rtdetr_tiny_basic", 6}, {"dfine_tiny", 3}}) {
    const std::string dir = test::model_fixture(name);
    const auto model = models::load_model(dir, on_except(all_but_sequential));
    ASSERT_EQ(model->layouts().size(), 1u) << name << models::layouts::describe(model->layouts());
    const auto& r = model->layouts()[0];
    EXPECT_EQ(r.layout, "batchnorm_fold") << name;
    EXPECT_EQ(r.modules, count) << name;
    EXPECT_EQ(r.classes, std::vector<std::string>{"Sequential"}) << name;
    const auto proj = module_at<models::layers::ConvNormImpl>(*model, "model.encoder_input_proj.0");
    ASSERT_TRUE(proj) << name;
    EXPECT_TRUE(proj->folded) << name;
    EXPECT_FALSE(proj->norm) << name;
    const auto [pixels, mask] = inputs(dir);
    const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
    const auto out = model->forward(pixels, mask);
    EXPECT_LE(test::max_abs_diff(out.logits, file->view("logits")), 1e-4) << name;
    EXPECT_LE(test::max_abs_diff(out.pred_boxes, file->view("pred_boxes")), 1e-5) << name;
  }
}

// What each layout did to the DEIMv2, LW-DETR and RF-DETR fixtures, the classes counted on
// transformers 5.17's module tree of each fixture's config.json: deimv2_tiny has 8
// Deimv2RepVggBlocks (in the RepNCSPELAN5 blocks' CSP layers), 49 Deimv2ConvNormLayers of which
// the RepVGG blocks' 16 go with repvgg (33 left), 38 HGNetV2ConvLayers, 1 AIFI + 2 decoder
// Deimv2SelfAttentions; the lite encoder 34 Deimv2ConvNormLayers (18 left) and 3 decoder layers;
// the DINOv3 variant 53 Deimv2ConvNormLayers (37 left; no HGNetV2) and 3 DINOv3ViTAttentions
// (key_bias false). lw_detr_tiny: 20 LwDetrConvNormLayers (BatchNorm2d), 4 LwDetrViTAttentions
// (k_proj without bias) and 2 LwDetrAttentions. RF-DETR's 6 RfDetrConvNormLayers normalise with
// LayerNorm (not folded); 4 RfDetrDinov2SelfAttentions and 2 RfDetrAttentions, whose projections
// the fixtures (original RF-DETR checkpoints) store packed: concatenated at load already
// (layers::bind_packed_projections), so the layout takes the 4 backbone ones. The defaults (CPU:
// channels_last needs CUDA) are the same set.
struct ExpectedLayout {
  std::string layout;
  int64_t modules;
  std::vector<std::string> classes;
};

const std::vector<std::pair<std::string, std::vector<ExpectedLayout>>> kNewFamilyCounts{
    {"deimv2_tiny",
     {{"repvgg", 8, {"Deimv2RepVggBlock"}},
      {"batchnorm_fold", 71, {"Deimv2ConvNormLayer", "HGNetV2ConvLayer"}},
      {"qkv_concat", 3, {"Deimv2SelfAttention"}}}},
    {"deimv2_tiny_lite",
     {{"repvgg", 8, {"Deimv2RepVggBlock"}},
      {"batchnorm_fold", 56, {"Deimv2ConvNormLayer", "HGNetV2ConvLayer"}},
      {"qkv_concat", 3, {"Deimv2SelfAttention"}}}},
    {"deimv2_tiny_dinov3",
     {{"repvgg", 8, {"Deimv2RepVggBlock"}},
      {"batchnorm_fold", 37, {"Deimv2ConvNormLayer"}},
      {"qkv_concat", 6, {"DINOv3ViTAttention", "Deimv2SelfAttention"}}}},
    {"lw_detr_tiny",
     {{"batchnorm_fold", 20, {"LwDetrConvNormLayer"}},
      {"qkv_concat", 6, {"LwDetrAttention", "LwDetrViTAttention"}}}},
    {"rf_detr_tiny", {{"qkv_concat", 4, {"RfDetrDinov2SelfAttention"}}}},
    {"rf_detr_seg_tiny", {{"qkv_concat", 4, {"RfDetrDinov2SelfAttention"}}}},
    {"yolos_tiny", {{"qkv_concat", 2, {"YolosAttention"}}}},
    {"yolos_tiny_mid", {{"qkv_concat", 2, {"YolosAttention"}}}},
};

TEST(LayoutsReport, Deimv2LwDetrRfDetrExactCounts) {
  for (const auto& [name, expected] : kNewFamilyCounts) {
    SCOPED_TRACE(name);
    const std::string dir = test::model_fixture(name);
    const auto on = models::load_model(dir, with_mode(LayoutMode::on));
    const auto by_default = models::load_model(dir);
    for (const auto* model : {on.get(), by_default.get()}) {
      const auto& r = model->layouts();
      const std::string source =
          model == on.get() ? "kernels.layouts: on" : "default (" + model->model_type() + ")";
      ASSERT_EQ(r.size(), expected.size()) << source << "\n" << models::layouts::describe(r);
      for (size_t i = 0; i < r.size(); ++i) {
        EXPECT_EQ(r[i].layout, expected[i].layout) << source;
        EXPECT_EQ(r[i].modules, expected[i].modules) << source << " " << r[i].layout;
        EXPECT_EQ(r[i].classes, expected[i].classes) << source << " " << r[i].layout;
        EXPECT_EQ(r[i].source, source);
        if (r[i].layout == "qkv_concat")
          EXPECT_EQ(r[i].params_before, r[i].params_after);  // views into one weight
        else
          EXPECT_LT(r[i].params_after, r[i].params_before) << r[i].layout;  // norms removed
      }
    }
    // Every attention module is concatenated; a projection without a bias (LwDetrViTAttention's
    // and DINOv3ViTAttention's k_proj) keeps none and has zero rows in in_proj_bias, the others'
    // biases are views of it.
    int64_t attention = 0, unbiased = 0;
    for (const auto& item : on->root().named_modules("", /*include_self=*/false)) {
      const auto a = std::dynamic_pointer_cast<models::layers::AttentionImpl>(item.value());
      if (!a) continue;
      ++attention;
      ASSERT_EQ(a->concat_projections, 3) << item.key();
      const int64_t D = a->q_proj->weight.size(0);
      const models::layers::Linear projections[] = {a->q_proj, a->k_proj, a->v_proj};
      for (int64_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(at::equal(projections[i]->weight, a->in_proj_weight.narrow(0, i * D, D)));
        if (!a->in_proj_bias.defined()) continue;
        const auto rows = a->in_proj_bias.narrow(0, i * D, D);
        if (projections[i]->bias.defined()) {
          EXPECT_EQ(projections[i]->bias.data_ptr(), rows.data_ptr()) << item.key() << " " << i;
        } else {
          ++unbiased;
          EXPECT_TRUE(at::equal(rows, at::zeros_like(rows))) << item.key() << " " << i;
        }
      }
    }
    const auto qkv = std::find_if(expected.begin(), expected.end(),
                                  [](const auto& e) { return e.layout == "qkv_concat"; });
    ASSERT_NE(qkv, expected.end());
    EXPECT_EQ(attention, qkv->modules + (name.rfind("rf_detr", 0) == 0 ? 2 : 0));
    EXPECT_EQ(unbiased, name == "lw_detr_tiny" ? 4 : name == "deimv2_tiny_dinov3" ? 3 : 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LayoutsParity, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace libreyolo
