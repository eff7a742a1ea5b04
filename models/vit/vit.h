// Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021) as
// transformers 5.17 ViTForImageClassification (models/vit/modeling_vit.py), on-disk (legacy)
// parameter names: vit.embeddings.*, vit.encoder.layer.{i}.*, vit.layernorm.*, classifier.*.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace vit {
/// Default of every ViT attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the vit_tiny fixture. It is not (max |SDPA - manual| ~1e-7), so: manual.
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace vit

/// Loads `dir`/model.safetensors for config.json `model_type` "vit" (`config` is the parsed
/// config.json; the architecture must be ViTForImageClassification). Inputs whose size differs
/// from config `image_size` get bicubically interpolated position embeddings (transformers'
/// `interpolate_pos_encoding=True`). Throws core::ConfigError / core::CheckpointError
/// (std::runtime_error) naming the file and the field or tensor key.
std::unique_ptr<Model> load_vit(const std::string& dir, const nlohmann::json& config,
                                const LoadOptions& options);

}  // namespace libreyolo::models
