// LW-DETR's two-stage query selection (transformers 5.17 models/lw_detr/modeling_lw_detr.py:
// LwDetrModel.gen_encoder_output_proposals, refine_bboxes and the group loop of
// LwDetrModel.forward), reused by RF-DETR. Every token of the projected multi-scale map is a
// proposal; the num_queries best (by their best class logit) become the decoder's reference
// boxes, refined by the learned reference_point_embed. At inference only group 0 is used
// (group DETR: the other groups' heads and queries are trained, stored and unused).
// On-disk children (under "model."): enc_output.G, enc_output_norm.G, enc_out_class_embed.G,
// enc_out_bbox_embed.G (G < group_detr), query_feat, reference_point_embed.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "models/layers/layers.h"
#include "models/lw_detr/config.h"
#include "models/runtime/constant_cache.h"

namespace libreyolo::models::lw_detr {

/// refine_bboxes: (cx, cy) = deltas_xy * ref_wh + ref_xy, (w, h) = exp(deltas_wh) * ref_wh.
/// reference (..., 4), deltas (..., 4) broadcastable; returns (..., 4).
at::Tensor refine_boxes(const at::Tensor& reference, const at::Tensor& deltas);

/// gen_encoder_output_proposals. memory (B, S, D), padding_mask (B, S) bool (true = padded).
/// Returns {object_query (B, S, D) (memory, 0 at invalid tokens), proposals (B, S, 4) = ((x+0.5)
/// / valid_w, (y+0.5) / valid_h, 0.05 * 2^l, 0.05 * 2^l) with 0 at invalid tokens, invalid
/// (B, S, 1) bool: padded, or a proposal coordinate outside (0.01, 0.99)}.
struct Proposals {
  at::Tensor object_query, proposals, invalid;
};
Proposals encoder_output_proposals(const at::Tensor& memory, const at::Tensor& padding_mask,
                                   const kernels::SpatialShapes& shapes);

/// The two-stage heads and the learned queries.
class QuerySelection {
 public:
  /// Registers its children on `model` (the "model." module) with the on-disk names.
  QuerySelection(torch::nn::Module& model, const DetrConfig& c);

  struct Queries {
    at::Tensor target;            ///< (B, num_queries, D): query_feat of group 0
    at::Tensor reference_points;  ///< (B, num_queries, 4) (cx, cy, w, h)
  };
  /// memory (B, S, D) the flattened projector maps, memory_mask (B, S) bool (true = valid), or
  /// undefined for an input without padding (the same result; the proposals are then kept per
  /// geometry instead of being rebuilt from the mask by some 25 small kernels). Throws
  /// std::invalid_argument "<model_type>: num_queries = Q exceeds the S projector tokens of the
  /// input" when S < num_queries (torch.topk would fail).
  Queries forward(const at::Tensor& memory, const at::Tensor& memory_mask,
                  const kernels::SpatialShapes& shapes) const;

  std::vector<layers::Linear> enc_output, enc_out_class_embed;
  std::vector<layers::LayerNorm> enc_output_norm;
  std::vector<layers::MLP> enc_out_bbox_embed;
  /// (num_queries * group_detr, D) and (num_queries * group_detr, 4); rows [0, num_queries)
  /// are group 0.
  at::Tensor query_feat, reference_point_embed;
  int64_t num_queries;
  std::string model_type;  ///< DetrConfig::model_type (error messages)

 private:
  /// The unpadded proposals (1, S, 4) and their validity (1, S, 1) per geometry and dtype (two
  /// caches: each keeps as many geometries).
  ConstantCache proposals_, invalid_;
};

}  // namespace libreyolo::models::lw_detr
