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
// Row orders (optional; "windowing without copies", issue 27): a windowed attention (Swin, the
// windowed DINOv2 of RF-DETR) reads the tokens in a window order (rolled, padded, partitioned)
// and its output returns to the image order; both permutations are row gathers within an image,
// done here in the pass that reads and writes the rows anyway instead of a copy kernel each.
// x is then (..., N, D): each leading index (an image) has N rows, and the indices are one
// image's (the same for every image, so they depend on the geometry alone):
//   norm_rows   (R) int64 in [-1, N): norm[..., j, :] is the LayerNorm of sum[..., norm_rows[j],
//               :], or zeros where norm_rows[j] is -1 (a padding position: the modules pad after
//               their LayerNorm); norm is then (..., R, D). With delta, every row of an image
//               must appear in norm_rows (a window partition's index does): the `cuda` kernel
//               computes a sum row only where a norm row reads it.
//   delta_rows  (N) int64 in [0, M): sum[..., i, :] = x[..., i, :] + delta[..., delta_rows[i], :]
//               * scale; delta is then (..., M, D), x's leading dims (rows in the window order).
// The portable path does the gathers with index_select (copies: the bytes of the unfused ops'
// pad / roll / partition / reverse / crop, which are copies too). Indices are not range-checked
// on the device: models/swin/windows.h window_rows builds them.
//
// Shapes and dtypes:
//   x       (..., D)  float32 / float16 / bfloat16
//   delta   x's shape and dtype, or undefined; with delta_rows (..., M, D) in x's dtype
//   scale   (D) in x's dtype (a layer scale, e.g. DINOv2's lambda1), or undefined (1)
//   weight  (D), bias (D): nn.LayerNorm's parameters, x's dtype
//   result  {sum, norm}, both x's shape and dtype (norm (..., R, D) with norm_rows); sum is x
//   itself
//           when delta is undefined
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// {sum, norm} as above.
using SumAndNorm = std::pair<at::Tensor, at::Tensor>;

/// The slot's declaration.
inline constexpr SlotDef<SumAndNorm(
    const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale, const at::Tensor& weight,
    const at::Tensor& bias, double eps, const at::Tensor& norm_rows, const at::Tensor& delta_rows)>
    kAddLayerNorm{"add_layer_norm"};
using AddLayerNormHandle = Handle<decltype(kAddLayerNorm)::Signature>;

/// The model-facing entry point: validates (c10::Error naming the tensor: x of no dimension,
/// delta of another shape, scale / weight / bias not (D), a row index not int64 (n) on x's
/// device, x of one dimension with an index, delta_rows without a delta (..., M, D) of x's
/// leading dims), calls `handle`, and runs add_layer_norm_portable when the handle is empty or
/// every candidate declined.
SumAndNorm add_layer_norm(const AddLayerNormHandle& handle, const at::Tensor& x,
                          const at::Tensor& delta, const at::Tensor& scale,
                          const at::Tensor& weight, const at::Tensor& bias, double eps,
                          const at::Tensor& norm_rows = {}, const at::Tensor& delta_rows = {});

/// x + delta * scale with ATen's ops (the product, then the sum, each rounded to the dtype: the
/// unfused modules' order); x + delta without scale; x itself without delta.
at::Tensor add_scaled(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale);

/// sum = add_scaled(x, delta, scale), then at::layer_norm(sum, {D}, weight, bias, eps): the
/// unfused modules' ops, bit for bit. With delta_rows, delta's rows are first gathered into x's
/// order (index_select); with norm_rows, the norm's rows are gathered into the window order
/// after the LayerNorm and the -1 rows zeroed (the modules' zero padding after their LayerNorm).
SumAndNorm add_layer_norm_portable(const at::Tensor& x, const at::Tensor& delta,
                                   const at::Tensor& scale, const at::Tensor& weight,
                                   const at::Tensor& bias, double eps,
                                   const at::Tensor& norm_rows = {},
                                   const at::Tensor& delta_rows = {});

}  // namespace libreyolo::kernels
