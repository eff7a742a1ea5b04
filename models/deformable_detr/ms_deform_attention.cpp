#include "models/deformable_detr/ms_deform_attention.h"

#include <stdexcept>

namespace libreyolo::models::deformable_detr {

MultiscaleDeformableAttentionImpl::MultiscaleDeformableAttentionImpl(int64_t d_model,
                                                                     int64_t num_heads,
                                                                     int64_t num_levels,
                                                                     int64_t num_points)
    : d_model(d_model), num_heads(num_heads), num_levels(num_levels), num_points(num_points) {
  TORCH_CHECK(num_heads > 0 && d_model % num_heads == 0, "deformable attention: d_model ", d_model,
              " is not divisible by ", num_heads, " heads");
  using layers::LinearImpl;
  sampling_offsets = register_module(
      "sampling_offsets",
      std::make_shared<LinearImpl>(d_model, num_heads * num_levels * num_points * 2));
  attention_weights =
      register_module("attention_weights",
                      std::make_shared<LinearImpl>(d_model, num_heads * num_levels * num_points));
  value_proj = register_module("value_proj", std::make_shared<LinearImpl>(d_model, d_model));
  output_proj = register_module("output_proj", std::make_shared<LinearImpl>(d_model, d_model));
}

at::Tensor MultiscaleDeformableAttentionImpl::forward(const at::Tensor& hidden,
                                                      const at::Tensor& pos,
                                                      const at::Tensor& memory,
                                                      const at::Tensor& memory_mask,
                                                      const at::Tensor& reference_points,
                                                      const kernels::SpatialShapes& shapes) const {
  // transformers DeformableDetrMultiscaleDeformableAttention.forward, same operation order.
  const auto q = pos.defined() ? hidden + pos : hidden;
  const int64_t B = q.size(0), Q = q.size(1), S = memory.size(1);
  const int64_t H = num_heads, L = num_levels, P = num_points;
  auto value = value_proj->forward(memory);
  if (memory_mask.defined())  // in place: value is the projection's own output
    value.masked_fill_(memory_mask.logical_not().unsqueeze(-1), 0.0);
  value = value.view({B, S, H, d_model / H});
  const auto offsets = sampling_offsets->forward(q).view({B, Q, H, L, P, 2});
  const auto weights =
      at::softmax(attention_weights->forward(q).view({B, Q, H, L * P}), -1).view({B, Q, H, L, P});
  at::Tensor locations;
  const int64_t coords = reference_points.size(-1);
  if (coords == 2) {
    // (W, H) per level, filled on the tensor's device: a host tensor copied over would be a
    // pageable host-to-device copy, which a CUDA graph capture refuses (the daemon's
    // cuda_graphs, models/runtime/cuda_graph_runner.h), and a synchronising one eagerly.
    TORCH_CHECK(static_cast<int64_t>(shapes.size()) == L, "deformable attention: ", shapes.size(),
                " spatial shapes for ", L, " levels");
    auto normalizer = at::empty({L, 2}, offsets.options());
    for (int64_t l = 0; l < L; ++l) {
      normalizer.select(0, l).select(0, 0).fill_(static_cast<double>(shapes[l][1]));
      normalizer.select(0, l).select(0, 1).fill_(static_cast<double>(shapes[l][0]));
    }
    normalizer = normalizer.view({1, 1, 1, L, 1, 2});
    locations = reference_points.unsqueeze(2).unsqueeze(4) + offsets / normalizer;
  } else if (coords == 4 && reference_points.dim() == 4 && reference_points.size(0) == B &&
             reference_points.size(1) == Q &&
             reference_points.scalar_type() == offsets.scalar_type() &&
             (reference_points.size(2) == 1 ||
              (reference_points.size(2) == L && reference_points.stride(2) == 0))) {
    // One box for every level (LW-DETR / RF-DETR without a pixel_mask hand over the boxes
    // expanded, one-level models have one): the sampling_locations slot, upstream's ops and
    // roundings in one kernel. Anything else (per-level boxes, a broadcast batch, another
    // dtype) keeps upstream's broadcasting expression below.
    locations =
        kernels::sampling_locations(sampling_locations_kernel_, offsets.view({B, Q, H, L * P, 2}),
                                    reference_points.select(2, 0),
                                    kernels::PointScale::divide_by(static_cast<double>(P)), 0.5)
            .view(offsets.sizes());
  } else if (coords == 4) {
    const auto ref = reference_points.unsqueeze(2).unsqueeze(4);  // (B, Q, 1, L, 1, 4)
    locations = ref.slice(-1, 0, 2) + offsets / P * ref.slice(-1, 2) * 0.5;
  } else {
    throw std::invalid_argument(
        c10::str("deformable attention: reference_points must end in 2 or 4, got ",
                 reference_points.sizes()));
  }
  const auto out =
      kernels::ms_deform_attn(ms_deform_attn_kernel_, value, shapes, locations, weights);
  return output_proj->forward(out);
}

}  // namespace libreyolo::models::deformable_detr
