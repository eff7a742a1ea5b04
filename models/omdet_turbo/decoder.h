// OmDetTurboDecoder (transformers 5.17 models/omdet_turbo/modeling_omdet_turbo.py), inference
// only: the vision features' channel projections, the task encoder, the query selection by
// class similarity and the deformable decoder whose self-attention also attends over the task
// tokens. Internal to models/omdet_turbo/.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <utility>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/omdet_turbo/config.h"
#include "models/rtdetr/modules.h"

namespace libreyolo::models::omdet_turbo {

/// get_class_similarity: features (B, S, D) against the projected classes (B, D, C) -> (B, S, C)
/// in the features' dtype: cosine (each side L2-normalised, clamped at 1e-12, times
/// exp(log(1 / 0.07)) computed in float32 as upstream) or the plain dot product.
at::Tensor class_similarity(bool cosine, const at::Tensor& features, const at::Tensor& classes);

/// OmDetTurboDeformableTransformerDecoderLayer: self_attn (query/key/value/out_proj) over the
/// queries and the task tokens, norm1; cross_attn (deformable, RT-DETR's module), norm2;
/// linear1/linear2 feed-forward, norm3.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c);
  /// h (B, Q, D), task (B, T, D), query_pos (B, Q, D), reference (B, Q, 4) sigmoid boxes,
  /// vision (B, S, D), bias (B, 1, Q + T, Q + T) additive (the task's padding keys at the
  /// dtype's lowest) -> (h, task), same shapes.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& h, const at::Tensor& task,
                                            const at::Tensor& query_pos,
                                            const at::Tensor& reference, const at::Tensor& vision,
                                            const kernels::SpatialShapes& shapes,
                                            const at::Tensor& bias) const;

 private:
  layers::Attention self_attn_;
  std::shared_ptr<rtdetr::MSDeformAttnImpl> cross_attn_;
  layers::LayerNorm norm1_, norm2_, norm3_;
  layers::Linear linear1_, linear2_;
  layers::Activation act_;
};

/// The decoder module ("decoder.*" on disk).
class DecoderImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  explicit DecoderImpl(const Config& c);
  /// Takes the `refine_boxes` handle the model was bound to (the per-layer box refinement).
  void bind_kernels(const layers::BoundKernels& k) override {
    refine_boxes_kernel_ = k.refine_boxes;
  }
  /// pan: the hybrid encoder's maps (B, E, H_l, W_l); classes (C, B, class_embed_dim) (padding
  /// classes zero, as upstream regroups them); task (T, B, class_embed_dim) the text encoder's
  /// hidden states of the task; task_mask (B, T) (nonzero = token). Returns (class logits
  /// (B, Q, C), boxes (B, Q, 4) sigmoid cxcywh) of the last layer, in the parameters' dtype.
  /// Throws std::invalid_argument when the maps have fewer positions than num_queries.
  std::pair<at::Tensor, at::Tensor> forward(const std::vector<at::Tensor>& pan,
                                            const at::Tensor& classes, const at::Tensor& task,
                                            const at::Tensor& task_mask) const;

 private:
  Config config_;
  std::vector<layers::ConvNorm> channel_projection_layers_;
  layers::Linear task_mlp1_, task_mlp2_, task_project_, encoder_vision_linear_, encoder_class_head_;
  layers::LayerNorm task_norm_, encoder_vision_norm_;
  std::vector<std::shared_ptr<DecoderLayerImpl>> layers_;
  at::Tensor tgt_embed_;
  layers::MLP query_position_head_, encoder_bbox_head_;
  std::vector<layers::Linear> decoder_class_head_;
  std::vector<layers::MLP> decoder_bbox_head_;
  kernels::RefineBoxesHandle refine_boxes_kernel_;
};

}  // namespace libreyolo::models::omdet_turbo
