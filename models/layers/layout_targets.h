// What a layout (models/layouts/) rewrites in a family's module, as interfaces the module
// implements next to torch::nn::Module (as UsesKernels): the layouts know these and the layers'
// own classes (ConvNormImpl, AttentionImpl, Conv2dImpl), never a family's classes.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "models/layers/layers.h"

namespace libreyolo::models::layers {

/// A RepVGG block: act(conv1(x) + conv2(x)) with conv1 a 3x3 (padding 1) and conv2 a 1x1
/// conv-norm branch, registered as children "conv1" and "conv2", no identity branch
/// (RTDetrRepVggBlock and its heirs). The repvgg layout merges both into conv1 (lyuwenyu/RT-DETR
/// RepVggBlock.convert_to_deploy): conv1 then holds the merged kernel with `act`, conv2 is
/// unregistered and null, `reparameterized` is set and forward() must call conv1 alone.
class RepVggBranches {
 public:
  virtual ~RepVggBranches() = default;
  ConvNorm conv1, conv2;
  Activation act = Activation::none;
  bool reparameterized = false;
};

/// A residual layer whose shortcut may be AvgPool2d(2, 2, ceil_mode=True) then a 1x1 conv-norm
/// (ResNet-vd), the pool at "<layer>.shortcut.0". The avgpool_fold layout gives that conv-norm a
/// `pooled` 2x2 stride-2 convolution (layers::ConvNormImpl::forward_pooled).
class PooledShortcut {
 public:
  virtual ~PooledShortcut() = default;
  /// The 1x1 projection behind the pool, or null when this layer's shortcut is not pooled.
  virtual ConvNorm pooled_shortcut() const = 0;
};

/// Convolutions whose frozen norm is registered beside them instead of inside a ConvNorm:
/// timm's ResNet (timm/models/resnet.py), conv1 + bn1 in the stem and in every BasicBlock /
/// Bottleneck, downsample.0 + downsample.1. The batchnorm_fold layout folds each pair as it folds a
/// ConvNorm (the conv takes the folded weight and a bias; the norm is unregistered from `owner`
/// and nulled) and sets `folded`: from then on the module must run its convolutions through
/// conv2d_bias_act (`conv_kernel`, bound at load like a ConvNorm's).
class SiblingConvNorms : public UsesKernels {
 public:
  /// One convolution and the norm after it; `owner` is the module both are registered in.
  struct Pair {
    Conv2d* conv;
    FrozenBatchNorm2d* norm;
    torch::nn::Module* owner;
  };
  /// This module's own pairs (not its children's), in forward order.
  virtual std::vector<Pair> conv_norm_pairs() = 0;
  /// The upstream class this module is (timm: "ResNet", "Bottleneck", "BasicBlock"): of the
  /// classes the family's layout rule lists for its path, the one it is reported and matched as.
  virtual std::string upstream_class() const = 0;
  void bind_kernels(const BoundKernels& k) override { conv_kernel = k.conv2d_bias_act; }
  bool folded = false;
  kernels::Conv2dBiasActHandle conv_kernel;
};

}  // namespace libreyolo::models::layers
