// nn.MaxPool2d (eval mode) through the model's bound `max_pool2d` slot
// (kernels/pool/max_pool2d.h): the stem pooling of the ResNet, ResNet-vd and HGNetV2 backbones
// and of DEIMv2's spatial tuning adapter. No parameters or buffers: nothing on disk.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>

#include "kernels/pool/max_pool2d.h"
#include "models/layers/bound_kernels.h"

namespace libreyolo::models::layers {

class MaxPool2dImpl : public torch::nn::Module, public UsesKernels {
 public:
  explicit MaxPool2dImpl(const kernels::PoolGeometry& geometry) : geometry(geometry) {}
  void bind_kernels(const BoundKernels& k) override { kernel = k.max_pool2d; }
  /// x (B, C, H, W) -> (B, C, H', W') (kernels::max_pool2d_output_size). Throws c10::Error for a
  /// non-4-D input or one smaller than a window.
  at::Tensor forward(const at::Tensor& x) const { return kernels::max_pool2d(kernel, x, geometry); }

  kernels::PoolGeometry geometry;
  kernels::MaxPool2dHandle kernel;  ///< empty until bound: the portable at::max_pool2d
};
using MaxPool2d = std::shared_ptr<MaxPool2dImpl>;

/// nn.MaxPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil) with square parameters.
inline kernels::PoolGeometry square_pool(int64_t k, int64_t s, int64_t p, bool ceil = false) {
  kernels::PoolGeometry g;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = s;
  g.pad_h = g.pad_w = p;
  g.ceil_mode = ceil;
  return g;
}

}  // namespace libreyolo::models::layers
