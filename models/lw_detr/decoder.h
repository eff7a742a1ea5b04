// The LW-DETR decoder (transformers 5.17 models/lw_detr/modeling_lw_detr.py: LwDetrDecoder,
// LwDetrDecoderLayer, LwDetrAttention, LwDetrMLP, encode_sinusoidal_position_embedding),
// reused by RF-DETR. Post-norm layers: self-attention (q = k = x + pos, v = x; group DETR
// splits the queries only in training, so inference attends over all of them), multi-scale
// deformable cross-attention (deformable_detr::MultiscaleDeformableAttentionImpl, i.e. the
// model's `ms_deform_attn` kernel handle) with 4-d (cx, cy, w, h) reference points, MLP with
// its residual. The reference points are the same for every layer (no iterative refinement);
// the query position comes from them once (ref_point_head of their sine embedding).
// On-disk children: layers.N.{self_attn.{q,k,v,o}_proj, self_attn_layer_norm,
// cross_attn.{sampling_offsets, attention_weights, value_proj, output_proj},
// cross_attn_layer_norm, mlp.{fc1, fc2}, layer_norm}, layernorm, ref_point_head.layers.{0,1}.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "models/deformable_detr/ms_deform_attention.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/lw_detr/config.h"
#include "models/runtime/constant_cache.h"

namespace libreyolo::models::lw_detr {

/// encode_sinusoidal_position_embedding(pos, num_pos_feats, temperature 10000): each of the
/// n coordinates of pos (..., n) in [0, 1] becomes num_pos_feats values, interleaved
/// sin (even) / cos (odd) of coord * 2pi / 10000^(2 floor(i/2) / num_pos_feats) (float32 math),
/// the first two coordinates swapped (y before x), concatenated: (..., n * num_pos_feats) in
/// pos's dtype.
at::Tensor sinusoidal_position_embedding(const at::Tensor& pos, int64_t num_pos_feats);

/// The frequencies of sinusoidal_position_embedding: 10000^(2 floor(i/2) / num_pos_feats) for
/// i < num_pos_feats, (num_pos_feats) float32 on `device` (upstream's dim_t).
at::Tensor sine_frequencies(int64_t num_pos_feats, const at::Device& device);

/// sinusoidal_position_embedding with its frequencies given (`dim_t` from sine_frequencies, an
/// even count): the same values from five kernels for every coordinate together, where
/// upstream's loop over the coordinates launches about six per coordinate. Throws c10::Error
/// for an odd count (upstream's stack of the sin and cos halves fails there too).
at::Tensor sinusoidal_position_embedding(const at::Tensor& pos, const at::Tensor& dim_t);

/// One LwDetrDecoderLayer.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const DetrConfig& c);
  /// x (B, Q, D), query_pos (B, Q, D), ref (B, Q, L, 4) per-level reference boxes, memory
  /// (B, S, D) with memory_mask (B, S) bool (true = valid) or undefined. Returns (B, Q, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& ref,
                     const at::Tensor& memory, const at::Tensor& memory_mask,
                     const kernels::SpatialShapes& shapes) const;

  layers::Attention self_attn;
  deformable_detr::MultiscaleDeformableAttention cross_attn;
  layers::LayerNorm self_attn_layer_norm, cross_attn_layer_norm, layer_norm;
  layers::Linear fc1, fc2;
  layers::Activation act;
};

class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const DetrConfig& c);
  /// target (B, Q, D) the query features, reference_points (B, Q, 4) (cx, cy, w, h)
  /// normalised, valid_ratios (B, L, 2) (w, h), memory (B, S, D), memory_mask (B, S) bool.
  /// valid_ratios and memory_mask undefined: an input without padding (every ratio 1, every
  /// token valid), the same result from fewer kernels. Returns the last layer's output after
  /// the final layernorm, (B, Q, D).
  at::Tensor forward(const at::Tensor& target, const at::Tensor& reference_points,
                     const at::Tensor& valid_ratios, const at::Tensor& memory,
                     const at::Tensor& memory_mask, const kernels::SpatialShapes& shapes) const;

  std::vector<std::shared_ptr<DecoderLayerImpl>> layers_;
  layers::LayerNorm layernorm;
  layers::MLP ref_point_head;  ///< 2 * d_model -> d_model -> d_model, ReLU between
  int64_t d_model;

 private:
  ConstantCache frequencies_;  ///< sine_frequencies(d_model / 2) per device
};

}  // namespace libreyolo::models::lw_detr
