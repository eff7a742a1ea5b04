#include "kernels/box/refine_boxes.h"

namespace libreyolo::kernels {

at::Tensor refine_boxes_portable(const at::Tensor& delta, const at::Tensor& reference, double eps) {
  // modeling_rt_detr.py inverse_sigmoid, op for op (`1 - c` as LibTorch spells it: a fill and a
  // sub), then the add and the sigmoid.
  const auto c = reference.clamp(0, 1);
  const auto inverse = at::log(c.clamp_min(eps) / (1 - c).clamp_min(eps));
  return at::sigmoid(delta + inverse);
}

at::Tensor refine_boxes(const RefineBoxesHandle& handle, const at::Tensor& delta,
                        const at::Tensor& reference, double eps) {
  TORCH_CHECK(delta.defined() && reference.defined(),
              "refine_boxes: delta and reference must be defined");
  TORCH_CHECK(delta.sizes() == reference.sizes(), "refine_boxes: delta ", delta.sizes(),
              " and reference ", reference.sizes(), " must have one shape");
  TORCH_CHECK(
      at::isFloatingType(delta.scalar_type()) && delta.scalar_type() == reference.scalar_type(),
      "refine_boxes: delta (", delta.scalar_type(), ") and reference (", reference.scalar_type(),
      ") must share one floating dtype");
  TORCH_CHECK(delta.device() == reference.device(), "refine_boxes: delta on ", delta.device(),
              ", reference on ", reference.device());
  if (auto out = handle(delta, reference, eps)) return *out;
  return refine_boxes_portable(delta, reference, eps);
}

}  // namespace libreyolo::kernels
