// LwDetrDecoder forward, in transformers 5.17's operation order.
#include "models/lw_detr/decoder.h"

#include <cmath>

namespace libreyolo::models::lw_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

}  // namespace

at::Tensor sinusoidal_position_embedding(const at::Tensor& pos, int64_t num_pos_feats) {
  return sinusoidal_position_embedding(pos, sine_frequencies(num_pos_feats, pos.device()));
}

at::Tensor sine_frequencies(int64_t num_pos_feats, const at::Device& device) {
  const auto dim_t =
      at::arange(num_pos_feats, at::TensorOptions().dtype(at::kFloat).device(device));
  return at::pow(10000, 2 * at::div(dim_t, 2, "floor") / num_pos_feats);
}

at::Tensor sinusoidal_position_embedding(const at::Tensor& pos, const at::Tensor& dim_t) {
  const int64_t n = pos.size(-1), f = dim_t.size(0);
  TORCH_CHECK(f % 2 == 0, "sinusoidal_position_embedding: an odd feature count (", f, ")");
  // Upstream, per coordinate: coord.unsqueeze(-1) * scale / dim_t (the product rounded to pos's
  // dtype, the quotient float32), sin of the even features, cos of the odd ones, interleaved;
  // y before x. The same elementwise ops on every coordinate at once give the same values.
  const at::Tensor ordered =
      n >= 2 ? at::cat({pos.narrow(-1, 1, 1), pos.narrow(-1, 0, 1), pos.narrow(-1, 2, n - 2)}, -1)
             : pos;
  const auto e = (ordered * (2 * M_PI)).unsqueeze(-1) / dim_t;  // (..., n, f) float32
  auto sizes = e.sizes().vec();
  sizes.back() = f / 2;
  sizes.push_back(2);
  // (..., n, f / 2, [sin, cos]) in pos's dtype: sin and cos are computed in float32 and rounded
  // once on the way out, as upstream's float32 result and its .to(dtype) round it.
  auto out = at::empty(sizes, e.options().dtype(pos.scalar_type()));
  auto sin = out.select(-1, 0), cos = out.select(-1, 1);
  at::sin_out(sin, e.slice(-1, 0, c10::nullopt, 2));
  at::cos_out(cos, e.slice(-1, 1, c10::nullopt, 2));
  return out.flatten(-3);
}

DecoderLayerImpl::DecoderLayerImpl(const DetrConfig& c) : act(c.decoder_act) {
  const int64_t d = c.d_model;
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = c.self_heads;
  o.bias = c.attention_bias;
  o.o_name = "o_proj";
  // LW-DETR's eager_attention_forward: softmax(dtype=float32); RF-DETR's: the input dtype.
  o.softmax_in_float32 = c.softmax_in_float32;
  self_attn = register_module("self_attn", make<layers::AttentionImpl>(o));
  self_attn_layer_norm =
      register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(d, 1e-5));
  cross_attn =
      register_module("cross_attn", make<deformable_detr::MultiscaleDeformableAttentionImpl>(
                                        d, c.cross_heads, c.num_levels(), c.decoder_points));
  cross_attn_layer_norm =
      register_module("cross_attn_layer_norm", make<layers::LayerNormImpl>(d, 1e-5));
  auto mlp = register_module("mlp", make<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", make<layers::LinearImpl>(d, c.decoder_ffn));
  fc2 = mlp->register_module("fc2", make<layers::LinearImpl>(c.decoder_ffn, d));
  layer_norm = register_module("layer_norm", make<layers::LayerNormImpl>(d, 1e-5));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& query_pos,
                                     const at::Tensor& ref, const at::Tensor& memory,
                                     const at::Tensor& memory_mask,
                                     const kernels::SpatialShapes& shapes) const {
  // Post-norm residuals: each add and the LayerNorm after it in one add_layer_norm call.
  const auto qk = x + query_pos;
  auto h = self_attn_layer_norm->forward_add(x, self_attn->forward(qk, qk, x)).second;
  h = cross_attn_layer_norm
          ->forward_add(h, cross_attn->forward(h, query_pos, memory, memory_mask, ref, shapes))
          .second;
  return layer_norm->forward_add(h, fc2->forward(fc1->forward_act(h, act))).second;
}

DecoderImpl::DecoderImpl(const DetrConfig& c) : d_model(c.d_model) {
  std::vector<std::shared_ptr<DecoderLayerImpl>> ls;
  for (int64_t i = 0; i < c.decoder_layers; ++i) ls.push_back(make<DecoderLayerImpl>(c));
  layers_ = layers::register_list(*this, "layers", ls);
  layernorm = register_module("layernorm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  ref_point_head = register_module(
      "ref_point_head",
      make<layers::MLPImpl>(2 * c.d_model, c.d_model, c.d_model, 2, layers::Activation::relu));
}

at::Tensor DecoderImpl::forward(const at::Tensor& target, const at::Tensor& reference_points,
                                const at::Tensor& valid_ratios, const at::Tensor& memory,
                                const at::Tensor& memory_mask,
                                const kernels::SpatialShapes& shapes) const {
  // get_reference: per-level boxes and the query position of level 0's. Without padding every
  // valid ratio is 1 and the product is the boxes themselves.
  const auto levels = static_cast<int64_t>(shapes.size());
  const auto ref = valid_ratios.defined()
                       ? reference_points.slice(-1, 0, 4).unsqueeze(2) *
                             at::cat({valid_ratios, valid_ratios}, -1).unsqueeze(1)
                       : reference_points.slice(-1, 0, 4).unsqueeze(2).expand({-1, -1, levels, -1});
  const auto dim_t = frequencies_.get({d_model / 2}, memory.device(), [&] {
    return sine_frequencies(d_model / 2, memory.device());
  });
  const auto query_pos =
      ref_point_head->forward(sinusoidal_position_embedding(ref.select(2, 0), dim_t));
  at::Tensor h = target;
  for (const auto& layer : layers_)
    h = layer->forward(h, query_pos, ref, memory, memory_mask, shapes);
  return layernorm->forward(h);
}

}  // namespace libreyolo::models::lw_detr
