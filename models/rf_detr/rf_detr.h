// RF-DETR (Robinson et al., "RF-DETR: Neural Architecture Search for Real-Time Detection
// Transformers", 2025) as transformers 5.17 RfDetrForObjectDetection and
// RfDetrForInstanceSegmentation (models/rf_detr/modeling_rf_detr.py), inference only: DINOv2
// backbone with windowed attention (dinov2_backbone.h), one-level C2F projector with LayerNorm
// ConvNorms (lw_detr/projector.h), LW-DETR's two-stage query selection and deformable decoder
// (lw_detr/two_stage.h, lw_detr/decoder.h), class and box heads, and for instance segmentation
// the mask head (segmentation_head.h). Pre-processing is RfDetrImageProcessor's
// (image::ProcessorConfig: rescale, then resize, then normalise), post-processing its
// post_process_object_detection (top-k = num_queries over Q*C, sigmoid: image::DetectionHead::
// rt_detr's) and post_process_instance_segmentation (image/instance_segmentation.h).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace rf_detr {
/// Default of the attention modules' `fused_attn` flag (backbone and decoder self-attention).
/// Manual math, as every family (tests/parity/rf_detr_parity_test.cpp measures both paths).
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace rf_detr

/// Loads `dir`/model.safetensors for config.json `model_type` "rf_detr" (`config` is the parsed
/// config.json); architectures[0] RfDetrForInstanceSegmentation gives an instance segmentation
/// model, otherwise object detection. Every checkpoint key must be used and every module key
/// present, under the original RF-DETR names that transformers' save_pretrained writes
/// (rf_detr/checkpoint_keys.h) or transformers' module names. Throws core::ConfigError /
/// core::CheckpointError (std::runtime_error) naming the file and the field or tensor keys.
/// The model's forward takes pixel_values (B, 3, H, W) with H and W multiples of
/// patch_size * num_windows, and an optional pixel_mask (B, H, W) integer or bool; it returns
/// logits (B, num_queries, num_labels), pred_boxes (B, num_queries, 4) (cx, cy, w, h
/// normalised) and for segmentation pred_masks (B, num_queries, H / r, W / r) (r =
/// mask_downsample_ratio), float32.
std::unique_ptr<Model> load_rf_detr(const std::string& dir, const nlohmann::json& config,
                                    const LoadOptions& options);

}  // namespace libreyolo::models
