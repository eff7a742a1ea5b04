// One Grounding DINO decoder layer (transformers 5.17 GroundingDinoDecoderLayer): query
// self-attention, cross-attention to the text tokens (encoder_attn_text), multi-scale deformable
// cross-attention to the image tokens (encoder_attn), FFN; post-norm.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "kernels/attention/ms_deform_attn.h"
#include "models/deformable_detr/ms_deform_attention.h"
#include "models/grounding_dino/config.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models::grounding_dino {

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c);
  /// x (B, Q, d) queries, query_pos (B, Q, d), ref (B, Q, L, 4) reference boxes per level,
  /// memory (B, S, d) with memory_valid (B, S) bool (true on real pixels), text (B, T, d) with
  /// text_bias (B, 1, 1, T) additive (the dtype's lowest value on padded tokens). Returns (B, Q,
  /// d).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& ref,
                     const at::Tensor& memory, const at::Tensor& memory_valid,
                     const kernels::SpatialShapes& shapes, const at::Tensor& text,
                     const at::Tensor& text_bias) const;

  layers::Attention self_attn, encoder_attn_text;
  deformable_detr::MultiscaleDeformableAttention encoder_attn;
  layers::LayerNorm self_attn_layer_norm, encoder_attn_text_layer_norm, encoder_attn_layer_norm,
      final_layer_norm;
  layers::Linear fc1, fc2;
  layers::Activation act;
};

/// GroundingDinoMultiheadAttention: the shared attention module under the on-disk names
/// query / key / value / out_proj (scores scaled by head_dim^-0.5, additive bias).
layers::Attention multihead_attention(int64_t d, int64_t heads);

}  // namespace libreyolo::models::grounding_dino
