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

#include "models/layouts/layouts.h"
#include "models/model.h"
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
  at::Tensor pixels = pre.value("do_normalize", true)
                          ? test::normalized_pixels(dir)
                          : file->view("pixel_u8").to(at::kFloat) *
                                static_cast<float>(pre.at("rescale_factor").get<double>());
  at::Tensor mask = file->contains("pixel_mask") ? file->view("pixel_mask").clone() : at::Tensor();
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
      if (model->task() == models::Task::object_detection) {
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

INSTANTIATE_TEST_SUITE_P(Fixtures, LayoutsCuda,
                         ::testing::Values("rtdetr_tiny", "rtdetr_tiny_basic", "rtdetr_v2_tiny",
                                           "rtdetr_v2_tiny_discrete", "dfine_tiny",
                                           "deformable_detr_tiny", "deformable_detr_tiny_refine",
                                           "deformable_detr_tiny_two_stage", "vit_tiny",
                                           "swin_tiny"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace libreyolo
