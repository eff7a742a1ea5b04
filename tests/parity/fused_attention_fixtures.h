// Helpers of the families' parity tests (Deformable DETR, ViT, Swin, fused-attention policy):
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
#include <vector>

#include "models/core/safetensors.h"
#include "models/model.h"

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

/// max |a - b| as a double (a and b converted to float32 on CPU).
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kCPU, at::kFloat) - b.to(at::kCPU, at::kFloat)).abs().max().item<double>();
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

}  // namespace libreyolo::test
