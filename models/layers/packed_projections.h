// q / k / v projections stored packed in a checkpoint, one (3D, D) weight [q; k; v]:
// nn.MultiheadAttention's in_proj_weight (the original RF-DETR checkpoints' self_attn.in_proj_*)
// and timm's Attention / WindowAttention `qkv` Linear (timm Swin backbones), loaded into an
// AttentionImpl.
#pragma once

#include <string>

#include "models/layers/attention.h"

namespace libreyolo::models::layers {

/// Replaces the q / k / v children of `attention` by one packed projection of (3D, D) rows
/// [q; k; v] and a (3D) bias when the projections have biases, to be filled by load_state_dict:
/// `linear_name` empty = the module's own parameters in_proj_weight / in_proj_bias, otherwise a
/// child Linear of that name. Call bind_packed_projections after loading.
void pack_projections(AttentionImpl& attention, const std::string& linear_name = "");

/// After loading: the q / k / v projection weights become row views of in_proj_weight /
/// in_proj_bias, whatever dtype and device those have, and concat_projections = 3 (the
/// qkv_concat layout's state: inputs that are one tensor take one GEMM).
void bind_packed_projections(AttentionImpl& attention);

}  // namespace libreyolo::models::layers
