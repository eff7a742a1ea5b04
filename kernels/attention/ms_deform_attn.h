// Multi-scale deformable attention (Zhu et al., "Deformable DETR", ICLR 2021, eq. 3): the
// `ms_deform_attn` slot and its portable path.
//
// Shapes (DESIGN.md "Slots"):
//   value               (B, S, H, C)  float32/float16/bfloat16, S = sum_l H_l * W_l
//   spatial_shapes      (L, 2) int64  (H_l, W_l), same device as value
//   level_start_index   (L)    int64  exclusive prefix sum of H_l * W_l
//   sampling_locations  (B, Q, H, L, P, 2)  x, y normalised to [0, 1]
//   attention_weights   (B, Q, H, L, P)     already softmax-ed over L*P by the caller
//   output              (B, Q, H * C)       value dtype, channel index = h * C + c
// Sampling is bilinear with zeros outside the map; pixel coordinate = loc * size - 0.5
// (grid_sample with align_corners=False and grid = 2 * loc - 1, as in
// fundamentalvision/Deformable-DETR models/ops/functions/ms_deform_attn_func.py).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/registry.h"
#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The slot's declaration: (value, spatial_shapes, level_start_index, sampling_locations,
/// attention_weights) -> output, shapes above.
inline constexpr SlotDef<at::Tensor(
    const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
    const at::Tensor& sampling_locations, const at::Tensor& attention_weights)>
    kMsDeformAttn{"ms_deform_attn"};
/// What an implementation is; what a model holds.
using MsDeformAttnImpl = decltype(kMsDeformAttn)::Fn;
using MsDeformAttnHandle = Handle<decltype(kMsDeformAttn)::Signature>;

/// Schemas of the ms_deform_attn ops a kernels-hub build provides (without the `<id>::`
/// namespace), as c10::FunctionSchema prints them (kernels-community/deformable-detr
/// torch_binding.cpp); the hub binding (ms_deform_attn_hub.cpp) requires the forward.
inline constexpr const char* kMsDeformAttnForwardSchema =
    "ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
    "Tensor sampling_loc, Tensor attn_weight, int im2col_step) -> Tensor";
inline constexpr const char* kMsDeformAttnBackwardSchema =
    "ms_deform_attn_backward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
    "Tensor sampling_loc, Tensor attn_weight, Tensor grad_output, int im2col_step) -> Tensor[]";

/// Host-side level sizes (H_l, W_l), the form the models hold them in.
using SpatialShapes = std::vector<std::array<int64_t, 2>>;

/// (L, 2) int64 tensor of `shapes` on `device`. Cached per (shapes, device): repeated calls return
/// the same tensor (no allocation, no host-to-device copy), so callers must not modify it.
/// Throws c10::Error when `shapes` is empty or a size is not positive.
at::Tensor spatial_shapes_tensor(const SpatialShapes& shapes, const at::Device& device);

/// (L) int64 exclusive prefix sum of H_l * W_l, e.g. {(4,6),(2,3)} -> [0, 24]. Cached like
/// spatial_shapes_tensor (do not modify); same errors.
at::Tensor level_start_index(const SpatialShapes& shapes, const at::Device& device);

/// The slot entry point: calls the model's bound `handle` (its candidates in order) and runs
/// the portable path when the handle is empty or every candidate declined or failed.
/// Inputs are validated before any implementation sees them. Differentiable (the portable path
/// through ATen autograd; an implementation must bring its own backward). Throws c10::Error on
/// shapes, dtypes or devices that do not match the contract above (message naming the tensor and
/// the expected shape), and when an implementation returns a tensor that is not (B, Q, H * C).
at::Tensor ms_deform_attn(const MsDeformAttnHandle& handle, const at::Tensor& value,
                          const SpatialShapes& shapes, const at::Tensor& sampling_locations,
                          const at::Tensor& attention_weights);

/// The portable path alone (grid_sample math, at::grid_sampler bilinear / zeros /
/// align_corners=false on grid = 2 * loc - 1), never the slot. Same contract. Differentiable
/// through ATen autograd (grid_sampler_2d_backward) for value, locations and weights.
/// Dtypes: locations and weights are cast to value's dtype first (grid_sample needs one dtype),
/// so a float16/bfloat16 value computes coordinates and the weighted sum in that dtype (coarser
/// than the CUDA kernels, which accumulate in float32); on the CPU its bilinear interpolation
/// runs in float32 (LibTorch 2.11's 16-bit CPU grid_sampler is wrong, ms_deform_attn.cpp
/// grid_sample_bilinear); float64 is accepted.
at::Tensor ms_deform_attn_portable(const at::Tensor& value, const SpatialShapes& shapes,
                                   const at::Tensor& sampling_locations,
                                   const at::Tensor& attention_weights);

/// RT-DETRv2 sampling method (transformers RTDetrV2MultiscaleDeformableAttention
/// `decoder_method`: "default" = bilinear, "discrete").
enum class SamplingMethod {
  /// grid_sample, bilinear, zeros outside (the classic op).
  bilinear,
  /// lyuwenyu/RT-DETR rtdetrv2_pytorch: coord = int64(loc * (W_l, H_l) + 0.5) (truncation
  /// toward zero), then BOTH x and y clamped to [0, H_l - 1] (upstream quirk, "FIX ME? for
  /// rectangle input"), nearest gather, no zero padding. Where upstream would index past the row
  /// (H_l > W_l and x > W_l - 1: an IndexError upstream) x is clamped to W_l - 1 instead.
  discrete,
  /// transformers >= its RT-DETRv2 port (modeling_rt_detr_v2.py, checked in 5.17): as `discrete`
  /// but x clamped to [0, W_l - 1] and y to [0, H_l - 1]. Identical to `discrete` when H_l == W_l.
  discrete_per_axis,
};

/// RT-DETRv2's flat-points layout: value (B, S, H, C); sampling_locations (B, Q, H, sum(P_l), 2);
/// attention_weights (B, Q, H, sum(P_l)); `num_points[l]` = P_l >= 1, one entry per level.
/// Output (B, Q, H * C) in value's dtype.
/// `bilinear` reaches the slot (ms_deform_attn through `handle`) in the classic layout: reshaped
/// when every P_l is equal, and on CUDA (or the CPU with `handle` bound) also for ragged P_l, each
/// level padded to max P_l with weight-0 samples (exact zeros). `discrete*`, and ragged P_l on an
/// unbound CPU handle, stay portable (per-level split, as multi_scale_deformable_attention_v2).
/// Discrete sampling has no gradient to the locations (integer coordinates); value and weights get
/// theirs through ATen autograd. Throws c10::Error naming the tensor on shapes that do not match.
at::Tensor ms_deform_attn_v2(const MsDeformAttnHandle& handle, const at::Tensor& value,
                             const SpatialShapes& shapes, const at::Tensor& sampling_locations,
                             const at::Tensor& attention_weights,
                             const std::vector<int64_t>& num_points, SamplingMethod method);

}  // namespace libreyolo::kernels
