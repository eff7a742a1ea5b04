// Grounding DINO's bi-directional image-text fusion (Liu et al., "Grounding DINO", ECCV 2024,
// feature enhancer): transformers 5.17 GroundingDinoBiMultiHeadAttention and
// GroundingDinoFusionLayer (models/grounding_dino/modeling_grounding_dino.py), operation order
// kept so that float32 results match.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <utility>

#include "models/grounding_dino/config.h"
#include "models/layers/layers.h"

namespace libreyolo::models::grounding_dino {

/// Image-to-text and text-to-image attention sharing one score matrix. embed_dim =
/// encoder_ffn_dim / 2, heads = encoder_attention_heads / 2. On-disk children vision_proj,
/// text_proj, values_vision_proj, values_text_proj, out_vision_proj, out_text_proj.
class BiAttentionImpl : public torch::nn::Module {
 public:
  explicit BiAttentionImpl(const Config& c);
  /// vision (B, Nv, d), text (B, Nt, d), vision_padding (B, Nv) bool true on padded pixels,
  /// text_padding (B, Nt) bool true on padded tokens. Returns (vision delta (B, Nv, d), text
  /// delta (B, Nt, d)). Scores are shifted by their maximum over the WHOLE batch and clamped to
  /// +-50000 before the softmaxes, as upstream (the shift cancels in each softmax).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& vision, const at::Tensor& text,
                                            const at::Tensor& vision_padding,
                                            const at::Tensor& text_padding) const;

  layers::Linear vision_proj, text_proj, values_vision_proj, values_text_proj, out_vision_proj,
      out_text_proj;
  int64_t embed_dim, num_heads, head_dim;
  double scale;
};

/// GroundingDinoFusionLayer: LayerNorms, the bi-attention, gated residuals
/// (vision_param / text_param, (d)). Drop-path is training-only.
class FusionLayerImpl : public torch::nn::Module {
 public:
  explicit FusionLayerImpl(const Config& c);
  /// Same arguments as BiAttentionImpl::forward; returns the updated (vision, text).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& vision, const at::Tensor& text,
                                            const at::Tensor& vision_padding,
                                            const at::Tensor& text_padding) const;

  layers::LayerNorm layer_norm_vision, layer_norm_text;
  std::shared_ptr<BiAttentionImpl> attn;
  at::Tensor vision_param, text_param;
};

}  // namespace libreyolo::models::grounding_dino
