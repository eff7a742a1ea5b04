// LwDetrViTBackbone forward, in transformers 5.17's operation order.
#include "models/lw_detr/vit_backbone.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <stdexcept>

namespace libreyolo::models::lw_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

}  // namespace

ViTLayerImpl::ViTLayerImpl(const ViTConfig& c, bool window)
    : act(c.act), window(window), num_windows(c.num_windows) {
  const int64_t d = c.hidden_size;
  layernorm_before =
      register_module("layernorm_before", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  auto parent = register_module("attention", make<torch::nn::Module>());
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = c.num_heads;
  o.bias = c.qkv_bias;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  o.o_name = "";
  o.softmax_in_float32 = true;  // eager_attention_forward: softmax(dtype=float32)
  attention = parent->register_module("attention", make<layers::AttentionImpl>(o));
  if (c.qkv_bias)  // LwDetrViTAttention: k_proj has no bias
    attention->k_proj = attention->replace_module("key", make<layers::LinearImpl>(d, d, false));
  attention_output = parent->register_module("output", make<layers::LinearImpl>(d, d, true));
  gamma_1 = register_parameter("gamma_1", at::empty({d}));
  gamma_2 = register_parameter("gamma_2", at::empty({d}));
  layernorm_after =
      register_module("layernorm_after", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  auto intermediate = register_module("intermediate", make<torch::nn::Module>());
  fc1 = intermediate->register_module("fc1", make<layers::LinearImpl>(d, d * c.mlp_ratio));
  fc2 = intermediate->register_module("fc2", make<layers::LinearImpl>(d * c.mlp_ratio, d));
}

std::pair<at::Tensor, layers::PendingResidual> ViTLayerImpl::forward_pending(
    const layers::PendingResidual& in) const {
  // Upstream: y = x + attention(layernorm_before(x)) * gamma_1;
  // out = y + mlp(layernorm_after(y)) * gamma_2.
  auto [x, h] = layernorm_before->forward_add(in.residual, in.delta, in.scale);
  const int64_t n = x.size(0), L = x.size(1), C = x.size(2);
  if (!window) h = h.reshape({n / num_windows, num_windows * L, C});
  auto a = attention_output->forward(attention->forward(h, h, h));
  if (!window) a = a.reshape({n, L, C});
  auto [y, yn] = layernorm_after->forward_add(x, a, gamma_1);
  auto m = fc2->forward(fc1->forward_act(yn, act));
  return {std::move(x), {std::move(y), std::move(m), gamma_2}};
}

ViTBackboneImpl::ViTBackboneImpl(const ViTConfig& c) : config(c) {
  auto embeddings = register_module("embeddings", make<torch::nn::Module>());
  layers::Conv2dOptions po;
  po.in = c.num_channels;
  po.out = c.hidden_size;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  po.bias = true;
  projection = embeddings->register_module("projection", make<layers::Conv2dImpl>(po));
  if (c.absolute_position_embeddings) {
    const int64_t grid = (c.pretrain_height / c.patch_size) * (c.pretrain_width / c.patch_size);
    position_embeddings = embeddings->register_parameter("position_embeddings",
                                                         at::empty({1, grid + 1, c.hidden_size}));
  }
  auto encoder = register_module("encoder", make<torch::nn::Module>());
  std::vector<std::shared_ptr<ViTLayerImpl>> ls;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto& w = c.window_block_indices;
    ls.push_back(make<ViTLayerImpl>(c, std::find(w.begin(), w.end(), i) != w.end()));
  }
  blocks = layers::register_list(*encoder, "layer", ls);
}

std::vector<int64_t> ViTBackboneImpl::channels() const {
  return std::vector<int64_t>(config.out_indices.size(), config.hidden_size);
}

at::Tensor ViTBackboneImpl::absolute_positions(int64_t h, int64_t w) const {
  const auto pos = position_embeddings.slice(1, 1);
  const auto side = config.pretrain_height / config.patch_size;
  if (side == h && side == w) return pos.reshape({1, h, w, -1});
  const auto grid = pos.reshape({1, side, side, -1}).permute({0, 3, 1, 2});
  return at::upsample_bicubic2d(grid, {h, w}, /*align_corners=*/false).permute({0, 2, 3, 1});
}

std::vector<at::Tensor> ViTBackboneImpl::forward(const at::Tensor& pixel_values,
                                                 bool channels_last_maps) const {
  auto e = projection->forward_patches(pixel_values).permute({0, 2, 3, 1});  // (B, h, w, C)
  const int64_t B = e.size(0), h = e.size(1), w = e.size(2), C = e.size(3);
  if (position_embeddings.defined())
    e = e + positions_.get({h, w, static_cast<int64_t>(position_embeddings.scalar_type())},
                           position_embeddings.device(), [&] { return absolute_positions(h, w); });
  const int64_t side = config.num_windows_side;
  if (h % side != 0 || w % side != 0)
    throw std::invalid_argument(
        c10::str("lw_detr: the ", h, "x", w, " patch grid of a ", pixel_values.size(2), "x",
                 pixel_values.size(3), " input is not divisible into ", side, "x", side,
                 " windows (input sides must be multiples of patch_size * num_windows_side = ",
                 config.patch_size * side, ")"));
  const int64_t wh = h / side, ww = w / side;
  auto x = e.reshape({B, side, wh, side, ww, C})
               .permute({0, 1, 3, 2, 4, 5})
               .reshape({B * side * side, wh * ww, C});
  auto to_map = [&](const at::Tensor& t) {
    if (channels_last_maps)  // (B, h, w, C) rows, viewed (B, C, h, w)
      return t.reshape({B, side, side, wh, ww, C})
          .permute({0, 1, 3, 2, 4, 5})
          .reshape({B, h, w, C})
          .permute({0, 3, 1, 2});
    return t.reshape({B, side, side, wh, ww, C}).permute({0, 5, 1, 3, 2, 4}).reshape({B, C, h, w});
  };
  const std::vector<at::Tensor> stages = layers::run_pending_blocks(blocks, x);
  std::vector<at::Tensor> out;
  for (const auto i : config.out_indices) out.push_back(to_map(stages[i]));
  return out;
}

std::string vit_attention_alias(const std::string& module_key) {
  static const std::pair<const char*, const char*> renames[] = {
      {".attention.attention.query.", ".attention.q_proj."},
      {".attention.attention.key.", ".attention.k_proj."},
      {".attention.attention.value.", ".attention.v_proj."},
      {".attention.output.", ".attention.o_proj."}};
  for (const auto& [from, to] : renames) {
    const auto at = module_key.find(from);
    if (at != std::string::npos)
      return module_key.substr(0, at) + to + module_key.substr(at + std::string(from).size());
  }
  return {};
}

}  // namespace libreyolo::models::lw_detr
