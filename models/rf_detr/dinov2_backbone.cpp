// RfDetrDinov2Backbone forward, in transformers 5.17's operation order.
#include "models/rf_detr/dinov2_backbone.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace libreyolo::models::rf_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

}  // namespace

Dinov2LayerImpl::Dinov2LayerImpl(const Dinov2Config& c, bool global_)
    : act(c.act),
      global(global_),
      swiglu(c.use_swiglu_ffn),
      windows(c.num_windows * c.num_windows) {
  const int64_t d = c.hidden_size;
  norm1 = register_module("norm1", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  auto parent = register_module("attention", make<torch::nn::Module>());
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = c.num_heads;
  o.bias = c.qkv_bias;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  o.o_name = "";
  o.softmax_in_float32 = false;  // eager_attention_forward: softmax in the input dtype
  attention = parent->register_module("attention", make<layers::AttentionImpl>(o));
  auto out = parent->register_module("output", make<torch::nn::Module>());
  output = out->register_module("dense", make<layers::LinearImpl>(d, d));
  auto ls1 = register_module("layer_scale1", make<torch::nn::Module>());
  lambda1 = ls1->register_parameter("lambda1", at::empty({d}));
  norm2 = register_module("norm2", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  auto mlp = register_module("mlp", make<torch::nn::Module>());
  const int64_t hidden = d * c.mlp_ratio;
  if (swiglu) {
    const int64_t h = (hidden * 2 / 3 + 7) / 8 * 8;  // RfDetrDinov2SwiGLUFFN
    fc1 = mlp->register_module("weights_in", make<layers::LinearImpl>(d, 2 * h));
    fc2 = mlp->register_module("weights_out", make<layers::LinearImpl>(h, d));
  } else {
    fc1 = mlp->register_module("fc1", make<layers::LinearImpl>(d, hidden));
    fc2 = mlp->register_module("fc2", make<layers::LinearImpl>(hidden, d));
  }
  auto ls2 = register_module("layer_scale2", make<torch::nn::Module>());
  lambda2 = ls2->register_parameter("lambda1", at::empty({d}));
}

std::pair<at::Tensor, layers::PendingResidual> Dinov2LayerImpl::forward_pending(
    const layers::PendingResidual& in) const {
  // Upstream: y = layer_scale1(attention(norm1(x))) + x; out = layer_scale2(mlp(norm2(y))) + y.
  auto [x, xn] = norm1->forward_add(in.residual, in.delta, in.scale);
  const int64_t n = x.size(0), L = x.size(1), C = x.size(2);
  const at::Tensor h = global ? xn.reshape({n / windows, windows * L, C}) : xn;
  auto a = output->forward(attention->forward(h, h, h));
  if (global) a = a.reshape({n, L, C});
  auto [y, yn] = norm2->forward_add(x, a, lambda1);
  at::Tensor m;
  if (swiglu) {
    const auto parts = fc1->forward(yn).chunk(2, -1);
    m = at::silu(parts[0]) * parts[1];
  } else {
    m = fc1->forward_act(yn, act);
  }
  return {std::move(x), {std::move(y), fc2->forward(m), lambda2}};
}

Dinov2BackboneImpl::Dinov2BackboneImpl(const Dinov2Config& c) : config(c) {
  const int64_t d = c.hidden_size;
  auto embeddings = register_module("embeddings", make<torch::nn::Module>());
  cls_token = embeddings->register_parameter("cls_token", at::empty({1, 1, d}));
  if (c.use_mask_token)
    mask_token = embeddings->register_parameter("mask_token", at::empty({1, d}));
  position_embeddings = embeddings->register_parameter("position_embeddings",
                                                       at::empty({1, c.grid() * c.grid() + 1, d}));
  auto patch = embeddings->register_module("patch_embeddings", make<torch::nn::Module>());
  layers::Conv2dOptions po;
  po.in = c.num_channels;
  po.out = d;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  po.bias = true;
  projection = patch->register_module("projection", make<layers::Conv2dImpl>(po));
  auto encoder = register_module("encoder", make<torch::nn::Module>());
  std::vector<std::shared_ptr<Dinov2LayerImpl>> ls;
  const auto& w = c.window_block_indexes;
  for (int64_t i = 0; i < c.num_layers; ++i)
    ls.push_back(make<Dinov2LayerImpl>(c, std::find(w.begin(), w.end(), i) == w.end()));
  blocks = layers::register_list(*encoder, "layer", ls);
  layernorm = register_module("layernorm", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

std::vector<int64_t> Dinov2BackboneImpl::channels() const {
  return std::vector<int64_t>(config.out_indices.size(), config.hidden_size);
}

at::Tensor Dinov2BackboneImpl::position_embedding(int64_t num_patches, int64_t height,
                                                  int64_t width, int64_t h, int64_t w) const {
  const int64_t num_positions = position_embeddings.size(1) - 1;
  if (num_patches == num_positions && height == width) return position_embeddings;
  const int64_t dim = position_embeddings.size(2);
  const auto side = static_cast<int64_t>(std::pow(static_cast<double>(num_positions), 0.5));
  const auto patch = position_embeddings.slice(1, 1)
                         .reshape({1, side, side, dim})
                         .permute({0, 3, 1, 2})
                         .to(at::kFloat);
  const auto resized = at::_upsample_bicubic2d_aa(patch, {h, w}, /*align_corners=*/false)
                           .to(position_embeddings.scalar_type())
                           .permute({0, 2, 3, 1})
                           .reshape({1, -1, dim});
  return at::cat({position_embeddings.slice(1, 0, 1), resized}, 1);
}

std::vector<at::Tensor> Dinov2BackboneImpl::forward(const at::Tensor& pixel_values,
                                                    bool channels_last_maps) const {
  const int64_t B = pixel_values.size(0), H = pixel_values.size(2), W = pixel_values.size(3);
  const int64_t p = config.patch_size, nw = config.num_windows;
  const int64_t h = H / p, w = W / p;
  if (h % nw != 0 || w % nw != 0)
    throw std::invalid_argument(c10::str(
        "rf_detr: the ", h, "x", w, " patch grid of a ", H, "x", W, " input is not divisible into ",
        nw, "x", nw,
        " windows (input sides must be multiples of patch_size * num_windows = ", p * nw, ")"));
  const auto patches = projection->forward_patches(pixel_values).flatten(2).transpose(1, 2);
  auto e = at::cat({cls_token.expand({B, -1, -1}), patches}, 1);
  e = e + positions_.get({H, W, h, w, static_cast<int64_t>(position_embeddings.scalar_type())},
                         position_embeddings.device(),
                         [&] { return position_embedding(patches.size(1), H, W, h, w); });
  const int64_t C = e.size(2), hpw = h / nw, wpw = w / nw;
  if (nw > 1) {
    // window_partition: upstream views the (h, w) grid as (nw, w / nw, nw, h / nw).
    const auto tokens = e.slice(1, 1)
                            .reshape({B, nw, wpw, nw, hpw, C})
                            .transpose(2, 3)
                            .reshape({B * nw * nw, hpw * wpw, C});
    e = at::cat({e.slice(1, 0, 1).repeat({nw * nw, 1, 1}), tokens}, 1);
  }
  const std::vector<at::Tensor> stages = layers::run_pending_blocks(blocks, e);
  // Stripping [CLS] and window_unpartition are one row gather per image (its windows' rows ->
  // its h * w patch rows), done by the final LayerNorm's own pass (add_layer_norm's row orders)
  // instead of two copies.
  const auto order =
      unwindow_.get({h, w}, e.device(), [&] { return unwindow_rows(nw, hpw, wpw, e.device()); });
  std::vector<at::Tensor> out;
  for (const auto i : config.out_indices) {
    const auto s = stages[i].reshape({B, -1, C});
    const auto patches = config.apply_layernorm
                             ? layernorm->forward_rows(s, at::Tensor(), order).second
                             : s.index_select(1, order);
    const auto map = patches.view({B, h, w, C}).permute({0, 3, 1, 2});  // channels_last
    out.push_back(channels_last_maps ? map : map.contiguous());
  }
  return out;
}

at::Tensor unwindow_rows(int64_t windows, int64_t window_h, int64_t window_w,
                         const at::Device& device) {
  // Upstream's ops on row numbers: strip [CLS], window_unpartition, flatten.
  const int64_t tokens = 1 + window_h * window_w, nw = windows;
  auto rows = at::arange(nw * nw * tokens, at::TensorOptions().dtype(at::kLong).device(device))
                  .view({nw * nw, tokens})
                  .slice(1, 1);
  if (nw > 1)
    rows =
        rows.reshape({nw * nw * (tokens - 1)}).view({nw, nw, window_h, window_w}).transpose(1, 2);
  return rows.reshape({-1});
}

}  // namespace libreyolo::models::rf_detr
