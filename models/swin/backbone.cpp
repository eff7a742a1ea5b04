#include "models/swin/backbone.h"

#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace libreyolo::models::swin {

BackboneConfig parse_backbone_config(const core::ConfigView& v) {
  BackboneConfig b;
  b.swin = parse_config(v, /*backbone=*/true);
  const auto stages = static_cast<int64_t>(b.swin.depths.size());
  b.out_indices = v.get_int_list("out_indices", {stages});
  int64_t previous = 0;
  for (const auto i : b.out_indices) {
    if (i < 1 || i > stages || i <= previous)
      v.fail("out_indices", c10::str("must be increasing stage numbers in [1, ", stages,
                                     "] (the stem is not supported), got ", i));
    previous = i;
  }
  if (v.has("out_features")) {
    const auto& f = v.raw("out_features");
    bool same = f.is_array() && f.size() == b.out_indices.size();
    for (size_t k = 0; same && k < f.size(); ++k)
      same = f[k].is_string() && f[k] == "stage" + std::to_string(b.out_indices[k]);
    if (!same) v.fail("out_features", "must name the stages of out_indices");
  }
  return b;
}

BackboneImpl::BackboneImpl(const BackboneConfig& c) : config(c) {
  encoder = std::make_shared<EncoderImpl>(c.swin);
  for (const auto i : c.out_indices)
    norms.push_back(
        std::make_shared<layers::LayerNormImpl>(c.swin.embed_dim << (i - 1), c.norm_eps));
  if (c.swin.timm) {  // TimmBackbone._backbone
    register_module("_backbone", encoder);
    return;
  }
  // The embeddings and stages sit at this module's root on disk (the Hub's legacy names).
  for (const auto& child : encoder->named_children()) register_module(child.key(), child.value());
  auto norms_parent = register_module("hidden_states_norms", std::make_shared<torch::nn::Module>());
  for (size_t k = 0; k < norms.size(); ++k)
    norms_parent->register_module("stage" + std::to_string(c.out_indices[k]), norms[k]);
}

std::vector<int64_t> BackboneImpl::channels() const {
  std::vector<int64_t> out;
  for (const auto i : config.out_indices) out.push_back(config.swin.embed_dim << (i - 1));
  return out;
}

std::vector<at::Tensor> BackboneImpl::forward(const at::Tensor& pixel_values) const {
  const int64_t h = config.required_height, w = config.required_width;
  if (h > 0 && (pixel_values.size(2) != h || pixel_values.size(3) != w))
    throw std::invalid_argument(c10::str("pixel_values: the timm Swin backbone takes ", h, "x", w,
                                         " images only (its img_size; ", "strict_img_size), got ",
                                         pixel_values.size(2), "x", pixel_values.size(3)));
  const auto stages = encoder->forward(pixel_values, config.always_partition);
  std::vector<at::Tensor> maps;
  for (size_t k = 0; k < config.out_indices.size(); ++k) {
    const auto& s = stages[static_cast<size_t>(config.out_indices[k] - 1)];
    const int64_t B = s.hidden.size(0), C = s.hidden.size(2);
    // SwinBackbone: reshaped (B, C, h, w) -> permute/view (B, h*w, C) -> norm -> (B, C, h, w);
    // timm + OmDetTurboVisionBackbone: (B, h, w, C) -> norm -> permute (B, C, h, w).
    maps.push_back(norms[k]
                       ->forward(s.hidden)
                       .view({B, s.height, s.width, C})
                       .permute({0, 3, 1, 2})
                       .contiguous());
  }
  return maps;
}

}  // namespace libreyolo::models::swin
