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
  // One weight: its FP8 copy and the handle, or counted as kept when FP8 GEMMs cannot take it.
  auto quantize = [&](const at::Tensor& weight, kernels::Fp8Weight& fp8,
                      kernels::Fp8GemmHandle& kernel) {
    if (!multiple_of_16(weight)) {
      ++report.kept_shape;
      return;
    }
    fp8 = kernels::quantize_fp8_weight(weight);
    kernel = handle;
    report.parameters += weight.numel();
    ++report.layers;
  };
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (!fp8_target(item.key())) continue;
    if (auto* linear = dynamic_cast<layers::LinearImpl*>(item.value().get())) {
      quantize(linear->weight, linear->fp8, linear->fp8_kernel);
    } else if (auto* attention = dynamic_cast<layers::AttentionImpl*>(item.value().get())) {
      if (attention->concat_projections > 0 && attention->in_proj_weight.defined())
        quantize(attention->in_proj_weight, attention->in_proj_fp8, attention->in_proj_fp8_kernel);
    }
  }
  return report;
}

}  // namespace libreyolo::models::quantization
