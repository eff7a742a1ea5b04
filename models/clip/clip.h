// CLIP's two towers as the open-vocabulary families carry them (transformers 5.17
// models/owlvit/modeling_owlvit.py OwlViTTextTransformer / OwlViTVisionTransformer, copies of
// models/clip/modeling_clip.py's), inference only, in the on-disk names: encoder.layers.{i}.
// {self_attn.{q,k,v,out}_proj, layer_norm1, mlp.fc1, mlp.fc2, layer_norm2}. The attention is
// the shared one (models/layers/attention.h: the `attention` slot when fused_attn is on).
// Internal to libreyolo_models (models/owlvit/).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models::clip {

/// One tower's fields (OwlViTTextConfig / OwlViTVisionConfig, CLIPTextConfig /
/// CLIPVisionConfig), with OWL-ViT's defaults.
struct TowerConfig {
  int64_t hidden_size = 512, intermediate_size = 2048, num_layers = 12, num_heads = 8;
  double layer_norm_eps = 1e-5;
  /// hidden_act "quick_gelu" (x * sigmoid(1.702 x), CLIP's default): not an ACT2FN entry the
  /// shared kernels have, so it is applied here; any other name goes to `act`.
  bool quick_gelu = true;
  layers::Activation act = layers::Activation::gelu;
  // Text tower.
  int64_t vocab_size = 49408, max_position_embeddings = 16;
  // Vision tower.
  int64_t image_size = 768, patch_size = 32, num_channels = 3;
};

/// Reads the text tower's fields from `v` (config.json's text_config). Throws core::ConfigError
/// naming the field (hidden_act unknown, hidden_size not a positive multiple of
/// num_attention_heads, a size not positive).
TowerConfig parse_text_config(const core::ConfigView& v);
/// Reads the vision tower's fields (config.json's vision_config; image_size and patch_size ints,
/// patch_size at most image_size). Throws core::ConfigError as parse_text_config.
TowerConfig parse_vision_config(const core::ConfigView& v);

/// CLIPEncoderLayer: pre-norm attention and MLP with residuals. x (N, S, D), bias additive and
/// broadcastable to (N, heads, S, S) or undefined -> (N, S, D), x's dtype.
class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const TowerConfig& c);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) const;

  layers::Attention self_attn;
  layers::LayerNorm layer_norm1, layer_norm2;
  layers::Linear fc1, fc2;
  bool quick_gelu;
  layers::Activation act;
};

/// The text transformer (register it as "text_model"): embeddings.{token_embedding,
/// position_embedding}.weight, encoder.layers.*, final_layer_norm.
class TextTransformerImpl : public torch::nn::Module {
 public:
  explicit TextTransformerImpl(const TowerConfig& c);

  /// input_ids (N, L) int64, L <= max_position_embeddings -> the pooled output (N, D): the
  /// final LayerNorm's output at each row's largest id (the end token: argmax of the ids, as
  /// upstream), in the weights' dtype. Causal attention; the padding mask is not needed, as
  /// padding follows the end token on the right and the causal mask already hides it from the
  /// pooled position. Throws std::invalid_argument for L past max_position_embeddings.
  at::Tensor pooled(const at::Tensor& input_ids) const;
  /// input_ids (N, L) as pooled -> the final LayerNorm's output at every position (N, L, D)
  /// (CLIPTextModel's last_hidden_state without an attention mask: causal attention only, as
  /// OmDet-Turbo's language backbone calls it). Throws as pooled.
  at::Tensor forward(const at::Tensor& input_ids) const;

  TowerConfig config;
  at::Tensor token_embedding, position_embedding;
  std::vector<std::shared_ptr<EncoderLayerImpl>> layers;
  layers::LayerNorm final_layer_norm;
};

/// The vision transformer (register it as "vision_model"): embeddings.{class_embedding,
/// patch_embedding.weight (no bias), position_embedding.weight}, `pre_norm_name` (OWL-ViT's
/// "pre_layernorm"; CLIPVisionTransformer's "pre_layrnorm"), encoder.layers.*, post_layernorm.
class VisionTransformerImpl : public torch::nn::Module {
 public:
  VisionTransformerImpl(const TowerConfig& c, const std::string& pre_norm_name);

  /// pixel_values (B, C, H, W), H and W >= patch_size, in the weights' dtype -> the encoder's
  /// last_hidden_state (B, 1 + (H / p) * (W / p), D), [class token, patches] (post_layernorm
  /// not applied: OWL-ViT applies it to every token, CLIP to the class token only). The position
  /// embeddings are the stored ones for an image_size x image_size input and otherwise resampled
  /// bicubically (interpolate_pos_encoding, vit::interpolate_patch_positions).
  at::Tensor forward(const at::Tensor& pixel_values) const;

  TowerConfig config;
  at::Tensor class_embedding, position_embedding;
  layers::Conv2d patch_embedding;
  layers::LayerNorm pre_layernorm, post_layernorm;
  std::vector<std::shared_ptr<EncoderLayerImpl>> layers;
};

}  // namespace libreyolo::models::clip
