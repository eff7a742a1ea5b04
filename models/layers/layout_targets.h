// What a layout (models/layouts/) rewrites in a family's module, as interfaces the module
// implements next to torch::nn::Module (as UsesKernels): the layouts know these and the layers'
// own classes (ConvNormImpl, AttentionImpl, Conv2dImpl), never a family's classes.
#pragma once

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

}  // namespace libreyolo::models::layers
