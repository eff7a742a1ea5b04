// D-FINE decoder: self-attention, deformable cross-attention on the raw encoder memory (through
// the ms_deform_attn slot), gated fusion, FFN, and fine-grained distribution refinement of box
// edges (modeling_d_fine.py DFineDecoder / DFineDecoderLayer / DFineGate / DFineIntegral /
// DFineLQE, weighting_function, distance2bbox; transformers 5.17).
#include <algorithm>
#include <numeric>

#include "models/dfine/modules.h"

#include "kernels/attention/sampling_locations.h"
#include "kernels/box/refine_boxes.h"

namespace libreyolo::models::dfine {

at::Tensor weighting_function(int64_t max_num_bins, const at::Tensor& up,
                              const at::Tensor& reg_scale) {
  // Same tensor operations as upstream, so that the float32 pow rounding matches
  // (W[1] = -1.9999990463 rather than -2 for the defaults).
  const at::Tensor up0 = up.select(0, 0);  // up[0], 0-d
  const at::Tensor ub1 = up0.abs() * reg_scale.abs();
  const at::Tensor ub2 = up0.abs() * reg_scale.abs() * 2;
  const at::Tensor step = at::pow(ub1 + 1, 2.0 / static_cast<double>(max_num_bins - 2));
  std::vector<at::Tensor> values{-ub2};
  for (int64_t i = max_num_bins / 2 - 1; i > 0; --i)
    values.push_back(-at::pow(step, at::Scalar(i)) + 1);
  values.push_back(at::zeros_like(up0.unsqueeze(0)));
  for (int64_t i = 1; i < max_num_bins / 2; ++i) values.push_back(at::pow(step, at::Scalar(i)) - 1);
  values.push_back(ub2);
  return at::cat(values, 0);
}

at::Tensor distance2bbox(const at::Tensor& points, const at::Tensor& distance,
                         const at::Tensor& reg_scale) {
  const at::Tensor rs = reg_scale.abs();
  const auto p = points.unbind(-1), d = distance.unbind(-1);
  const at::Tensor x0 = p[0] - (0.5 * rs + d[0]) * (p[2] / rs);
  const at::Tensor y0 = p[1] - (0.5 * rs + d[1]) * (p[3] / rs);
  const at::Tensor x1 = p[0] + (0.5 * rs + d[2]) * (p[2] / rs);
  const at::Tensor y1 = p[1] + (0.5 * rs + d[3]) * (p[3] / rs);
  // corners_to_center_format (image_transforms._corners_to_center_format_torch).
  return at::stack({(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0}, -1);
}

MSDeformAttnImpl::MSDeformAttnImpl(const Config& c)
    : points_(c.decoder_points),
      heads_(c.decoder_attention_heads),
      offset_scale_(c.decoder_offset_scale),
      method_(c.decoder_method) {
  const int64_t d = c.d_model;
  total_points_ = std::accumulate(points_.begin(), points_.end(), int64_t{0});
  sampling_offsets_ = register_module(
      "sampling_offsets", std::make_shared<layers::LinearImpl>(d, heads_ * total_points_ * 2));
  attention_weights_ = register_module(
      "attention_weights", std::make_shared<layers::LinearImpl>(d, heads_ * total_points_));
  // Persistent buffer of the checkpoints: 1 / P_l for each point of level l.
  std::vector<float> scale;
  for (auto p : points_)
    for (int64_t i = 0; i < p; ++i) scale.push_back(1.0f / static_cast<float>(p));
  num_points_scale_ = register_buffer("num_points_scale", at::tensor(scale));
}

at::Tensor MSDeformAttnImpl::forward(const at::Tensor& query, const at::Tensor& value,
                                     const at::Tensor& reference_boxes,
                                     const kernels::SpatialShapes& shapes) const {
  const int64_t B = query.size(0), Q = query.size(1);
  const auto offsets = sampling_offsets_->forward(query).reshape({B, Q, heads_, total_points_, 2});
  const auto weights =
      at::softmax(attention_weights_->forward(query).reshape({B, Q, heads_, total_points_}), -1);
  // xy + offsets * num_points_scale * wh * offset_scale, upstream's operands and order.
  const auto loc = kernels::sampling_locations(  // (B, Q, H, sum P, 2)
      sampling_locations_kernel_, offsets, reference_boxes,
      kernels::PointScale::multiply_by(num_points_scale_.to(query.scalar_type())), offset_scale_);
  return kernels::ms_deform_attn_v2(ms_deform_attn_kernel_, value, shapes, loc, weights, points_,
                                    method_);
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
  auto gateway = register_module("gateway", std::make_shared<torch::nn::Module>());
  gate_ = gateway->register_module("gate", std::make_shared<layers::LinearImpl>(2 * d, 2 * d));
  // DFineGate's nn.LayerNorm(d_model): the PyTorch default eps, not layer_norm_eps.
  gate_norm_ = gateway->register_module("norm", std::make_shared<layers::LayerNormImpl>(d, 1e-5));
  fc1_ = register_module("fc1", std::make_shared<layers::LinearImpl>(d, c.decoder_ffn_dim));
  fc2_ = register_module("fc2", std::make_shared<layers::LinearImpl>(c.decoder_ffn_dim, d));
  final_layer_norm_ = register_module("final_layer_norm",
                                      std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& h0, const at::Tensor& pos,
                                     const at::Tensor& value, const at::Tensor& reference_boxes,
                                     const kernels::SpatialShapes& shapes) const {
  const at::Tensor qk = h0 + pos;
  // The residual add and the LayerNorm after it in one add_layer_norm call.
  const at::Tensor residual =
      self_attn_layer_norm_->forward_add(h0, self_attn->forward(qk, qk, h0)).second;
  const at::Tensor cross = encoder_attn_->forward(residual + pos, value, reference_boxes, shapes);
  // DFineGate: g = sigmoid(gate(cat[residual, cross])); LN(g1 * residual + g2 * cross).
  const auto g = at::sigmoid(gate_->forward(at::cat({residual, cross}, -1))).chunk(2, -1);
  at::Tensor h = gate_norm_->forward(g[0] * residual + g[1] * cross);
  h = h + fc2_->forward(fc1_->forward_act(h, act_));
  // The clamp (float16's range) is applied to the residual sum, before the norm.
  return final_layer_norm_->forward(h.clamp(-65504, 65504));
}

DecoderImpl::DecoderImpl(const Config& c)
    : DecoderImpl(c, DecoderParts{[c] { return std::make_shared<DecoderLayerImpl>(c); }}) {}

DecoderImpl::DecoderImpl(const Config& c, const DecoderParts& parts)
    : heads_(c.decoder_attention_heads),
      bins_(c.max_num_bins),
      top_prob_values_(c.top_prob_values) {
  const int64_t d = c.d_model;
  std::vector<std::shared_ptr<DecoderLayerBase>> ls;
  std::vector<layers::Linear> cls;
  std::vector<layers::MLP> box;
  std::vector<std::shared_ptr<torch::nn::Module>> lqe;
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    ls.push_back(parts.make_layer());
    cls.push_back(std::make_shared<layers::LinearImpl>(d, c.num_labels));
    if (!parts.share_bbox_head || i == 0)
      box.push_back(std::make_shared<layers::MLPImpl>(d, d, 4 * (c.max_num_bins + 1), 3));
    auto q = std::make_shared<torch::nn::Module>();
    lqe_.push_back(q->register_module(
        "reg_conf", std::make_shared<layers::MLPImpl>(4 * (c.top_prob_values + 1), c.lqe_hidden_dim,
                                                      1, c.lqe_layers)));
    lqe.push_back(q);
  }
  layers_ = layers::register_list(*this, "layers", ls);
  query_pos_head_ = register_module(
      "query_pos_head", std::make_shared<layers::MLPImpl>(
                            4, parts.query_pos_hidden > 0 ? parts.query_pos_hidden : 2 * d, d,
                            parts.query_pos_layers, parts.query_pos_act));
  pre_bbox_head_ = register_module("pre_bbox_head", std::make_shared<layers::MLPImpl>(d, d, 4, 3));
  layers::register_list(*this, "lqe_layers", lqe);
  class_embed_ = layers::register_list(*this, "class_embed", cls);
  bbox_embed_ = layers::register_list(*this, "bbox_embed", box);
  // share_bbox_head: every layer runs the one MLP (on disk only as index 0).
  bbox_embed_.resize(static_cast<size_t>(c.decoder_layers), bbox_embed_.front());
  // nn.Parameter(torch.tensor([value]), requires_grad=False): stored in the checkpoints.
  reg_scale_ = register_parameter("reg_scale", at::full({1}, c.reg_scale), false);
  up_ = register_parameter("up", at::full({1}, c.up), false);
}

void DecoderImpl::prepare() {
  at::NoGradGuard no_grad;
  project_ = weighting_function(bins_, up_, reg_scale_);
}

std::pair<at::Tensor, at::Tensor> DecoderImpl::forward(const at::Tensor& target,
                                                       const at::Tensor& reference_logits,
                                                       const at::Tensor& memory,
                                                       const kernels::SpatialShapes& shapes) const {
  TORCH_CHECK(project_.defined(), "D-FINE decoder: prepare() was not called after loading");
  const int64_t B = memory.size(0), S = memory.size(1), D = memory.size(2);
  const int64_t Q = target.size(1);
  // Value of the deformable attention: the memory itself, split into heads.
  const at::Tensor value = memory.reshape({B, S, heads_, D / heads_});
  const at::Tensor project = project_.to(memory.scalar_type());
  at::Tensor h = target, ref = at::sigmoid(reference_logits), ref_init, pred_corners, boxes;
  at::Tensor previous_h, previous_corners;  // output_detach / pred_corners_undetach
  for (size_t i = 0; i < layers_.size(); ++i) {
    const at::Tensor pos = query_pos_head_->forward(ref).clamp(-10, 10);
    h = layers_[i]->forward(h, pos, value, ref.unsqueeze(2), shapes);
    if (i == 0)
      ref_init = kernels::refine_boxes(refine_boxes_kernel_, pre_bbox_head_->forward(h), ref);
    // Upstream adds 0 (an int) at layer 0: the same values as not adding anything.
    pred_corners = bbox_embed_[i]->forward(i == 0 ? h : h + previous_h);
    if (i > 0) pred_corners = pred_corners + previous_corners;
    // DFineIntegral: softmax over the bins of each edge, then the W(n)-weighted sum.
    const at::Tensor dist =
        at::linear(at::softmax(pred_corners.reshape({-1, bins_ + 1}), 1), project)
            .reshape({B, Q, 4});
    boxes = distance2bbox(ref_init, dist, reg_scale_);
    previous_corners = pred_corners;
    previous_h = h;
    ref = boxes;
  }
  // Scores of the last layer (eval_idx -1) with the location quality estimate (DFineLQE).
  const size_t last = layers_.size() - 1;
  const at::Tensor scores = class_embed_[last]->forward(h);
  const at::Tensor prob = at::softmax(pred_corners.reshape({B, Q, 4, bins_ + 1}), -1);
  const at::Tensor top = std::get<0>(prob.topk(top_prob_values_, -1));
  const at::Tensor stat = at::cat({top, top.mean(-1, /*keepdim=*/true)}, -1).reshape({B, Q, -1});
  return {scores + lqe_[last]->forward(stat), boxes};
}

}  // namespace libreyolo::models::dfine
