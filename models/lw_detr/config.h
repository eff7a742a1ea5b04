// The fields of an LW-DETR config.json the native model uses (transformers 5.17
// models/lw_detr/configuration_lw_detr.py: LwDetrConfig and its backbone LwDetrViTConfig).
// The projector / decoder part (DetrConfig) is shared with RF-DETR, whose RfDetrConfig extends
// LwDetrConfig with another backbone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/layers/layers.h"

namespace libreyolo::models::lw_detr {

/// LwDetrViTConfig (ViTDet-style backbone: windowed and global blocks, CAE layer scales).
struct ViTConfig {
  int64_t hidden_size = 768, num_layers = 12, num_heads = 12, mlp_ratio = 4;
  int64_t patch_size = 16, num_channels = 3;
  int64_t pretrain_height = 224, pretrain_width = 224;  ///< pretrain_image_size
  int64_t num_windows = 16, num_windows_side = 4;       ///< num_windows = side^2
  double layer_norm_eps = 1e-6;
  bool qkv_bias = true, absolute_position_embeddings = true;
  layers::Activation act = layers::Activation::gelu;
  std::vector<int64_t> window_block_indices;  ///< blocks with window attention
  std::vector<int64_t> out_indices;           ///< stage indices: 0 = embeddings, i = block i-1
};

/// The projector, two-stage and decoder fields of LwDetrConfig (RF-DETR has the same).
struct DetrConfig {
  std::string model_type = "lw_detr";  ///< the family, in error messages ("rf_detr" for RF-DETR)
  int64_t d_model = 256, decoder_layers = 3, decoder_ffn = 2048, decoder_points = 4;
  int64_t self_heads = 8, cross_heads = 16, num_queries = 300, group_detr = 13;
  int64_t c2f_blocks = 3, num_labels = 2;
  double hidden_expansion = 0.5;
  /// The projector ConvNorms' eps: LW-DETR batch_norm_eps (BatchNorm2d), RF-DETR layer_norm_eps
  /// (channels-first LayerNorm, conv_layer_norm).
  double conv_norm_eps = 1e-5;
  bool conv_layer_norm = false;  ///< RF-DETR: LayerNorm instead of BatchNorm2d in the ConvNorms
  /// Decoder self-attention softmax in float32 (LW-DETR's eager_attention_forward); RF-DETR's
  /// softmax runs in the input dtype.
  bool softmax_in_float32 = true;
  bool attention_bias = true;
  std::vector<double>
      scale_factors;  ///< projector_scale_factors, each 0.5, 1.0 or 2.0 (RF-DETR: {1.0})
  layers::Activation projector_act = layers::Activation::silu;  ///< activation_function
  layers::Activation decoder_act = layers::Activation::relu;    ///< decoder_activation_function
  int64_t num_levels() const { return static_cast<int64_t>(scale_factors.size()); }
};

struct Config {
  ViTConfig backbone;
  DetrConfig detr;
  std::map<int64_t, std::string> id2label;
};

/// Parses LwDetrConfig's projector / decoder fields of `v` (the config.json root). Throws
/// core::ConfigError naming the file and the field (empty or unsupported projector_scale_factors,
/// heads not dividing d_model, non-positive sizes, unknown activation names). With
/// `rf_detr` (RfDetrConfig): one scale level and no projector_scale_factors / batch_norm_eps,
/// the ConvNorms' LayerNorm eps from layer_norm_eps, softmax in the input dtype.
DetrConfig parse_detr_config(const core::ConfigView& v, bool rf_detr = false);

/// BackboneConfigMixin's stage selection of a backbone config: `out_indices`, else
/// `out_features` ("stem" = 0, "stageN" = N), else {num_layers}. Throws core::ConfigError naming
/// the field (an unknown stage name, an empty list, a stage outside 0..num_layers).
std::vector<int64_t> parse_out_indices(const core::ConfigView& v, int64_t num_layers);

/// Parses `backbone_config` (model_type "lw_detr_vit"). Throws core::ConfigError naming the
/// field (another backbone type, num_windows not a square, a non-square patch or position grid,
/// out_indices outside 0..num_hidden_layers).
ViTConfig parse_vit_config(const core::ConfigView& backbone_config);

/// The whole config.json of model_type "lw_detr". Throws core::ConfigError as above.
Config parse_config(const core::ConfigView& v);

}  // namespace libreyolo::models::lw_detr
