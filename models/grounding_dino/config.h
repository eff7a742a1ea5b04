// GroundingDinoConfig / MMGroundingDinoConfig (transformers 5.17
// models/grounding_dino/configuration_grounding_dino.py, mm_grounding_dino/) as the C++ model
// reads them.
#pragma once

#include <map>
#include <string>

#include "models/core/config.h"
#include "models/layers/bert_model.h"
#include "models/layers/layers.h"
#include "models/swin/backbone.h"

namespace libreyolo::models::grounding_dino {

struct Config {
  /// MMGroundingDinoForObjectDetection: the contrastive heads scale by 1/sqrt(d_model) and add a
  /// learned bias (MMGroundingDinoContrastiveEmbedding); box and class heads always shared.
  bool mm = false;
  int64_t d_model = 256, encoder_layers = 6, decoder_layers = 6;
  int64_t encoder_heads = 8, decoder_heads = 8, encoder_ffn = 2048, decoder_ffn = 2048;
  int64_t num_queries = 900, num_levels = 4, encoder_points = 4, decoder_points = 4;
  int64_t max_text_len = 256;
  bool decoder_bbox_embed_share = true;
  double temperature = 20, layer_norm_eps = 1e-5;
  layers::Activation act = layers::Activation::relu;
  swin::BackboneConfig backbone;
  layers::BertConfig text;
  std::map<int64_t, std::string> id2label;  ///< unused by the model (classes are the prompt's)
};

/// Reads config.json of model_type "grounding-dino" (mm = false) or "mm-grounding-dino".
/// Supported: two_stage true with embedding_init_target true and query_dim 4 (every published
/// checkpoint), sine position embeddings, a Swin backbone_config (use_timm_backbone false), a
/// BERT text_config. Throws core::ConfigError naming the field otherwise (also: d_model not a
/// multiple of 32 (GroupNorm(32, d)), heads not dividing their widths, fewer levels than
/// backbone maps).
Config parse_config(const core::ConfigView& v, bool mm);

}  // namespace libreyolo::models::grounding_dino
