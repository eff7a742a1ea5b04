// OmDetTurboConfig (transformers 5.17 models/omdet_turbo/configuration_omdet_turbo.py) as the C++
// model reads it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/clip/clip.h"
#include "models/core/config.h"
#include "models/layers/layers.h"
#include "models/rtdetr/modules.h"
#include "models/swin/backbone.h"

namespace libreyolo::models::omdet_turbo {

/// The token length the processor pads and truncates every task and class to
/// (OmDetTurboProcessorKwargs' max_length 77, padding "max_length", truncation True).
constexpr int64_t kTextLength = 77;

struct Config {
  swin::BackboneConfig backbone;
  clip::TowerConfig text;
  /// The hybrid encoder (channel projections, AIFI, FPN/PAN) and the decoder's deformable
  /// cross-attention in RT-DETR's terms (rtdetr::Config): encoder_hidden_dim, encoder_layers,
  /// encoder_ffn_dim (encoder_dim_feedforward), heads, encoder_in_channels, encode_proj_layers
  /// (encoder_projection_indices), activation (csp_activation), encoder_activation
  /// (encoder_feedforward_activation), d_model, num_feature_levels, decoder_n_points,
  /// decoder_attention_heads (decoder_num_heads).
  rtdetr::Config hybrid;
  layers::Activation conv_norm_activation = layers::Activation::gelu;
  layers::Activation decoder_activation = layers::Activation::relu;
  int64_t text_projection_in_dim = 512, text_projection_out_dim = 512;
  int64_t task_encoder_hidden_dim = 1024, class_embed_dim = 512;
  int64_t decoder_hidden_dim = 256, decoder_layers = 6, decoder_ffn = 2048, num_queries = 900;
  std::vector<int64_t> vision_features_channels{256, 256, 256};
  bool cosine = true;  ///< class_distance_type "cosine" (else "dot")
  bool learn_initial_query = false;
  double layer_norm_eps = 1e-5;
  std::map<int64_t, std::string> id2label;  ///< unused by the model (classes are the prompt's)
};

/// Reads config.json of model_type "omdet-turbo". Supported backbones: timm's Swin
/// (omlab/omdet-turbo-swin-tiny-hf: use_timm_backbone true, `backbone` a timm Swin name,
/// backbone_kwargs, backbone_config null; or 5.17's backbone_config of model_type
/// "timm_backbone"; swin/timm_config.h) with apply_layernorm_after_vision_backbone true (its maps
/// are channels-last), or a Hugging Face Swin backbone_config with it false (upstream's
/// layer_norms normalise the last axis; SwinBackbone's maps are channels-first). A CLIP
/// text_config, eval_size null. Throws core::ConfigError naming the field otherwise (also:
/// widths that do not chain: text hidden_size != text_projection_in_dim or class_embed_dim,
/// text_projection_out_dim != class_embed_dim, encoder_hidden_dim != decoder_hidden_dim or
/// vision_features_channels, class_embed_dim == decoder_hidden_dim (upstream then has no
/// task_project and fails), heads not dividing widths, num_feature_levels other than the
/// encoder's levels, max_position_embeddings below 77).
Config parse_config(const core::ConfigView& v);

}  // namespace libreyolo::models::omdet_turbo
