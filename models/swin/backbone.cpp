#include "models/swin/backbone.h"

#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>
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
  // The embeddings and stages sit at this module's root on disk (the Hub's legacy names).
  encoder = std::make_shared<EncoderImpl>(c.swin);
  for (const auto& child : encoder->named_children()) register_module(child.key(), child.value());
  auto norms_parent = register_module("hidden_states_norms", std::make_shared<torch::nn::Module>());
  for (const auto i : c.out_indices)
    norms.push_back(norms_parent->register_module(
        "stage" + std::to_string(i),
        std::make_shared<layers::LayerNormImpl>(c.swin.embed_dim << (i - 1), 1e-5)));
}

std::vector<int64_t> BackboneImpl::channels() const {
  std::vector<int64_t> out;
  for (const auto i : config.out_indices) out.push_back(config.swin.embed_dim << (i - 1));
  return out;
}

std::vector<at::Tensor> BackboneImpl::forward(const at::Tensor& pixel_values) const {
  const auto stages = encoder->forward(pixel_values, /*always_partition=*/true);
  std::vector<at::Tensor> maps;
  for (size_t k = 0; k < config.out_indices.size(); ++k) {
    const auto& s = stages[static_cast<size_t>(config.out_indices[k] - 1)];
    const int64_t B = s.hidden.size(0), C = s.hidden.size(2);
    // upstream: reshaped (B, C, h, w) -> permute/view (B, h*w, C) -> norm -> (B, C, h, w).
    maps.push_back(norms[k]
                       ->forward(s.hidden)
                       .view({B, s.height, s.width, C})
                       .permute({0, 3, 1, 2})
                       .contiguous());
  }
  return maps;
}

}  // namespace libreyolo::models::swin
