// RT-DETR / RT-DETRv2 decoder: self-attention, multi-scale deformable cross-attention through
// the ms_deform_attn slot, FFN, iterative box refinement (modeling_rt_detr.py RTDetrDecoder,
// modeling_rt_detr_v2.py RTDetrV2MultiscaleDeformableAttention).
#include "models/rtdetr/modules.h"

#include "kernels/attention/sampling_locations.h"
#include "kernels/box/refine_boxes.h"

namespace libreyolo::models::rtdetr {

MSDeformAttnImpl::MSDeformAttnImpl(const Config& c)
    : heads_(c.decoder_attention_heads),
      levels_(c.num_feature_levels),
      points_(c.decoder_n_points),
      v2_(c.v2),
      offset_scale_(c.decoder_offset_scale),
      method_(c.decoder_method) {
  const int64_t d = c.d_model;
  sampling_offsets_ = register_module(
      "sampling_offsets", std::make_shared<layers::LinearImpl>(d, heads_ * levels_ * points_ * 2));
  attention_weights_ = register_module(
      "attention_weights", std::make_shared<layers::LinearImpl>(d, heads_ * levels_ * points_));
  value_proj_ = register_module("value_proj", std::make_shared<layers::LinearImpl>(d, d));
  output_proj_ = register_module("output_proj", std::make_shared<layers::LinearImpl>(d, d));
  if (v2_) {
    // Persistent buffer of v2 checkpoints: 1 / n_points for each of the L * P points.
    n_points_scale_ = register_buffer(
        "n_points_scale", at::full({levels_ * points_}, 1.0 / static_cast<double>(points_)));
  }
}

at::Tensor MSDeformAttnImpl::forward(const at::Tensor& query, const at::Tensor& memory,
                                     const at::Tensor& reference_boxes,
                                     const kernels::SpatialShapes& shapes) const {
  const int64_t B = query.size(0), Q = query.size(1), S = memory.size(1);
  const int64_t C = memory.size(2) / heads_;
  const at::Tensor value = value_proj_->forward(memory).view({B, S, heads_, C});
  at::Tensor out;
  if (!v2_) {
    const auto offsets =
        sampling_offsets_->forward(query).view({B, Q, heads_, levels_, points_, 2});
    const auto weights =
        at::softmax(attention_weights_->forward(query).view({B, Q, heads_, levels_ * points_}), -1)
            .view({B, Q, heads_, levels_, points_});
    // loc = xy + off / P * wh * 0.5 (upstream order), as (B, Q, H, L, P, 2).
    const auto loc =
        kernels::sampling_locations(
            sampling_locations_kernel_, offsets.view({B, Q, heads_, levels_ * points_, 2}),
            reference_boxes, kernels::PointScale::divide_by(static_cast<double>(points_)), 0.5)
            .view(offsets.sizes());
    out = kernels::ms_deform_attn(ms_deform_attn_kernel_, value, shapes, loc, weights);
  } else {
    const auto offsets =
        sampling_offsets_->forward(query).view({B, Q, heads_, levels_ * points_, 2});
    const auto weights =
        at::softmax(attention_weights_->forward(query).view({B, Q, heads_, levels_ * points_}), -1);
    const auto loc = kernels::sampling_locations(
        sampling_locations_kernel_, offsets, reference_boxes,
        kernels::PointScale::multiply_by(n_points_scale_.to(query.scalar_type())), offset_scale_);
    out = kernels::ms_deform_attn_v2(ms_deform_attn_kernel_, value, shapes, loc, weights,
                                     std::vector<int64_t>(levels_, points_), method_);
  }
  return output_proj_->forward(out);
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c) : act_(c.decoder_activation) {
  const int64_t d = c.d_model;
  layers::AttentionOptions a;
  a.embed_dim = d;
  a.num_heads = c.decoder_attention_heads;
  self_attn = register_module("self_attn", std::make_shared<layers::AttentionImpl>(a));
  self_attn_layer_norm_ = register_module(
      "self_attn_layer_norm", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  encoder_attn_ = register_module("encoder_attn", std::make_shared<MSDeformAttnImpl>(c));
  encoder_attn_layer_norm_ = register_module(
      "encoder_attn_layer_norm", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  fc1_ = register_module("fc1", std::make_shared<layers::LinearImpl>(d, c.decoder_ffn_dim));
  fc2_ = register_module("fc2", std::make_shared<layers::LinearImpl>(c.decoder_ffn_dim, d));
  final_layer_norm_ = register_module("final_layer_norm",
                                      std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& h0, const at::Tensor& pos,
                                     const at::Tensor& memory, const at::Tensor& reference_boxes,
                                     const kernels::SpatialShapes& shapes) const {
  // Post-norm residuals: each add and the LayerNorm after it in one add_layer_norm call. fc1
  // stays at::linear + activation: linear_act's oneDNN GEMM moves PP-DocLayoutV2's (an RT-DETR
  // subclass) reading-order logits past the 1e-4 bar on the CPU (docs/BENCHMARKS.md).
  const at::Tensor qk = h0 + pos;
  at::Tensor h = self_attn_layer_norm_->forward_add(h0, self_attn->forward(qk, qk, h0)).second;
  h = encoder_attn_layer_norm_
          ->forward_add(h, encoder_attn_->forward(h + pos, memory, reference_boxes, shapes))
          .second;
  return final_layer_norm_->forward_add(h, fc2_->forward(layers::activate(act_, fc1_->forward(h))))
      .second;
}

DecoderImpl::DecoderImpl(const Config& c) {
  const int64_t d = c.d_model;
  std::vector<std::shared_ptr<DecoderLayerImpl>> ls;
  std::vector<layers::Linear> cls;
  std::vector<layers::MLP> box;
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    ls.push_back(std::make_shared<DecoderLayerImpl>(c));
    cls.push_back(std::make_shared<layers::LinearImpl>(d, c.num_labels));
    box.push_back(std::make_shared<layers::MLPImpl>(d, d, 4, 3));
  }
  layers_ = layers::register_list(*this, "layers", ls);
  query_pos_head_ =
      register_module("query_pos_head", std::make_shared<layers::MLPImpl>(4, 2 * d, d, 2));
  class_embed_ = layers::register_list(*this, "class_embed", cls);
  bbox_embed_ = layers::register_list(*this, "bbox_embed", box);
}

std::pair<at::Tensor, at::Tensor> DecoderImpl::forward(const at::Tensor& target,
                                                       const at::Tensor& reference_logits,
                                                       const at::Tensor& memory,
                                                       const kernels::SpatialShapes& shapes) const {
  at::Tensor h = target;
  at::Tensor ref = at::sigmoid(reference_logits);
  at::Tensor logits;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const at::Tensor pos = query_pos_head_->forward(ref);
    h = layers_[i]->forward(h, pos, memory, ref.unsqueeze(2), shapes);
    // sigmoid(delta + inverse_sigmoid(ref)), one refine_boxes call.
    ref = kernels::refine_boxes(refine_boxes_kernel_, bbox_embed_[i]->forward(h), ref);
    // Only the last layer's logits are returned (intermediate ones feed training losses).
    if (i + 1 == layers_.size()) logits = class_embed_[i]->forward(h);
  }
  return {logits, ref};
}

}  // namespace libreyolo::models::rtdetr
