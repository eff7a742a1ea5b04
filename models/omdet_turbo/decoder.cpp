// OmDetTurboDecoder (transformers 5.17 modeling_omdet_turbo.py) op for op, eval branch.

#include "models/omdet_turbo/decoder.h"

#include <c10/util/StringUtil.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/box/refine_boxes.h"
#include "models/layers/bert_model.h"
#include "models/layers/gather_rows.h"

namespace libreyolo::models::omdet_turbo {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

}  // namespace

at::Tensor class_similarity(bool cosine, const at::Tensor& features, const at::Tensor& classes) {
  if (!cosine) return at::bmm(features, classes);
  const auto a = features / at::linalg_vector_norm(features, 2, {2}, true).clamp_min(1e-12);
  const auto b = classes / at::linalg_vector_norm(classes, 2, {1}, true).clamp_min(1e-12);
  // logit_scale = torch.tensor(1 / 0.07).log(), then .exp(): a float32 round trip.
  const auto scale = at::scalar_tensor(1 / 0.07, at::kFloat).log().exp();
  return scale.to(a.scalar_type()) * at::bmm(a, b);
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c) : act_(c.decoder_activation) {
  const int64_t d = c.decoder_hidden_dim;
  layers::AttentionOptions o;  // OmDetTurboMultiheadAttention: query/key/value/out_proj
  o.embed_dim = d;
  o.num_heads = c.hybrid.decoder_attention_heads;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  self_attn_ = register_module("self_attn", make<layers::AttentionImpl>(o));
  norm1_ = register_module("norm1", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  cross_attn_ = register_module("cross_attn", make<rtdetr::MSDeformAttnImpl>(c.hybrid));
  norm2_ = register_module("norm2", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  linear1_ = register_module("linear1", make<layers::LinearImpl>(d, c.decoder_ffn));
  linear2_ = register_module("linear2", make<layers::LinearImpl>(c.decoder_ffn, d));
  norm3_ = register_module("norm3", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

std::pair<at::Tensor, at::Tensor> DecoderLayerImpl::forward(
    const at::Tensor& h, const at::Tensor& task, const at::Tensor& query_pos,
    const at::Tensor& reference, const at::Tensor& vision, const kernels::SpatialShapes& shapes,
    const at::Tensor& bias) const {
  const int64_t q = h.size(1);
  const auto qk = at::cat({h + query_pos, task}, 1);
  const auto v = at::cat({h, task}, 1);
  const auto fused = norm1_->forward(v + self_attn_->forward(qk, qk, v, bias));
  const auto out_task = fused.slice(1, q);
  auto x = fused.slice(1, 0, q);
  x = norm2_->forward(x +
                      cross_attn_->forward(x + query_pos, vision, reference.unsqueeze(2), shapes));
  x = norm3_->forward(x + linear2_->forward(layers::activate(act_, linear1_->forward(x))));
  return {x, out_task};
}

DecoderImpl::DecoderImpl(const Config& c) : config_(c) {
  const int64_t d = c.decoder_hidden_dim, e = c.class_embed_dim;
  auto proj = register_module("channel_projection_layers", make<torch::nn::Module>());
  for (size_t i = 0; i < c.vision_features_channels.size(); ++i)
    channel_projection_layers_.push_back(proj->register_module(
        std::to_string(i),  // nn.BatchNorm2d(hidden_dim): the default eps 1e-5
        layers::sequential_conv_bn(c.vision_features_channels[i], d, 1, 1, 0, 1e-5)));
  auto task_encoder = register_module("task_encoder", make<torch::nn::Module>());
  auto mlp = task_encoder->register_module("mlp", make<torch::nn::Module>());
  task_mlp1_ =
      mlp->register_module("linear1", make<layers::LinearImpl>(e, c.task_encoder_hidden_dim));
  task_mlp2_ =
      mlp->register_module("linear2", make<layers::LinearImpl>(c.task_encoder_hidden_dim, e));
  auto res1 = task_encoder->register_module("res1", make<torch::nn::Module>());
  task_norm_ = res1->register_module("norm1", make<layers::LayerNormImpl>(e, c.layer_norm_eps));
  task_project_ = register_module("task_project", make<layers::LinearImpl>(e, d));
  std::vector<std::shared_ptr<DecoderLayerImpl>> ls;
  std::vector<layers::Linear> cls;
  std::vector<layers::MLP> box;
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    ls.push_back(make<DecoderLayerImpl>(c));
    cls.push_back(make<layers::LinearImpl>(e, d));
    box.push_back(make<layers::MLPImpl>(d, d, 4, 3));
  }
  layers_ = layers::register_list(*this, "layers", ls);
  if (c.learn_initial_query) {
    auto tgt = register_module("tgt_embed", make<torch::nn::Module>());
    tgt_embed_ = tgt->register_parameter("weight", at::empty({c.num_queries, d}));
  }
  query_position_head_ =
      register_module("query_position_head", make<layers::MLPImpl>(4, 2 * d, d, 2));
  auto evf = register_module("encoder_vision_features", make<torch::nn::Module>());
  encoder_vision_linear_ = evf->register_module("0", make<layers::LinearImpl>(d, d));
  encoder_vision_norm_ =
      evf->register_module("1", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  encoder_class_head_ = register_module("encoder_class_head", make<layers::LinearImpl>(e, d));
  encoder_bbox_head_ = register_module("encoder_bbox_head", make<layers::MLPImpl>(d, d, 4, 3));
  decoder_class_head_ = layers::register_list(*this, "decoder_class_head", cls);
  decoder_bbox_head_ = layers::register_list(*this, "decoder_bbox_head", box);
}

std::pair<at::Tensor, at::Tensor> DecoderImpl::forward(const std::vector<at::Tensor>& pan,
                                                       const at::Tensor& classes,
                                                       const at::Tensor& task,
                                                       const at::Tensor& task_mask) const {
  // _get_encoder_input: projected maps flattened level by level.
  std::vector<at::Tensor> projected;
  for (size_t l = 0; l < pan.size(); ++l)
    projected.push_back(channel_projection_layers_[l]->forward(pan[l]));
  kernels::SpatialShapes shapes;
  const auto vision = rtdetr::flatten_sources(projected, shapes);
  const int64_t b = vision.size(0), s = vision.size(1), q = config_.num_queries;
  if (q > s)
    throw std::invalid_argument(c10::str("omdet-turbo: num_queries = ", q, " exceeds the ", s,
                                         " positions of the feature maps"));

  // Task encoder: res1.norm1(x + mlp(x)), then task_project; (T, B, E) -> (B, T, D).
  auto t = task.transpose(0, 1);
  t = task_norm_->forward(t + task_mlp2_->forward(layers::activate(config_.decoder_activation,
                                                                   task_mlp1_->forward(t))));
  t = task_project_->forward(t);
  // The fused self-attention's keys: queries always, task tokens where task_mask is nonzero.
  const auto dtype = vision.scalar_type();
  const auto key_padding =
      at::cat({at::zeros({b, q}, task_mask.options().dtype(at::kBool)), task_mask.eq(0)}, 1);
  const auto bias = at::zeros(key_padding.sizes(), vision.options())
                        .masked_fill(key_padding, layers::finfo_min(dtype))
                        .view({b, 1, 1, -1});

  // _get_decoder_input: anchors (+inf where invalid), class similarity, top-k queries.
  auto [anchors, valid] = rtdetr::generate_anchors(shapes, dtype, vision.device());
  anchors = at::where(valid, anchors, std::numeric_limits<double>::infinity());
  const auto features = encoder_vision_norm_->forward(
      encoder_vision_linear_->forward(at::where(valid, vision, at::zeros({}, vision.options()))));
  const auto projected_classes = encoder_class_head_->forward(classes).permute({1, 2, 0});
  const auto similarity = class_similarity(config_.cosine, features, projected_classes);
  const auto topk = std::get<1>(at::topk(std::get<0>(similarity.max(-1)), q, 1));
  // The box head on the selected tokens only (upstream runs it on all of them and gathers): it
  // is row-wise, so the gathered rows are the same.
  const auto selected = layers::gather_rows(features, topk);
  auto reference =
      (encoder_bbox_head_->forward(selected) + layers::gather_rows(anchors, topk)).sigmoid();
  at::Tensor h = config_.learn_initial_query ? tgt_embed_.unsqueeze(0).repeat({b, 1, 1}) : selected;

  // The layers; the eval branch computes the heads of the last layer only.
  const auto n = layers_.size();
  for (size_t i = 0; i < n; ++i) {
    const auto query_pos = query_position_head_->forward(reference);
    std::tie(h, t) = layers_[i]->forward(h, t, query_pos, reference, vision, shapes, bias);
    // sigmoid(delta + _inverse_sigmoid(reference)) (eps 1e-5, x clamped to [0, 1] first, not
    // at::logit's two-sided clamp): one refine_boxes call.
    const auto refined =
        kernels::refine_boxes(refine_boxes_kernel_, decoder_bbox_head_[i]->forward(h), reference);
    if (i + 1 == n) {
      const auto projected = decoder_class_head_[i]->forward(classes).permute({1, 2, 0});
      return {class_similarity(config_.cosine, h, projected), refined};
    }
    reference = refined;
  }
  throw std::logic_error("omdet-turbo: a decoder without layers");
}

}  // namespace libreyolo::models::omdet_turbo
