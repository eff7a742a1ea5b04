// DeiT (Touvron et al., "Training data-efficient image transformers & distillation through
// attention", ICML 2021) as transformers 5.17 DeiTForImageClassification and
// DeiTForImageClassificationWithTeacher (models/deit/modeling_deit.py), on-disk (legacy)
// parameter names: deit.embeddings.{cls_token, distillation_token, position_embeddings,
// patch_embeddings.projection.*}, deit.encoder.layer.{i}.*, deit.layernorm.*, and classifier.*
// or cls_classifier.* + distillation_classifier.*. The encoder is the ViT one
// (models/vit/backbone.h).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace deit {
/// Default of every DeiT attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the deit_tiny fixtures. It is not (max |SDPA - manual| 5e-7..8e-7): manual.
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace deit

/// Loads `dir`/model.safetensors for config.json `model_type` "deit" (`config` is the parsed
/// config.json). The head follows `architectures[0]`: DeiTForImageClassification (absent: this
/// one, as AutoModelForImageClassification) classifies the CLS token's final state;
/// DeiTForImageClassificationWithTeacher returns (cls_classifier(CLS) +
/// distillation_classifier(distillation token)) / 2, upstream's `logits`. forward():
/// pixel_values (B, num_channels, H, W) float -> logits (B, num_labels) float32. Inputs whose
/// size differs from config `image_size` get bicubically interpolated position embeddings
/// (transformers' `interpolate_pos_encoding=True`; upstream raises without it). Throws
/// core::ConfigError / core::CheckpointError (std::runtime_error) naming the file and the field
/// or tensor keys (every missing and unexpected key; `deit.pooler.*` is ignored).
std::unique_ptr<Model> load_deit(const std::string& dir, const nlohmann::json& config,
                                 const LoadOptions& options);

}  // namespace libreyolo::models
