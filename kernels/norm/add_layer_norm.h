// The `add_layer_norm` slot: the residual step of a pre-norm transformer block and the LayerNorm
// that follows it, in one pass:
//   sum  = x + delta * scale        (each product and sum rounded to the input dtype, as the
//                                    unfused `delta * scale` then `x + ...` round)
//   norm = layer_norm(sum, weight, bias, eps) over the last dimension (nn.LayerNorm)
// delta and scale are optional: without delta, sum is x and the slot is a plain LayerNorm.
// The ViT backbones (RF-DETR's DINOv2, LW-DETR's ViT, DEIMv2's DINOv3) call it for every
// layer-scaled residual add followed by a LayerNorm, and every layers::LayerNorm calls it for its
// plain LayerNorm.
//
// Implementations: the portable path (below: ATen's mul, add, layer_norm, one after another),
// and `cuda` (kernels/norm/cuda/add_layer_norm_cuda.h): one warp per row, the row held in
// registers, so x and delta are read once and sum and norm written once (the portable path reads
// and writes each intermediate again, and ATen's LayerNorm kernel reaches well under half the
// H200's bandwidth at ViT widths; docs/BENCHMARKS.md).
//
// Shapes and dtypes:
//   x       (..., D)  float32 / float16 / bfloat16
//   delta   x's shape and dtype, or undefined
//   scale   (D) in x's dtype (a layer scale, e.g. DINOv2's lambda1), or undefined (1)
//   weight  (D), bias (D): nn.LayerNorm's parameters, x's dtype
//   result  {sum, norm}, both x's shape and dtype; sum is x itself when delta is undefined
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// {sum, norm} as above.
using SumAndNorm = std::pair<at::Tensor, at::Tensor>;

/// The slot's declaration.
inline constexpr SlotDef<SumAndNorm(const at::Tensor& x, const at::Tensor& delta,
                                    const at::Tensor& scale, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps)>
    kAddLayerNorm{"add_layer_norm"};
using AddLayerNormHandle = Handle<decltype(kAddLayerNorm)::Signature>;

/// The model-facing entry point: validates (c10::Error naming the tensor: x of no dimension,
/// delta of another shape, scale / weight / bias not (D)), calls `handle`, and runs
/// add_layer_norm_portable when the handle is empty or every candidate declined.
SumAndNorm add_layer_norm(const AddLayerNormHandle& handle, const at::Tensor& x,
                          const at::Tensor& delta, const at::Tensor& scale,
                          const at::Tensor& weight, const at::Tensor& bias, double eps);

/// x + delta * scale with ATen's ops (the product, then the sum, each rounded to the dtype: the
/// unfused modules' order); x + delta without scale; x itself without delta.
at::Tensor add_scaled(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale);

/// sum = add_scaled(x, delta, scale), then at::layer_norm(sum, {D}, weight, bias, eps): the
/// unfused modules' ops, bit for bit.
SumAndNorm add_layer_norm_portable(const at::Tensor& x, const at::Tensor& delta,
                                   const at::Tensor& scale, const at::Tensor& weight,
                                   const at::Tensor& bias, double eps);

}  // namespace libreyolo::kernels
