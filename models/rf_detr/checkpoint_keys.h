// RF-DETR checkpoint names. transformers 5.17 saves RfDetr* models in the original RF-DETR
// (Roboflow rfdetr package) layout, converting on load (conversion_mapping.py "RfDetrModel",
// "RfDetrForObjectDetection", "RfDetrForInstanceSegmentation"): backbone.0.encoder.encoder.*,
// backbone.0.projector.stages.0.*, transformer.decoder.layers.N.{norm1, linear1,
// self_attn.in_proj_weight, ...}, refpoint_embed, segmentation_head.*. The native modules carry
// transformers' module names; these helpers map them to the original names (tried by
// core::load_state_dict when a module key is absent, so files with either naming load); the
// packed decoder self-attention projections are layers::pack_projections'.
#pragma once

#include <string>

namespace libreyolo::models::rf_detr {

/// The original RF-DETR name of a module key of RfDetrForObjectDetection (`segmentation`
/// false: "model.backbone.backbone.*", "class_embed.*", ...) or RfDetrForInstanceSegmentation
/// (true: the detector under "model.", the head's "blocks.N.*", "segmentation_bias", ...);
/// `module_key` itself when the name is the same in both layouts.
std::string original_key(const std::string& module_key, bool segmentation);

}  // namespace libreyolo::models::rf_detr
