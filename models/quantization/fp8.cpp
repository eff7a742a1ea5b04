#include "models/quantization/fp8.h"

#include <torch/nn/module.h>

#include <sstream>
#include <vector>

#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models::quantization {
namespace {

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream in(path);
  for (std::string s; std::getline(in, s, '.');) out.push_back(s);
  return out;
}

bool multiple_of_16(const at::Tensor& weight) {
  return weight.size(0) % 16 == 0 && weight.size(1) % 16 == 0;
}

}  // namespace

bool fp8_target(const std::string& path) {
  bool in_block = false;
  for (const auto& s : segments(path)) {
    if (s == "layer" || s == "layers" || s == "blocks") in_block = true;
    for (const char* excluded : {"embed", "head", "predictor", "lqe", "classifier",
                                 "reference_point", "sampling_offsets", "attention_weights"})
      if (s.find(excluded) != std::string::npos) return false;
  }
  return in_block;
}

Fp8Report quantize_fp8(torch::nn::Module& root, const kernels::Fp8GemmHandle& handle) {
  Fp8Report report;
  if (handle.empty()) return report;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (!fp8_target(item.key())) continue;
    if (auto* linear = dynamic_cast<layers::LinearImpl*>(item.value().get())) {
      if (!multiple_of_16(linear->weight)) {
        ++report.kept_shape;
        continue;
      }
      linear->fp8 = kernels::quantize_fp8_weight(linear->weight);
      linear->fp8_kernel = handle;
      report.parameters += linear->weight.numel();
      ++report.layers;
    } else if (auto* attention = dynamic_cast<layers::AttentionImpl*>(item.value().get())) {
      if (attention->concat_projections == 0 || !attention->in_proj_weight.defined()) continue;
      if (!multiple_of_16(attention->in_proj_weight)) {
        ++report.kept_shape;
        continue;
      }
      attention->in_proj_fp8 = kernels::quantize_fp8_weight(attention->in_proj_weight);
      attention->in_proj_fp8_kernel = handle;
      report.parameters += attention->in_proj_weight.numel();
      ++report.layers;
    }
  }
  return report;
}

}  // namespace libreyolo::models::quantization
