// The fields of an RF-DETR config.json the native model uses (transformers 5.17
// models/rf_detr/configuration_rf_detr.py: RfDetrConfig, which extends LwDetrConfig, and its
// backbone RfDetrDinov2Config). The projector / two-stage / decoder fields are LW-DETR's
// (lw_detr::DetrConfig, parsed by lw_detr::parse_detr_config in its RF-DETR mode).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/layers/layers.h"
#include "models/lw_detr/config.h"

namespace libreyolo::models::rf_detr {

/// RfDetrDinov2Config: a DINOv2 ViT (layer scales, optional SwiGLU MLP) whose token grid is
/// split into num_windows x num_windows windows; the blocks up to the last out_indices stage
/// that are not themselves out stages attend within a window (window_block_indexes), the others
/// over the whole image.
struct Dinov2Config {
  int64_t hidden_size = 768, num_layers = 12, num_heads = 12, mlp_ratio = 4;
  int64_t patch_size = 14, num_channels = 3;
  int64_t image_size = 224;  ///< the position embeddings' grid is (image_size / patch_size)^2
  int64_t num_windows = 4;   ///< windows per side (RfDetrDinov2Config.num_windows)
  double layer_norm_eps = 1e-6;
  bool qkv_bias = true, use_swiglu_ffn = false, use_mask_token = true, apply_layernorm = true;
  layers::Activation act = layers::Activation::gelu;
  std::vector<int64_t> out_indices;           ///< stage indices: 0 = embeddings, i = block i-1
  std::vector<int64_t> window_block_indexes;  ///< derived as upstream's __post_init__
  int64_t grid() const { return image_size / patch_size; }
};

struct Config {
  Dinov2Config backbone;
  lw_detr::DetrConfig detr;
  bool segmentation = false;  ///< RfDetrForInstanceSegmentation
  int64_t mask_downsample_ratio = 4;
  int64_t intermediate_size = 1024;  ///< the segmentation query MLP's hidden width
  layers::Activation segmentation_act = layers::Activation::gelu;
  std::map<int64_t, std::string> id2label;
};

/// Parses `backbone_config` (model_type "rf_detr_dinov2"). Throws core::ConfigError naming the
/// field: another backbone type, a non-square patch or image size, reshape_hidden_states false,
/// num_windows < 1, heads not dividing hidden_size, out_indices outside 0..num_hidden_layers.
Dinov2Config parse_dinov2_config(const core::ConfigView& backbone_config);

/// The whole config.json of model_type "rf_detr". `architectures[0]` (when present) must be
/// RfDetrForObjectDetection or RfDetrForInstanceSegmentation (absent: object detection). Throws
/// core::ConfigError naming the file and the field.
Config parse_config(const core::ConfigView& v);

}  // namespace libreyolo::models::rf_detr
