// Helpers of the families' parity tests (Deformable DETR, ViT, Swin, fused-attention policy):
// fixture paths, the stored expected tensors, and the model input recovered exactly from the
// stored uint8 pixels (tests/fixtures/README.md: rescale + normalize).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "models/core/safetensors.h"

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

}  // namespace libreyolo::test
