// The RF-DETR instance segmentation head (transformers 5.17 models/rf_detr/modeling_rf_detr.py:
// RfDetrForInstanceSegmentation.segmentation_head / get_mask_logits, RfDetrSegmentationBlock,
// RfDetrSegmentationMLPBlock, RfDetrSegmentationMLP), at inference: the projector's map is
// bilinearly resized to the input's (H / mask_downsample_ratio, W / mask_downsample_ratio),
// refined by one ConvNeXt-style block per decoder layer, projected (1x1 conv); the last decoder
// layer's queries (its layer-normed output, the detector's last hidden state) go through a
// residual MLP and a projection; mask logits = queries . spatial features + segmentation_bias.
// Only the last layer's masks are computed (pred_masks; the earlier layers' masks and the
// encoder's masks feed upstream's losses only).
// Children registered on the caller's module (the model root, on-disk names): blocks.N.
// {depthwise_conv, layernorm, pointwise_conv}, spatial_features_proj, query_features_block.
// {norm, mlp.{fc1, fc2}}, query_features_proj, segmentation_bias.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/layers/layers.h"
#include "models/rf_detr/config.h"

namespace libreyolo::models::rf_detr {

/// RfDetrSegmentationBlock: x + permute(act(pointwise(LayerNorm_eps1e-6(permute(
/// depthwise_conv3x3(x)))))). (B, D, h, w) -> same.
class SegmentationBlockImpl : public torch::nn::Module {
 public:
  SegmentationBlockImpl(int64_t d_model, layers::Activation act);
  at::Tensor forward(const at::Tensor& x) const;
  layers::Conv2d depthwise_conv;
  layers::LayerNorm layernorm;
  layers::Linear pointwise_conv;
  layers::Activation act;
};

class SegmentationHead {
 public:
  /// Registers its children on `root` with the on-disk names.
  SegmentationHead(torch::nn::Module& root, const Config& c);
  /// features (B, D, h, w) the projector's map, queries (B, Q, D) the decoder's last hidden
  /// state, (height, width) the model input's size. Returns mask logits (B, Q, height / r,
  /// width / r), r = mask_downsample_ratio, in the features' dtype.
  at::Tensor forward(const at::Tensor& features, const at::Tensor& queries, int64_t height,
                     int64_t width) const;

  std::vector<std::shared_ptr<SegmentationBlockImpl>> blocks;
  layers::Conv2d spatial_features_proj;
  layers::LayerNorm query_norm;
  layers::Linear query_fc1, query_fc2, query_features_proj;
  at::Tensor segmentation_bias;  ///< (1)
  layers::Activation act;
  int64_t downsample_ratio;
};

}  // namespace libreyolo::models::rf_detr
