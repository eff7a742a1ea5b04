// The LW-DETR ViT backbone (transformers 5.17 models/lw_detr/modeling_lw_detr.py:
// LwDetrViTBackbone, LwDetrViTEmbeddings, LwDetrViTLayer, LwDetrViTAttention): ViTDet-style
// blocks over a window-major token layout, window attention in some blocks, global attention
// (all windows of an image) in the others, CAE layer scales gamma_1 / gamma_2.
// On-disk children (save_pretrained names): embeddings.{projection, position_embeddings},
// encoder.layer.N.{layernorm_before, attention.attention.{query, key, value},
// attention.output, gamma_1, layernorm_after, intermediate.{fc1, fc2}, gamma_2}.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/lw_detr/config.h"
#include "models/runtime/constant_cache.h"

namespace libreyolo::models::lw_detr {

/// One LwDetrViTLayer (pre-norm). Its attention goes through layers::AttentionImpl (the
/// `attention` slot when fused_attn is on); the key projection has no bias (upstream).
class ViTLayerImpl : public torch::nn::Module {
 public:
  ViTLayerImpl(const ViTConfig& c, bool window);
  /// x (B * num_windows, window tokens, C) window-major. Window blocks attend within a window,
  /// global blocks over the (B, num_windows * window tokens, C) view. Returns x's shape.
  at::Tensor forward(const at::Tensor& x) const { return forward_pending({x}).second.sum(); }
  /// The same on an input left pending by the previous block: returns {the input summed, this
  /// block's output left pending (y + mlp * gamma_2)}, so that each layer-scaled residual add
  /// and the LayerNorm after it run as one add_layer_norm call.
  std::pair<at::Tensor, layers::PendingResidual> forward_pending(
      const layers::PendingResidual& in) const;

  layers::Attention attention;
  layers::Linear attention_output, fc1, fc2;
  layers::LayerNorm layernorm_before, layernorm_after;
  at::Tensor gamma_1, gamma_2;
  layers::Activation act;
  bool window;
  int64_t num_windows;
};

class ViTBackboneImpl : public torch::nn::Module {
 public:
  explicit ViTBackboneImpl(const ViTConfig& c);
  /// pixel_values (B, num_channels, H, W) -> one (B, hidden_size, H / patch, W / patch) map per
  /// out_indices entry, in that order. Throws std::invalid_argument when the patch grid is not
  /// divisible by num_windows_side in both directions (upstream's reshape fails there too).
  /// channels_last_maps: the maps in channels_last memory format (the same values), for a
  /// channels_last projector: the copy out of the window-major token order then moves whole
  /// rows of channels instead of transposing every element into NCHW.
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values,
                                  bool channels_last_maps = false) const;
  /// Channels of each returned map (hidden_size per out_indices entry).
  std::vector<int64_t> channels() const;

  ViTConfig config;
  layers::Conv2d projection;
  at::Tensor position_embeddings;  ///< (1, 1 + pretrain grid^2, C); undefined when not used
  std::vector<std::shared_ptr<ViTLayerImpl>> blocks;

 private:
  /// get_absolute_positions: the stored grid (cls position dropped), bicubic-resized
  /// (align_corners false) to (h, w) unless it already is that size. (1, h, w, C).
  at::Tensor absolute_positions(int64_t h, int64_t w) const;
  /// absolute_positions per (h, w, dtype): a function of the weights alone, kept.
  ConstantCache positions_;
};

/// Save-pretrained ViT attention names (attention.attention.query, attention.output) may also
/// come with transformers 5's module names (attention.q_proj, attention.o_proj; the weight
/// conversion of conversion_mapping.py "lw_detr"): the other spelling of `module_key`, or "".
std::string vit_attention_alias(const std::string& module_key);

}  // namespace libreyolo::models::lw_detr
