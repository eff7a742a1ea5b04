// DEIMv2 decoder: D-FINE's fine-grained distribution refinement (dfine::DecoderImpl) with
// RMSNorm, a SwiGLU FFN and an optional gateway per layer (modeling_deimv2.py Deimv2RMSNorm,
// Deimv2SwiGLUFFN, Deimv2Gate, Deimv2DecoderLayer, Deimv2Decoder; transformers 5.17).
#include "models/deimv2/modules.h"

namespace libreyolo::models::deimv2 {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) const {
  if (x.is_cuda() && weight_.scalar_type() == x.scalar_type())
    return std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, weight_, eps_));
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight_ * (h * at::rsqrt(variance + eps_)).to(x.scalar_type());
}

SwiGLUFFNImpl::SwiGLUFFNImpl(const Config& c) {
  const int64_t d = c.d_model, hidden = c.decoder_ffn_dim / 2;
  gate_proj_ = register_module("gate_proj", std::make_shared<layers::LinearImpl>(d, hidden));
  up_proj_ = register_module("up_proj", std::make_shared<layers::LinearImpl>(d, hidden));
  down_proj_ = register_module("down_proj", std::make_shared<layers::LinearImpl>(hidden, d));
}

at::Tensor SwiGLUFFNImpl::forward(const at::Tensor& x) const {
  return down_proj_->forward(at::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c) {
  const int64_t d = c.d_model;
  layers::AttentionOptions a;
  a.embed_dim = d;
  a.num_heads = c.decoder_attention_heads;
  a.o_name = "o_proj";
  self_attn = register_module("self_attn", std::make_shared<layers::AttentionImpl>(a));
  self_attn_layer_norm_ = register_module("self_attn_layer_norm", std::make_shared<RMSNormImpl>(d));
  encoder_attn_ = register_module("encoder_attn", std::make_shared<dfine::MSDeformAttnImpl>(c));
  mlp_ = register_module("mlp", std::make_shared<SwiGLUFFNImpl>(c));
  final_layer_norm_ = register_module("final_layer_norm", std::make_shared<RMSNormImpl>(d));
  if (c.use_gateway) {
    auto gateway = register_module("gateway", std::make_shared<torch::nn::Module>());
    gate_ = gateway->register_module("gate", std::make_shared<layers::LinearImpl>(2 * d, 2 * d));
    gate_norm_ = gateway->register_module("norm", std::make_shared<RMSNormImpl>(d));
  } else {
    encoder_attn_layer_norm_ =
        register_module("encoder_attn_layer_norm", std::make_shared<RMSNormImpl>(d));
  }
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& h0, const at::Tensor& pos,
                                     const at::Tensor& value, const at::Tensor& reference_boxes,
                                     const kernels::SpatialShapes& shapes) const {
  // Deimv2SelfAttention: position embedding on queries and keys, not on values.
  const at::Tensor qk = h0 + pos;
  const at::Tensor residual = self_attn_layer_norm_->forward(h0 + self_attn->forward(qk, qk, h0));
  const at::Tensor cross = encoder_attn_->forward(residual + pos, value, reference_boxes, shapes);
  at::Tensor h;
  if (gate_) {
    // Deimv2Gate: g = sigmoid(gate(cat[residual, cross])); RMSNorm(g1 * residual + g2 * cross).
    const auto g = at::sigmoid(gate_->forward(at::cat({residual, cross}, -1))).chunk(2, -1);
    h = gate_norm_->forward(g[0] * residual + g[1] * cross);
  } else {
    h = encoder_attn_layer_norm_->forward(residual + cross);
  }
  return final_layer_norm_->forward(h + mlp_->forward(h));
}

std::shared_ptr<dfine::DecoderImpl> make_decoder(const Config& c) {
  dfine::DecoderParts parts;
  parts.make_layer = [c] { return std::make_shared<DecoderLayerImpl>(c); };
  parts.query_pos_hidden = c.d_model;
  parts.query_pos_layers = 3;
  parts.query_pos_act = c.decoder_activation;
  parts.share_bbox_head = c.share_bbox_head;
  return std::make_shared<dfine::DecoderImpl>(c, parts);
}

}  // namespace libreyolo::models::deimv2
