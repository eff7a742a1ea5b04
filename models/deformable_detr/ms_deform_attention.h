// The multi-scale deformable attention MODULE of Deformable DETR (Zhu et al., ICLR 2021, eq. 3;
// transformers 5.17 DeformableDetrMultiscaleDeformableAttention): value/offset/weight
// projections around the `ms_deform_attn` kernel slot (kernels/attention/ms_deform_attn.h).
// On-disk children: sampling_offsets, attention_weights, value_proj, output_proj.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "kernels/attention/ms_deform_attn.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/layers.h"

namespace libreyolo::models::deformable_detr {

class MultiscaleDeformableAttentionImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  /// Takes the `ms_deform_attn` and `sampling_locations` handles the model was bound to.
  void bind_kernels(const layers::BoundKernels& k) override {
    ms_deform_attn_kernel_ = k.ms_deform_attn;
    sampling_locations_kernel_ = k.sampling_locations;
  }

 private:
  kernels::MsDeformAttnHandle ms_deform_attn_kernel_;
  kernels::SamplingLocationsHandle sampling_locations_kernel_;

 public:
  MultiscaleDeformableAttentionImpl(int64_t d_model, int64_t num_heads, int64_t num_levels,
                                    int64_t num_points);

  /// hidden (B, Q, D) queries, pos (B, Q, D) or undefined (added to the queries only),
  /// memory (B, S, D) the flattened multi-scale map, memory_mask (B, S) bool with true on valid
  /// tokens (padded ones get value 0) or undefined, reference_points (B, Q, L, 2) normalised
  /// (x, y) or (B, Q, L, 4) (cx, cy, w, h). Returns (B, Q, D).
  /// 2-d: loc = ref + offset / (W_l, H_l); 4-d: loc = ref_xy + offset / P * ref_wh * 0.5.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& pos, const at::Tensor& memory,
                     const at::Tensor& memory_mask, const at::Tensor& reference_points,
                     const kernels::SpatialShapes& shapes) const;

  layers::Linear sampling_offsets, attention_weights, value_proj, output_proj;
  int64_t d_model, num_heads, num_levels, num_points;
};
using MultiscaleDeformableAttention = std::shared_ptr<MultiscaleDeformableAttentionImpl>;

}  // namespace libreyolo::models::deformable_detr
