// The LW-DETR multi-scale projector (transformers 5.17 models/lw_detr/modeling_lw_detr.py:
// LwDetrMultiScaleProjector, LwDetrScaleProjector, LwDetrSamplingLayer, LwDetrC2FLayer,
// LwDetrRepVggBlock, LwDetrConvNormLayer, LwDetrLayerNorm), reused by RF-DETR (its C2F layer,
// models/rf_detr/modeling_rf_detr.py RfDetrC2FLayer, with channels-first LayerNorm ConvNorms:
// DetrConfig::conv_layer_norm). For each scale
// factor: every backbone map resampled (2.0: ConvTranspose2d 2x2 stride 2, after a 1x1
// ConvNorm + ReLU when the map has more than 512 channels; 0.5: 3x3 stride-2 ConvNorm + ReLU;
// 1.0: as is), concatenated, fused by a C2F block into d_model channels, channels-first
// LayerNorm (eps 1e-6). On-disk children: scale_layers.S.{sampling_layers.I.layers.K,
// projector_layer.{conv1, bottlenecks.N.{conv1, conv2}, conv2}, layer_norm}.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/layers/layers.h"
#include "models/lw_detr/config.h"

namespace libreyolo::models::lw_detr {

/// LwDetrConvNormLayer / RfDetrConvNormLayer: Conv2d(in, out, k, stride, padding k // 2, no
/// bias) -> norm -> act. The norm (child "norm") is BatchNorm2d(out, eps) (LW-DETR), or with
/// `layer_norm` a LayerNorm(out, eps) over the channels (RF-DETR's channels_first
/// RfDetrLayerNorm: permute to (B, H, W, C), layer_norm, permute back). Child "conv". A
/// layers::ConvNorm so that the batchnorm_fold layout folds LW-DETR's BatchNorm (the LayerNorm
/// variant has neither `norm` nor `frozen_norm`: not folded).
class ConvNormLayerImpl : public layers::ConvNormImpl {
 public:
  ConvNormLayerImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, double eps,
                    bool layer_norm, layers::Activation act);
  /// (B, in, H, W) -> (B, out, H / stride, W / stride) (odd kernel, padding k // 2).
  at::Tensor forward(const at::Tensor& x) const;
  layers::LayerNorm layer_norm;  ///< set when layer_norm (then ConvNormImpl::norm is null)
};
using ConvNormLayer = std::shared_ptr<ConvNormLayerImpl>;

/// Channels-first LayerNorm (LwDetrLayerNorm / RfDetrLayerNorm data_format "channels_first"):
/// (B, C, H, W) -> permute (B, H, W, C) -> norm -> permute back.
at::Tensor layer_norm_channels_first(const layers::LayerNormImpl& norm, const at::Tensor& x);

/// nn.ConvTranspose2d(in, out, kernel_size=2, stride=2) with bias: weight (in, out, 2, 2).
class ConvTranspose2x2Impl : public torch::nn::Module {
 public:
  ConvTranspose2x2Impl(int64_t in, int64_t out);
  /// (B, in, H, W) -> (B, out, 2H, 2W).
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
};

/// LwDetrC2FLayer: 1x1 ConvNorm to 2 * hidden channels, split in two, `num_blocks` RepVGG-named
/// blocks (two 3x3 ConvNorms each) chained on the second half, every intermediate concatenated
/// ((2 + num_blocks) * hidden channels), 1x1 ConvNorm to `out` channels. hidden =
/// int(out * hidden_expansion). Activation `act` after every ConvNorm; the ConvNorms' norm is
/// BatchNorm2d or channels-first LayerNorm (DetrConfig::conv_layer_norm), eps conv_norm_eps.
class C2FLayerImpl : public torch::nn::Module {
 public:
  C2FLayerImpl(const DetrConfig& c, int64_t in);
  /// (B, in, H, W) -> (B, d_model, H, W).
  at::Tensor forward(const at::Tensor& x) const;
  /// True when the `channels_last` layout converted the convolutions: the bottlenecks' 3x3
  /// weights tell (1x1 weights are contiguous in both formats); false without bottlenecks.
  /// The callers then hand their maps over channels_last, with no transposing copy.
  bool channels_last() const;
  ConvNormLayer conv1, conv2;
  std::vector<std::pair<ConvNormLayer, ConvNormLayer>> bottlenecks;
  int64_t hidden;
};

/// LwDetrScaleProjector for one scale factor over maps of `in_channels` channels each.
class ScaleProjectorImpl : public torch::nn::Module {
 public:
  ScaleProjectorImpl(const DetrConfig& c, const std::vector<int64_t>& in_channels, double scale);
  /// One map per in_channels entry, (B, C_i, H, W) -> (B, d_model, H * scale, W * scale).
  at::Tensor forward(const std::vector<at::Tensor>& maps) const;

  /// Per input map: its resampling steps (ConvNormLayer or ConvTranspose2x2), in order.
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> sampling;
  std::shared_ptr<C2FLayerImpl> projector_layer;
  layers::LayerNorm layer_norm;  ///< applied channels-first
};

/// LwDetrMultiScaleProjector: one ScaleProjector per projector_scale_factors entry.
class MultiScaleProjectorImpl : public torch::nn::Module {
 public:
  /// in_channels: the backbone maps' channels (LW-DETR: hidden_size per out_indices entry).
  MultiScaleProjectorImpl(const DetrConfig& c, const std::vector<int64_t>& in_channels);
  /// The backbone maps -> one (B, d_model, h_l, w_l) map per scale factor (the decoder levels).
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& maps) const;
  /// True when the convolutions are channels_last (the `channels_last` layout converted them):
  /// the backbone then hands its maps over in that format.
  bool channels_last() const;
  std::vector<std::shared_ptr<ScaleProjectorImpl>> scale_layers;
};

}  // namespace libreyolo::models::lw_detr
