// The `refine_boxes` slot: one step of iterative box refinement, the reference boxes moved by a
// predicted delta in logit space, as RT-DETR (modeling_rt_detr.py RTDetrDecoder), D-FINE's first
// layer (modeling_d_fine.py DFineDecoder), DAB-DETR, PP-DocLayoutV3 and OmDet-Turbo write it:
//   refined = sigmoid(delta + inverse_sigmoid(reference))
//   inverse_sigmoid(x) = log(max(c, eps) / max(1 - c, eps)),  c = clamp(x, 0, 1)
// (modeling_rt_detr.py inverse_sigmoid). Upstream, nine elementwise ops on a (B, Q, 4) tensor
// (clamp, clamp_min, fill and sub for `1 - c`, clamp_min, div, log, add, sigmoid): nine kernel
// launches per decoder layer for 1,200 values at batch 1, where a forward is launch-bound.
//
// Implementations: the portable path (the ATen expression) and `cuda`
// (kernels/box/cuda/refine_boxes_cuda.h: one thread per value). Both give the ATen expression's
// values bit for bit on their device: one rounding to the dtype per op, in upstream's order
// (ATen computes 16-bit ops in float32).
#pragma once

#include <ATen/ATen.h>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The slot's declaration: (delta, reference, eps) -> refined, all of one shape and dtype. The
/// entry point below has validated them.
inline constexpr SlotDef<at::Tensor(const at::Tensor& delta, const at::Tensor& reference,
                                    double eps)>
    kRefineBoxes{"refine_boxes"};
using RefineBoxesHandle = Handle<decltype(kRefineBoxes)::Signature>;

/// The model-facing entry point: delta and reference of one shape (any, e.g. (B, Q, 4)), one
/// floating dtype and device -> sigmoid(delta + inverse_sigmoid(reference, eps)), that shape and
/// dtype. Calls `handle`, and the portable path when it is empty or every candidate declined.
/// Throws c10::Error naming the argument on a shape, dtype or device mismatch.
at::Tensor refine_boxes(const RefineBoxesHandle& handle, const at::Tensor& delta,
                        const at::Tensor& reference, double eps = 1e-5);

/// The portable path alone: upstream's ATen expression (the reference for every device).
at::Tensor refine_boxes_portable(const at::Tensor& delta, const at::Tensor& reference,
                                 double eps = 1e-5);

}  // namespace libreyolo::kernels
