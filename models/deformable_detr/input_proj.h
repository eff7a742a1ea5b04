// The input projection of a multi-scale deformable encoder (transformers 5.17
// DeformableDetrModel.input_proj, GroundingDinoModel.input_proj_vision): per level
// nn.Sequential(Conv2d, GroupNorm(32, d_model)) with on-disk children "0" and "1".
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "models/layers/layers.h"

namespace libreyolo::models::deformable_detr {

class InputProjImpl : public torch::nn::Module {
 public:
  /// A backbone map's 1x1 projection (extra = false), or an extra level's 3x3 stride-2
  /// convolution of the level below (extra = true); `in` input channels, `d` = d_model (a
  /// multiple of 32).
  InputProjImpl(int64_t in, int64_t d, bool extra) {
    layers::Conv2dOptions o;
    o.in = in;
    o.out = d;
    o.kernel = extra ? 3 : 1;
    o.stride = extra ? 2 : 1;
    o.padding = extra ? 1 : 0;
    o.bias = true;
    conv = register_module("0", std::make_shared<layers::Conv2dImpl>(o));
    norm = register_module("1", std::make_shared<layers::GroupNormImpl>(32, d, 1e-5));
  }
  /// (B, in, h, w) -> (B, d, h', w').
  at::Tensor forward(const at::Tensor& x) const { return norm->forward(conv->forward(x)); }
  layers::Conv2d conv;
  layers::GroupNorm norm;
};

}  // namespace libreyolo::models::deformable_detr
