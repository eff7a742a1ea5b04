// Helpers of the families' parity tests (Deformable DETR, ViT, DeiT, Swin, fused-attention policy):
// fixture paths, the stored expected tensors, and the model input recovered exactly from the
// stored uint8 pixels (tests/fixtures/README.md: rescale + normalize).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "models/core/safetensors.h"
#include "models/image/postprocess.h"
#include "models/model.h"
#include "tests/support/tensor_diff.h"

namespace libreyolo::test {

/// Absolute path of tests/fixtures/models/<name>.
inline std::string model_fixture(const std::string& name) {
  return std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + name;
}

/// A stored tensor of <dir>/expected.safetensors (copied, CPU, stored dtype).
inline at::Tensor expected_tensor(const std::string& dir, const std::string& key) {
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  return file->view(key).clone();
}

/// A stored mask of <dir>/expected.safetensors (`pixel_mask` unless named; stored uint8, as
/// the fixtures keep masks to stay small) as the processors return it: int64.
inline at::Tensor expected_mask(const std::string& dir, const std::string& key = "pixel_mask") {
  return expected_tensor(dir, key).to(at::kLong);
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

/// pixel_values = (float32(u8) - float32(mean) * 255f) / (float32(std) * 255f), then 0 where
/// pixel_mask is 0 (when the fixture stores one): bit-exact with the transformers processor.
inline at::Tensor normalized_pixels(const std::string& dir) {
  const auto pre = read_json(dir + "/preprocessor_config.json");
  std::vector<float> mean, std;
  for (const auto& v : pre.at("image_mean")) mean.push_back(v.get<float>());
  for (const auto& v : pre.at("image_std")) std.push_back(v.get<float>());
  const auto u8 = expected_tensor(dir, "pixel_u8");
  const auto m = at::tensor(mean).view({1, -1, 1, 1}) * 255.0f;
  const auto s = at::tensor(std).view({1, -1, 1, 1}) * 255.0f;
  auto pixels = (u8.to(at::kFloat) - m) / s;
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  if (file->contains("pixel_mask")) {
    const auto mask = file->view("pixel_mask").clone();
    pixels = pixels.masked_fill(mask.unsqueeze(1) == 0, 0.0f);
  }
  return pixels;
}

/// Runs `model` on `pixels` with the manual and the SDPA attention path and expects float32
/// logits within 1e-4 of both transformers references (`sdpa_ref`: its default SDPA path,
/// `eager_ref`: attn_implementation="eager"); prints the measured maxima under `label`.
inline void expect_logits_match_both_paths(models::Model& model, const at::Tensor& pixels,
                                           const at::Tensor& sdpa_ref, const at::Tensor& eager_ref,
                                           const std::string& label) {
  for (bool fused : {false, true}) {
    model.set_fused_attention(fused);
    const auto out = model.forward(pixels);
    ASSERT_EQ(out.logits.sizes(), sdpa_ref.sizes()) << label;
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat) << label;
    const double d_sdpa = max_abs_diff(out.logits, sdpa_ref);
    const double d_eager = max_abs_diff(out.logits, eager_ref);
    std::cout << "[" << label << "] " << (fused ? "sdpa  " : "manual")
              << " path: max|logits - logits| = " << d_sdpa
              << ", max|logits - logits_eager| = " << d_eager << "\n";
    EXPECT_LE(d_sdpa, 1e-4) << label;
    EXPECT_LE(d_eager, 1e-4) << label;
  }
}

/// A detector's `out` against the reference logits (within 1e-4) and pred_boxes (within 1e-5);
/// prints the maxima under `label`.
inline void expect_logits_and_boxes_match(const models::ModelOutput& out,
                                          const at::Tensor& logits_ref, const at::Tensor& boxes_ref,
                                          const std::string& label) {
  ASSERT_EQ(out.logits.sizes(), logits_ref.sizes()) << label;
  ASSERT_EQ(out.pred_boxes.sizes(), boxes_ref.sizes()) << label;
  const double dl = max_abs_diff(out.logits, logits_ref);
  const double db = max_abs_diff(out.pred_boxes, boxes_ref);
  std::cout << "[" << label << "] max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
            << "\n";
  EXPECT_LE(dl, 1e-4) << label;
  EXPECT_LE(db, 1e-5) << label;
}

/// <fixture>/extra_expected.safetensors (tests/fixtures/models/swin_tiny/make_extra_expected.py):
/// its pixel_values, of `sizes`, through the fixture's model with both attention paths against
/// its logits (SDPA) and logits_eager.
inline void expect_extra_expected_match(const std::string& fixture, at::IntArrayRef sizes,
                                        const std::string& label) {
  c10::InferenceMode inference_mode;
  const auto dir = model_fixture(fixture);
  auto model = models::load_model(dir);
  const auto file = models::core::SafetensorsFile::open(dir + "/extra_expected.safetensors");
  const auto x = file->view("pixel_values").clone();
  ASSERT_EQ(x.sizes(), sizes);
  expect_logits_match_both_paths(*model, x, file->view("logits"), file->view("logits_eager"),
                                 label);
}

/// On the fixture's model, set_fused_attention(default) changes no module; the other value
/// changes `modules` attention modules, and nothing the second time.
inline void expect_fused_attention_toggles(const std::string& fixture, bool fused_default,
                                           int modules) {
  auto model = models::load_model(model_fixture(fixture));
  EXPECT_EQ(model->set_fused_attention(fused_default), 0);
  EXPECT_EQ(model->set_fused_attention(!fused_default), modules);
  EXPECT_EQ(model->set_fused_attention(!fused_default), 0);
}

/// The fixture's classifier refuses a 1-channel input, a 3-d input and one smaller than a patch
/// (std::invalid_argument). Returns the model for further checks.
inline std::unique_ptr<models::Model> expect_classifier_rejects_bad_input(
    const std::string& fixture) {
  auto model = models::load_model(model_fixture(fixture));
  EXPECT_THROW(model->forward(at::zeros({1, 1, 224, 224})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({3, 224, 224})), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 3, 8, 8})), std::invalid_argument);  // < one patch
  return model;
}

/// LoadOptions dtype float16 / bfloat16 on CPU: float32 logits within `tolerance` of the float32
/// model's, and float32 input converted to the model's dtype (models::check_pixel_values).
inline void expect_half_precision_close(const std::string& fixture, double tolerance) {
  c10::InferenceMode inference_mode;
  const auto dir = model_fixture(fixture);
  const auto pixels = normalized_pixels(dir);
  const auto ref = models::load_model(dir)->forward(pixels);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_model(dir, options);
    EXPECT_TRUE(at::equal(model->forward(pixels).logits, model->forward(pixels.to(dtype)).logits));
    const auto out = model->forward(pixels.to(dtype));
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    const double d = max_abs_diff(out.logits, ref.logits);
    std::cout << "[" << fixture << " " << dtype << "] max|logits - float32 logits| = " << d << "\n";
    EXPECT_LE(d, tolerance);
  }
}

/// post_process_object_detection of `out` (the fixture's two images at `sizes`) at thresholds 0.0
/// and 0.3 against <dir>/expected.safetensors' th<t>_img<i>_{scores, labels, boxes}: as many
/// detections (`per_image` each; -1: at least one), labels equal, scores within 1e-5, boxes
/// within 1e-2 px.
inline void expect_detections_match(const std::string& dir, const models::ModelOutput& out,
                                    const std::vector<std::pair<int64_t, int64_t>>& sizes,
                                    image::DetectionHead head, int64_t per_image = -1) {
  int checked = 0;
  for (const char* th : {"0.0", "0.3"}) {
    image::PostProcessOptions opt;
    opt.threshold = std::stod(th);
    const auto dets =
        image::post_process_object_detection(out.logits, out.pred_boxes, sizes, head, opt);
    ASSERT_EQ(dets.size(), 2u);
    for (size_t i = 0; i < dets.size(); ++i) {
      const std::string key = std::string("th") + th + "_img" + std::to_string(i);
      SCOPED_TRACE(key);
      const auto s = expected_tensor(dir, key + "_scores");
      ASSERT_EQ(dets[i].scores.numel(), s.numel());
      if (per_image < 0) {
        EXPECT_GT(s.numel(), 0);
      } else {
        EXPECT_EQ(s.numel(), per_image);
      }
      EXPECT_TRUE(at::equal(dets[i].labels, expected_tensor(dir, key + "_labels")));
      EXPECT_LE(max_abs_diff(dets[i].scores, s), 1e-5);
      EXPECT_LE(max_abs_diff(dets[i].boxes, expected_tensor(dir, key + "_boxes")), 1e-2);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
}

}  // namespace libreyolo::test
