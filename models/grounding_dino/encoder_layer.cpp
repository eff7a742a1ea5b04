#include "models/grounding_dino/encoder_layer.h"

#include <memory>

#include "models/grounding_dino/decoder_layer.h"

namespace libreyolo::models::grounding_dino {
TextEnhancerLayerImpl::TextEnhancerLayerImpl(const Config& c) : act(c.act) {
  const int64_t d = c.d_model;
  self_attn = register_module("self_attn", multihead_attention(d, c.encoder_heads / 2));
  fc1 = register_module("fc1", std::make_shared<layers::LinearImpl>(d, c.encoder_ffn / 2));
  fc2 = register_module("fc2", std::make_shared<layers::LinearImpl>(c.encoder_ffn / 2, d));
  layer_norm_before = register_module("layer_norm_before",
                                      std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  layer_norm_after = register_module("layer_norm_after",
                                     std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor TextEnhancerLayerImpl::forward(const at::Tensor& text, const at::Tensor& bias,
                                          const at::Tensor& pos) const {
  const auto qk = text + pos;
  const auto h = layer_norm_before->forward(text + self_attn->forward(qk, qk, text, bias));
  return layer_norm_after->forward(fc2->forward(fc1->forward_act(h, act)) + h);
}

DeformableLayerImpl::DeformableLayerImpl(const Config& c) : act(c.act) {
  const int64_t d = c.d_model;
  self_attn = register_module("self_attn",
                              std::make_shared<deformable_detr::MultiscaleDeformableAttentionImpl>(
                                  d, c.encoder_heads, c.num_levels, c.encoder_points));
  self_attn_layer_norm = register_module(
      "self_attn_layer_norm", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  fc1 = register_module("fc1", std::make_shared<layers::LinearImpl>(d, c.encoder_ffn));
  fc2 = register_module("fc2", std::make_shared<layers::LinearImpl>(c.encoder_ffn, d));
  final_layer_norm = register_module("final_layer_norm",
                                     std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor DeformableLayerImpl::forward(const at::Tensor& x, const at::Tensor& pos,
                                        const at::Tensor& valid, const at::Tensor& ref,
                                        const kernels::SpatialShapes& shapes) const {
  auto h = self_attn_layer_norm->forward(x + self_attn->forward(x, pos, x, valid, ref, shapes));
  h = h + fc2->forward(fc1->forward_act(h, act));
  return final_layer_norm->forward(h);
}

EncoderLayerImpl::EncoderLayerImpl(const Config& c) {
  text_enhancer_layer =
      register_module("text_enhancer_layer", std::make_shared<TextEnhancerLayerImpl>(c));
  fusion_layer = register_module("fusion_layer", std::make_shared<FusionLayerImpl>(c));
  deformable_layer = register_module("deformable_layer", std::make_shared<DeformableLayerImpl>(c));
}

std::pair<at::Tensor, at::Tensor> EncoderLayerImpl::forward(const at::Tensor& vision,
                                                            const at::Tensor& text,
                                                            const EncoderInputs& in) const {
  auto [v, t] = fusion_layer->forward(vision, text, in.vision_padding, in.text_padding);
  t = text_enhancer_layer->forward(t, in.text_bias, in.text_pos);
  v = deformable_layer->forward(v, in.vision_pos, in.vision_valid, in.reference_points, in.shapes);
  return {v, t};
}

}  // namespace libreyolo::models::grounding_dino
