// The layouts' parity gate on CUDA (float32, TF32 off): every model fixture with layouts off and
// on (channels_last included: its predicate holds on CUDA) against the transformers CPU
// references, on both attention paths. Prints the measured table ([layouts cuda] lines).
#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "models/image/processor.h"
#include "models/layouts/layouts.h"
#include "models/model.h"
#include "models/rtdetr/modules.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

class LayoutsCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutsCuda, OnStaysWithinToleranceOfTransformers) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  c10::InferenceMode inference_mode;
  const std::string name = GetParam();
  const std::string dir = test::model_fixture(name);
  const auto pre = test::read_json(dir + "/preprocessor_config.json");
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  at::Tensor pixels, mask;
  if (!file->contains("pixel_u8")) {
    // The RF-DETR fixtures: our RfDetrImageProcessor on their photographs (bit for bit
    // transformers': tests/parity/rf_detr_parity_test.cpp).
    std::vector<at::Tensor> images;
    const auto meta = test::read_json(dir + "/meta.json");
    for (const auto& image_name : meta.at("images"))
      images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                                image_name.get<std::string>()));
    const auto in =
        image::ImageProcessor(image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"))
            .preprocess(images);
    pixels = in.pixel_values;
    mask = in.pixel_mask;
  } else {
    pixels = pre.value("do_normalize", true)
                 ? test::normalized_pixels(dir)
                 : file->view("pixel_u8").to(at::kFloat) *
                       static_cast<float>(pre.at("rescale_factor").get<double>());
    mask = file->contains("pixel_mask") ? file->view("pixel_mask").clone().to(at::kLong)
                                        : at::Tensor();
  }
  pixels = pixels.to(at::kCUDA);
  if (mask.defined()) mask = mask.to(at::kCUDA);
  for (auto mode : {kernels::LayoutMode::off, kernels::LayoutMode::on}) {
    models::LoadOptions o;
    o.device = at::kCUDA;
    o.layouts.mode.value = mode;
    const auto model = models::load_model(dir, o);
    if (mode == kernels::LayoutMode::on)
      std::cout << "[layouts cuda] " << name << ":\n"
                << models::layouts::describe(model->layouts());
    for (bool fused : {false, true}) {
      model->set_fused_attention(fused);
      const auto out = model->forward(pixels, mask);
      const char* m = mode == kernels::LayoutMode::on ? "on " : "off";
      const char* path = fused ? "sdpa  " : "manual";
      if (model->task() == models::Task::object_detection ||
          model->task() == models::Task::instance_segmentation) {
        const double dl = test::max_abs_diff(out.logits, file->view("logits"));
        const double db = test::max_abs_diff(out.pred_boxes, file->view("pred_boxes"));
        std::cout << std::setprecision(3) << "[layouts cuda] " << std::left << std::setw(32) << name
                  << path << " layouts " << m << ": logits " << dl << ", boxes " << db << "\n";
        EXPECT_LE(dl, 1e-4) << name << " " << path << " " << m;
        EXPECT_LE(db, 1e-5) << name << " " << path << " " << m;
      } else {
        const double d =
            test::max_abs_diff(out.logits, file->view(fused ? "logits" : "logits_eager"));
        std::cout << std::setprecision(3) << "[layouts cuda] " << std::left << std::setw(32) << name
                  << path << " layouts " << m << ": logits " << d << "\n";
        EXPECT_LE(d, 1e-4) << name << " " << path << " " << m;
      }
    }
  }
}

// avgpool_fold on CUDA in both float32 (TF32 off) and bfloat16, channels_last on: the backbone
// of rtdetr_tiny with the fold against the same load without it (kernel_config AvgPool2d: off),
// at sides where every pooled shortcut folds (64x64), where some do (72x88: stage 1 folds,
// stages 2 and 3 see 9x11 and 5x6) and where none does (70x50). bf16: within 8 bf16 ulps of
// the largest output (1/32 of it: the sum order differs and the difference crosses the later
// stages' roundings; a wrong fold, e.g. taps not / 4, is off by multiples), float32 within 1e-5.
TEST(LayoutsCudaAvgPoolFold, BackboneEvenAndOddSides) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  c10::InferenceMode inference_mode;
  const std::string dir = test::model_fixture("rtdetr_tiny");
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    models::LoadOptions on;
    on.device = at::kCUDA;
    on.dtype = dtype;
    on.layouts.mode.value = kernels::LayoutMode::on;
    models::LoadOptions off = on;
    off.layouts.kernel_config.push_back({"AvgPool2d", {{"AvgPool2d", ""}}, "off"});
    const auto with_fold = models::load_model(dir, on);
    const auto without = models::load_model(dir, off);
    std::shared_ptr<models::rtdetr::ResNetBackboneImpl> a, b;
    for (const auto& item : with_fold->root().named_modules("", false))
      if (item.key() == "model.backbone")
        a = std::dynamic_pointer_cast<models::rtdetr::ResNetBackboneImpl>(item.value());
    for (const auto& item : without->root().named_modules("", false))
      if (item.key() == "model.backbone")
        b = std::dynamic_pointer_cast<models::rtdetr::ResNetBackboneImpl>(item.value());
    ASSERT_TRUE(a && b);
    for (const auto& hw : {std::pair<int64_t, int64_t>{64, 64}, {72, 88}, {70, 50}}) {
      const auto pixels = at::rand({2, 3, hw.first, hw.second}).to(at::kCUDA, dtype);
      const auto ya = a->forward(pixels), yb = b->forward(pixels);
      ASSERT_EQ(ya.size(), yb.size());
      for (size_t i = 0; i < ya.size(); ++i) {
        ASSERT_EQ(ya[i].sizes(), yb[i].sizes());
        const double d = test::max_abs_diff(ya[i].to(at::kFloat), yb[i].to(at::kFloat));
        const double scale = yb[i].abs().max().item<double>();
        const double tol = dtype == at::kFloat ? 1e-5 : scale / 32;
        std::cout << "[layouts cuda] avgpool_fold " << c10::toString(dtype) << " " << hw.first
                  << "x" << hw.second << " level " << i << ": max |diff| " << d << "\n";
        EXPECT_LE(d, tol) << hw.first << "x" << hw.second << " level " << i;
      }
    }
  }
}

// The family default's channels_last and avgpool_fold follow the dtype: on for bfloat16 and for
// float32 with TF32 (tensor-core convolutions, NHWC kernels), off for float32 without TF32
// (cuDNN's FMA kernels are NCHW, and the fold's 4x shortcut FLOPs cost more than the pooling:
// models/layouts/catalog.cpp `on_by_default`). The other default layouts apply in all three.
TEST(LayoutsCudaDefault, ChannelsLastAndAvgPoolFoldFollowDtypeAndTf32) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::model_fixture("rtdetr_tiny");
  const bool tf32_before = at::globalContext().allowTF32CuDNN();
  auto names = [](const models::Model& m) {
    std::string s;
    for (const auto& r : m.layouts()) s += (s.empty() ? "" : ",") + r.layout;
    return s;
  };
  struct Case {
    at::ScalarType dtype;
    bool tf32;
    const char* expected;
  };
  for (const Case& c :
       {Case{at::kFloat, false, "repvgg,batchnorm_fold,qkv_concat"},
        Case{at::kFloat, true, "repvgg,batchnorm_fold,avgpool_fold,qkv_concat,channels_last"},
        Case{at::kBFloat16, false,
             "repvgg,batchnorm_fold,avgpool_fold,qkv_concat,channels_last"}}) {
    at::globalContext().setAllowTF32CuDNN(c.tf32);
    models::LoadOptions o;
    o.device = at::kCUDA;
    o.dtype = c.dtype;
    const auto model = models::load_model(dir, o);
    EXPECT_EQ(names(*model), c.expected) << c10::toString(c.dtype) << " tf32 " << c.tf32;
  }
  at::globalContext().setAllowTF32CuDNN(tf32_before);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LayoutsCuda,
                         ::testing::Values("rtdetr_tiny", "rtdetr_tiny_basic", "rtdetr_v2_tiny",
                                           "rtdetr_v2_tiny_discrete", "dfine_tiny",
                                           "deformable_detr_tiny", "deformable_detr_tiny_refine",
                                           "deformable_detr_tiny_two_stage", "vit_tiny",
                                           "deit_tiny", "deit_tiny_distilled", "swin_tiny",
                                           "deimv2_tiny", "deimv2_tiny_lite", "deimv2_tiny_dinov3",
                                           "lw_detr_tiny", "rf_detr_tiny", "rf_detr_seg_tiny"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace libreyolo
