// LW-DETR (Chen et al., "LW-DETR: A Transformer Replacement to YOLO for Real-Time Detection",
// 2024) as transformers 5.17 LwDetrForObjectDetection (models/lw_detr/modeling_lw_detr.py),
// inference only: ViT backbone (vit_backbone.h), multi-scale C2F projector (projector.h),
// two-stage query selection (two_stage.h), deformable decoder (decoder.h), class and box heads.
// Pre-processing is DeformableDetrImageProcessor's (transformers' auto mapping for "lw_detr"),
// post-processing DeformableDetr's post_process_object_detection (image::DetectionHead::
// deformable_detr).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace lw_detr {
/// Default of the attention modules' `fused_attn` flag (backbone and decoder self-attention).
/// Manual math, as every family (tests/parity/lw_detr_parity_test.cpp measures both paths).
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace lw_detr

/// Loads `dir`/model.safetensors for config.json `model_type` "lw_detr" (`config` is the parsed
/// config.json). Every checkpoint key must be used and every module key present (the ViT
/// attention may carry save_pretrained's names, attention.attention.query / attention.output,
/// or transformers 5's, attention.q_proj / attention.o_proj). Throws core::ConfigError /
/// core::CheckpointError (std::runtime_error) naming the file and the field or tensor keys.
/// The model's forward takes pixel_values (B, 3, H, W) with H and W multiples of
/// patch_size * sqrt(num_windows), and an optional pixel_mask (B, H, W) integer or bool;
/// it returns logits (B, num_queries, num_labels) and pred_boxes (B, num_queries, 4)
/// (cx, cy, w, h normalised), float32.
std::unique_ptr<Model> load_lw_detr(const std::string& dir, const nlohmann::json& config,
                                    const LoadOptions& options);

}  // namespace libreyolo::models
