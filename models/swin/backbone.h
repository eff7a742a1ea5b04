// transformers 5.17 SwinBackbone (models/swin/modeling_swin.py) as a detector's backbone: the
// Swin embeddings + stages (swin::EncoderImpl) run with always_partition=True, the out_features
// stages' outputs before their patch merging, each through its LayerNorm
// (hidden_states_norms.stage{i}), as (B, C_i, h_i, w_i) maps.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/core/config.h"
#include "models/swin/swin.h"

namespace libreyolo::models::swin {

/// Reads a backbone_config of model_type "swin": the Swin fields (parse_config) and
/// out_indices (stage numbers 1..num_stages; "stem" 0 is refused), default the last stage;
/// out_features ["stage2", ...] must name the same stages when both are present. Throws
/// core::ConfigError naming the field.
struct BackboneConfig {
  Config swin;
  std::vector<int64_t> out_indices;  ///< 1-based stage numbers, increasing
  /// The only input size accepted (pixels; 0 = any): timm's PatchEmbed with strict_img_size,
  /// its default, refuses every size but timm.create_model's img_size (timm_config.h).
  int64_t required_height = 0, required_width = 0;
  /// BlockImpl::forward's always_partition: true for SwinBackbone; timm's create_model argument.
  bool always_partition = true;
  /// The per-out-index LayerNorms' eps: SwinBackbone's hidden_states_norms 1e-5; with a timm
  /// backbone its owner's norms (OmDet-Turbo's layer_norms: layer_norm_eps).
  double norm_eps = 1e-5;
};
BackboneConfig parse_backbone_config(const core::ConfigView& v);

/// On-disk children: embeddings.*, encoder.layers.*, hidden_states_norms.stage{i}.*. With
/// swin.timm (transformers' TimmBackbone): _backbone.{patch_embed, layers_N}.* only; the
/// per-out-index norms (timm's maps are channels-last, its features_only net has none) are
/// `norms`, left unregistered for the owner to register under its names (OmDet-Turbo's
/// layer_norms.{k}).
class BackboneImpl : public torch::nn::Module {
 public:
  explicit BackboneImpl(const BackboneConfig& c);
  /// The blocks' derived tensors on `device` (after loading).
  void prepare(const at::Device& device) { encoder->prepare(device); }
  /// Channels of each returned map (embed_dim * 2^(i-1) for stage i).
  std::vector<int64_t> channels() const;
  /// pixel_values (B, num_channels, H, W) -> one (B, C_i, h_i, w_i) map per out index, each
  /// stage's output through its norm. Throws std::invalid_argument "pixel_values: ..." for a
  /// size other than required_height x required_width when those are set.
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;

  BackboneConfig config;
  std::shared_ptr<EncoderImpl> encoder;
  std::vector<layers::LayerNorm> norms;
};

}  // namespace libreyolo::models::swin
