#include "models/grounding_dino/decoder_layer.h"

#include <memory>

namespace libreyolo::models::grounding_dino {

layers::Attention multihead_attention(int64_t d, int64_t heads) {
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = heads;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  o.o_name = "out_proj";
  return std::make_shared<layers::AttentionImpl>(o);
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c) : act(c.act) {
  const int64_t d = c.d_model;
  auto norm = [&](const char* name) {
    return register_module(name, std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  };
  self_attn = register_module("self_attn", multihead_attention(d, c.decoder_heads));
  self_attn_layer_norm = norm("self_attn_layer_norm");
  encoder_attn_text = register_module("encoder_attn_text", multihead_attention(d, c.decoder_heads));
  encoder_attn_text_layer_norm = norm("encoder_attn_text_layer_norm");
  encoder_attn = register_module(
      "encoder_attn", std::make_shared<deformable_detr::MultiscaleDeformableAttentionImpl>(
                          d, c.decoder_heads, c.num_levels, c.decoder_points));
  encoder_attn_layer_norm = norm("encoder_attn_layer_norm");
  fc1 = register_module("fc1", std::make_shared<layers::LinearImpl>(d, c.decoder_ffn));
  fc2 = register_module("fc2", std::make_shared<layers::LinearImpl>(c.decoder_ffn, d));
  final_layer_norm = norm("final_layer_norm");
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& query_pos,
                                     const at::Tensor& ref, const at::Tensor& memory,
                                     const at::Tensor& memory_valid,
                                     const kernels::SpatialShapes& shapes, const at::Tensor& text,
                                     const at::Tensor& text_bias) const {
  const auto qk = x + query_pos;
  auto h = self_attn_layer_norm->forward(x + self_attn->forward(qk, qk, x));
  h = encoder_attn_text_layer_norm->forward(
      h + encoder_attn_text->forward(h + query_pos, text, text, text_bias));
  h = encoder_attn_layer_norm->forward(
      h + encoder_attn->forward(h, query_pos, memory, memory_valid, ref, shapes));
  return final_layer_norm->forward(h + fc2->forward(fc1->forward_act(h, act)));
}

}  // namespace libreyolo::models::grounding_dino
