// The ViT backbone shared by the families built on it: transformers 5.17 ViTModel
// (models/vit/modeling_vit.py) and DeiTModel (models/deit/modeling_deit.py), both without their
// pooler, in the on-disk (legacy) parameter names: embeddings.{cls_token, <extra tokens>,
// position_embeddings, patch_embeddings.projection.*}, encoder.layer.{i}.*, layernorm.*.
// Internal to libreyolo_models (models/vit/vit.cpp, models/deit/deit.cpp).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/core/state_dict.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/module_model.h"

namespace libreyolo::models::vit {

/// The fields ViTConfig and DeiTConfig share (configuration_vit.py, configuration_deit.py), with
/// their defaults.
struct Config {
  int64_t hidden_size = 768, num_layers = 12, num_heads = 12, intermediate_size = 3072;
  int64_t image_size = 224, patch_size = 16, num_channels = 3, num_labels = 2;
  double layer_norm_eps = 1e-12;
  bool qkv_bias = true;
  layers::Activation act = layers::Activation::gelu;
  std::map<int64_t, std::string> id2label;
};

/// Reads the shared fields of config.json (`architectures` is the caller's). Throws
/// core::ConfigError naming the file and the field (hidden_act unknown, hidden_size not a
/// positive multiple of num_attention_heads, patch_size not in 1..image_size).
Config parse_config(const core::ConfigView& v);

/// parse_config without image_size (left at its default; YolosConfig's is a [height, width]
/// pair, its family reads it): the encoder's fields, patch_size and the labels. Throws
/// core::ConfigError as parse_config (patch_size must be positive).
Config parse_encoder_config(const core::ConfigView& v);

/// transformers' bicubic resampling of a grid of patch position embeddings
/// (interpolate_pos_encoding, YOLOS' InterpolateInitialPositionEmbeddings and
/// InterpolateMidPositionEmbeddings): `patch_positions` (N, grid_height * grid_width, D), row
/// major, -> (N, out_height * out_width, D) through nn.functional.interpolate(mode="bicubic",
/// align_corners=False) on (N, D, grid_height, grid_width).
at::Tensor interpolate_patch_positions(const at::Tensor& patch_positions, int64_t grid_height,
                                       int64_t grid_width, int64_t out_height, int64_t out_width);

/// Checks config.json `architectures[0]` (when present) is one of `supported` and returns it;
/// absent: `supported[0]` (what AutoModelForImageClassification builds). Throws
/// core::ConfigError naming the field otherwise.
std::string architecture(const core::ConfigView& v, const std::vector<std::string>& supported);

/// transformers ViTLayer / DeiTLayer: pre-norm attention (through the `attention` slot when the
/// module's fused_attn is on, models/layers/attention.h) and MLP blocks with residuals.
/// x: (B, S, hidden) -> (B, S, hidden), the dtype of the weights.
class LayerImpl : public torch::nn::Module {
 public:
  explicit LayerImpl(const Config& c);
  at::Tensor forward(const at::Tensor& x) const;

  layers::Attention attention;
  layers::Linear attention_out, fc1, fc2;
  layers::LayerNorm layernorm_before, layernorm_after;
  layers::Activation act;
};

/// Embeddings + encoder + final LayerNorm, registered on this module (register it as "vit" /
/// "deit"). The sequence is [cls_token, extra_tokens..., patches] and position_embeddings has
/// one row per token (num_patches + 1 + extra_tokens.size()).
class BackboneImpl : public torch::nn::Module {
 public:
  /// `extra_tokens`: the learned tokens after cls_token, in sequence order ({} for ViT,
  /// {"distillation_token"} for DeiT).
  BackboneImpl(const Config& c, const std::vector<std::string>& extra_tokens);

  /// The position embeddings for an input of height x width pixels giving `num_patches`
  /// patches: the stored ones when they fit a square input, else transformers'
  /// interpolate_pos_encoding (bicubic, align_corners=False, on the square grid of stored patch
  /// positions; the special tokens' rows kept). (1, num_tokens, hidden).
  at::Tensor position_embedding(int64_t height, int64_t width, int64_t num_patches) const;

  /// pixel_values (B, num_channels, H, W) in the weights' dtype and device (H, W >= patch_size)
  /// -> the final LayerNorm's output (B, num_prefix_tokens() + (H / p) * (W / p), hidden).
  at::Tensor forward(const at::Tensor& pixel_values) const;

  /// 1 + extra_tokens.size().
  int64_t num_prefix_tokens() const { return static_cast<int64_t>(prefix_tokens.size()); }

  Config config;
  std::vector<at::Tensor> prefix_tokens;  ///< cls_token, then the extra tokens: (1, 1, hidden)
  at::Tensor position_embeddings;
  layers::Conv2d projection;
  std::vector<std::shared_ptr<LayerImpl>> blocks;
  layers::LayerNorm layernorm;
};

/// Fills `net` from `dir`/model.safetensors (core::load_state_dict: strict, the CheckpointError
/// names every missing, unexpected or mis-shaped key), ignoring only `<prefix>.pooler.*` (base
/// model checkpoints carry a pooler the classification heads do not use, hf-models.md 6), then
/// sets every attention module's fused_attn to `fused_attention`.
void load_weights(torch::nn::Module& net, const std::string& dir, const std::string& prefix,
                  bool fused_attention, const LoadOptions& options);

/// A classifier over a `Net` root module with a `config` member (Config) and
/// `forward(pixel_values) -> logits` in the weights' dtype. forward(): pixel_values
/// (B, num_channels, H, W), H and W >= patch_size (models::check_pixel_values: throws
/// std::invalid_argument naming the model type) -> ModelOutput::logits (B, num_labels) float32.
template <class Net>
class ImageClassifier : public ModuleModel<Net> {
 public:
  ImageClassifier(std::string model_type, std::shared_ptr<Net> net, const LoadOptions& options)
      : ModuleModel<Net>(std::move(model_type), Task::image_classification, std::move(net),
                         options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    const auto& c = this->net_->config;
    const at::Tensor x = this->checked_input(pixel_values, c.num_channels, c.patch_size);
    ModelOutput out;
    out.logits = this->net_->forward(x).to(at::kFloat);
    return out;
  }
};

}  // namespace libreyolo::models::vit
