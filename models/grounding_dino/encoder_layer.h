// One layer of Grounding DINO's feature enhancer (transformers 5.17
// GroundingDinoEncoderLayer): image-text fusion, text self-attention
// (GroundingDinoTextEnhancerLayer), multi-scale deformable self-attention of the image tokens
// (GroundingDinoDeformableLayer).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <utility>

#include "kernels/attention/ms_deform_attn.h"
#include "models/deformable_detr/ms_deform_attention.h"
#include "models/grounding_dino/config.h"
#include "models/grounding_dino/fusion.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models::grounding_dino {

/// Text self-attention (encoder_attention_heads / 2 heads, children self_attn.{query,key,value,
/// out_proj}), FFN of encoder_ffn_dim / 2, post-norm (layer_norm_before, layer_norm_after).
class TextEnhancerLayerImpl : public torch::nn::Module {
 public:
  explicit TextEnhancerLayerImpl(const Config& c);
  /// text (B, L, d), bias (B, 1, L, L) additive (0 allowed, the dtype's lowest value not),
  /// pos (B, L, d). Returns (B, L, d).
  at::Tensor forward(const at::Tensor& text, const at::Tensor& bias, const at::Tensor& pos) const;

  layers::Attention self_attn;
  layers::Linear fc1, fc2;
  layers::LayerNorm layer_norm_before, layer_norm_after;
  layers::Activation act;
};

/// Deformable DETR's encoder layer (post-norm) with the config's layer_norm_eps.
class DeformableLayerImpl : public torch::nn::Module {
 public:
  explicit DeformableLayerImpl(const Config& c);
  /// x (B, S, d), pos (B, S, d), valid (B, S) bool true on real pixels, ref (B, S, L, 2).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& valid,
                     const at::Tensor& ref, const kernels::SpatialShapes& shapes) const;

  deformable_detr::MultiscaleDeformableAttention self_attn;
  layers::LayerNorm self_attn_layer_norm, final_layer_norm;
  layers::Linear fc1, fc2;
  layers::Activation act;
};

/// What every encoder layer reads besides the two streams.
struct EncoderInputs {
  at::Tensor vision_pos;        ///< (B, S, d) level position embeddings
  at::Tensor vision_valid;      ///< (B, S) bool, true on real pixels
  at::Tensor vision_padding;    ///< (B, S) bool, its negation
  at::Tensor reference_points;  ///< (B, S, L, 2)
  kernels::SpatialShapes shapes;
  at::Tensor text_padding;  ///< (B, T) bool, true on padded tokens
  at::Tensor text_bias;     ///< (B, 1, T, T) the phrase mask as an additive bias
  at::Tensor text_pos;      ///< (B, T, d) text position embeddings
};

class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const Config& c);
  /// vision (B, S, d), text (B, T, d) -> the updated (vision, text).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& vision, const at::Tensor& text,
                                            const EncoderInputs& in) const;

  std::shared_ptr<TextEnhancerLayerImpl> text_enhancer_layer;
  std::shared_ptr<FusionLayerImpl> fusion_layer;
  std::shared_ptr<DeformableLayerImpl> deformable_layer;
};

}  // namespace libreyolo::models::grounding_dino
