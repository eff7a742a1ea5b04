// Hugging Face ResNet backbone (transformers 5.17 models/resnet/modeling_resnet.py,
// ResNetBackbone) with every BatchNorm frozen (DeformableDetrFrozenBatchNorm2d), as used by
// Deformable DETR with `backbone_config.model_type == "resnet"`. Classic ResNet (He et al.,
// CVPR 2016): 7x7/2 stem + 3x3/2 max-pool, stride on the 3x3 of the bottleneck (or on the first
// 1x1 with downsample_in_bottleneck), 1x1 strided projection shortcut. Not the ResNet-vd of
// RT-DETR. Module names: embedder.embedder.{convolution,normalization},
// encoder.stages.{s}.layers.{l}.{layer.{k},shortcut}.{convolution,normalization}.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/layers/layers.h"
#include "models/layers/max_pool.h"

namespace libreyolo::models::deformable_detr {

/// transformers ResNetConfig fields the backbone uses.
struct ResNetConfig {
  int64_t num_channels = 3, embedding_size = 64;
  std::vector<int64_t> hidden_sizes{256, 512, 1024, 2048}, depths{3, 4, 6, 3};
  std::string layer_type = "bottleneck";  ///< "bottleneck" | "basic"
  layers::Activation act = layers::Activation::relu;
  bool downsample_in_first_stage = false, downsample_in_bottleneck = false;
  /// Indices into (stem, stage1, ..., stage4) of the returned maps (Deformable DETR: [2, 3, 4]).
  std::vector<int64_t> out_indices{2, 3, 4};
};

/// Reads `backbone_config` (a ConfigView on it). `default_out_indices` applies when the config
/// has neither out_indices nor out_features. Throws core::ConfigError naming the field.
ResNetConfig parse_resnet_config(const core::ConfigView& v,
                                 const std::vector<int64_t>& default_out_indices);

/// One residual layer (ResNetBottleNeckLayer or ResNetBasicLayer): relu(layer(x) + shortcut(x)).
class ResNetLayerImpl : public torch::nn::Module {
 public:
  ResNetLayerImpl(const ResNetConfig& c, int64_t in, int64_t out, int64_t stride);
  at::Tensor forward(const at::Tensor& x) const;
  std::vector<layers::ConvNorm> layer;
  layers::ConvNorm shortcut;  ///< null = identity
  layers::Activation act;
};

/// ResNetBackbone: forward returns the feature maps at `out_indices`, each (B, C_i, H_i, W_i).
class ResNetBackboneImpl : public torch::nn::Module {
 public:
  explicit ResNetBackboneImpl(const ResNetConfig& c);
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;
  /// Channels of each returned map.
  std::vector<int64_t> channels() const;

  ResNetConfig config;
  layers::ConvNorm stem;
  layers::MaxPool2d pooler;  ///< ResNetEmbeddings.pooler: 3x3, stride 2, padding 1
  std::vector<std::vector<std::shared_ptr<ResNetLayerImpl>>> stages;
};

}  // namespace libreyolo::models::deformable_detr
