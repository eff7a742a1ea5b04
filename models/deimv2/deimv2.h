// DEIMv2 (Huang et al., "Real-Time Object Detection Meets DINOv3", 2025) as transformers 5.17
// Deimv2ForObjectDetection with the HGNetV2 backbone and the hybrid or lite encoder, or the
// DINOv3 backbone (Deimv2DINOv3ConvEncoder, models/deimv2/dinov3_backbone.h) and the hybrid
// encoder (modeling_deimv2.py; DINOv3 with the lite encoder is a load error).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace deimv2 {
/// Default of every DEIMv2 attention module's `fused_attn` flag (AIFI encoder layer, decoder
/// self-attention), measured as for D-FINE (tests/parity/deimv2_parity_test.cpp prints it):
/// SDPA is not byte-exact with the manual math, so: manual.
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace deimv2

/// Loads `dir`/model.safetensors for config.json `model_type` "deimv2" (`config` is the parsed
/// config.json). Every checkpoint key must be used and every module key found. Throws
/// std::runtime_error (core::ConfigError naming config.json and the field, e.g. an unsupported
/// backbone_config.model_type; core::CheckpointError naming the file and the missing /
/// unexpected keys).
std::unique_ptr<Model> load_deimv2(const std::string& dir, const nlohmann::json& config,
                                   const LoadOptions& options);

}  // namespace libreyolo::models
