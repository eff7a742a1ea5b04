#include "models/grounding_dino/fusion.h"

#include <cmath>
#include <limits>
#include <memory>

namespace libreyolo::models::grounding_dino {

BiAttentionImpl::BiAttentionImpl(const Config& c)
    : embed_dim(c.encoder_ffn / 2),
      num_heads(c.encoder_heads / 2),
      head_dim(embed_dim / num_heads),
      scale(std::pow(static_cast<double>(head_dim), -0.5)) {
  const int64_t d = c.d_model;
  auto linear = [&](const char* name, int64_t in, int64_t out) {
    return register_module(name, std::make_shared<layers::LinearImpl>(in, out));
  };
  vision_proj = linear("vision_proj", d, embed_dim);
  text_proj = linear("text_proj", d, embed_dim);
  values_vision_proj = linear("values_vision_proj", d, embed_dim);
  values_text_proj = linear("values_text_proj", d, embed_dim);
  out_vision_proj = linear("out_vision_proj", embed_dim, d);
  out_text_proj = linear("out_text_proj", embed_dim, d);
}

std::pair<at::Tensor, at::Tensor> BiAttentionImpl::forward(const at::Tensor& vision,
                                                           const at::Tensor& text,
                                                           const at::Tensor& vision_padding,
                                                           const at::Tensor& text_padding) const {
  const int64_t B = vision.size(0), Nv = vision.size(1), Nt = text.size(1);
  // (B, N, E) -> (B * heads, N, head_dim), heads' channels contiguous.
  auto heads = [&](const at::Tensor& x) {
    return x.view({B, -1, num_heads, head_dim})
        .transpose(1, 2)
        .contiguous()
        .view({B * num_heads, -1, head_dim});
  };
  const auto vq = heads(vision_proj->forward(vision) * scale);
  const auto tk = heads(text_proj->forward(text));
  const auto vv = heads(values_vision_proj->forward(vision));
  const auto tv = heads(values_text_proj->forward(text));
  auto w = at::bmm(vq, tk.transpose(1, 2));  // (B*h, Nv, Nt)
  w = at::clamp(w - w.max(), -50000, 50000);
  const auto wt = w.transpose(1, 2);
  auto tw = at::clamp(wt - std::get<0>(wt.max(-1, true)), -50000, 50000);
  const double inf = std::numeric_limits<double>::infinity();
  auto per_head = [&](const at::Tensor& padding) {
    return padding.view({B, 1, 1, -1}).expand({B, num_heads, 1, padding.size(1)}).flatten(0, 1);
  };
  if (vision_padding.defined()) tw = tw.masked_fill(per_head(vision_padding), -inf);
  tw = tw.softmax(-1);
  if (text_padding.defined()) w = w.masked_fill(per_head(text_padding), -inf);
  const auto vw = w.softmax(-1);
  auto merge = [&](const at::Tensor& x, int64_t n) {
    return x.view({B, num_heads, n, head_dim}).transpose(1, 2).reshape({B, n, embed_dim});
  };
  const auto vision_out = out_vision_proj->forward(merge(at::bmm(vw, tv), Nv));
  const auto text_out = out_text_proj->forward(merge(at::bmm(tw, vv), Nt));
  return {vision_out, text_out};
}

FusionLayerImpl::FusionLayerImpl(const Config& c) {
  layer_norm_vision = register_module(
      "layer_norm_vision", std::make_shared<layers::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  layer_norm_text = register_module(
      "layer_norm_text", std::make_shared<layers::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  attn = register_module("attn", std::make_shared<BiAttentionImpl>(c));
  vision_param = register_parameter("vision_param", at::empty({c.d_model}));
  text_param = register_parameter("text_param", at::empty({c.d_model}));
}

std::pair<at::Tensor, at::Tensor> FusionLayerImpl::forward(const at::Tensor& vision,
                                                           const at::Tensor& text,
                                                           const at::Tensor& vision_padding,
                                                           const at::Tensor& text_padding) const {
  const auto v = layer_norm_vision->forward(vision);
  const auto t = layer_norm_text->forward(text);
  const auto [dv, dt] = attn->forward(v, t, vision_padding, text_padding);
  return {v + vision_param * dv, t + text_param * dt};
}

}  // namespace libreyolo::models::grounding_dino
