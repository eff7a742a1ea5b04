// Derived (never stored) tensors of Deformable DETR: sine position embeddings, valid ratios,
// encoder reference points, two-stage proposals and their position embedding. Formulas and
// operation order from transformers 5.17 models/deformable_detr/modeling_deformable_detr.py
// (DeformableDetrSinePositionEmbedding, DeformableDetrModel.get_valid_ratio,
// DeformableDetrEncoder.get_reference_points, gen_encoder_output_proposals,
// get_proposal_pos_embed), so that float32 results match it bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "kernels/attention/ms_deform_attn.h"

namespace libreyolo::models::deformable_detr {

/// DETR sine embedding (normalize=True, scale=2*pi, temperature 10000) of a mask (B, h, w) bool
/// (true = valid) -> (B, 2 * num_features, h, w) in `dtype`: channels [pos_y, pos_x], each
/// interleaving sin (even) / cos (odd) of cumsum(mask) - offset over (last cumsum + 1e-6) * 2*pi
/// divided by 10000^(2*floor(i/2)/num_features). offset 0.5: Deformable DETR's
/// DeformableDetrSinePositionEmbedding; 0: DETR's DetrSinePositionEmbedding (models/detr/, no
/// subtraction at all, as upstream). temperature 20 (config positional_embedding_temperature):
/// Grounding DINO's GroundingDinoSinePositionEmbedding (offset 0).
at::Tensor sine_position_embedding(const at::Tensor& mask, int64_t num_features,
                                   at::ScalarType dtype, double offset = 0.5,
                                   double temperature = 10000);

/// (B, 2) float (valid_w / w, valid_h / h) of one level's mask (B, h, w), valid counts taken on
/// the first row / column.
at::Tensor valid_ratio(const at::Tensor& mask, at::ScalarType dtype);

/// Encoder reference points (B, S, L, 2): per level the pixel centres (x+0.5, y+0.5) divided by
/// (valid_ratio * size), then multiplied by every level's valid ratio. valid_ratios (B, L, 2).
at::Tensor encoder_reference_points(const kernels::SpatialShapes& shapes,
                                    const at::Tensor& valid_ratios);

/// Two-stage proposals. memory (B, S, D), padding_mask (B, S) bool (true = padded).
/// Returns (masked memory, proposals): memory with padded/invalid tokens set to 0, and
/// proposals (B, S, 4) = inverse sigmoid of ((x+0.5)/valid_w, (y+0.5)/valid_h, 0.05*2^l,
/// 0.05*2^l), +inf where padded or outside (0.01, 0.99).
std::pair<at::Tensor, at::Tensor> encoder_output_proposals(const at::Tensor& memory,
                                                           const at::Tensor& padding_mask,
                                                           const kernels::SpatialShapes& shapes);

/// get_proposal_pos_embed: proposals (B, K, 4) logits -> (B, K, 4 * num_features) sine
/// embedding of sigmoid(p) * 2*pi (float32 math, result in the proposals' dtype).
at::Tensor proposal_position_embedding(const at::Tensor& proposals, int64_t num_features);

/// encode_sinusoidal_position_embedding (transformers 5.17 modeling_conditional_detr.py, copied
/// into modeling_dab_detr.py): anchors (..., n) in [0, 1] (Conditional DETR's (x, y) reference
/// points, DAB-DETR's (x, y, w, h) anchor boxes) -> (..., n * num_features): each coordinate
/// times 2*pi over 10000^(2*floor(i/2)/num_features) (float32), sin / cos interleaved, the x
/// and y parts swapped ([y, x, w, h]), in the anchors' dtype.
at::Tensor anchor_position_embedding(const at::Tensor& anchors, int64_t num_features);

}  // namespace libreyolo::models::deformable_detr
