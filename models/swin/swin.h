// Swin Transformer (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted
// Windows", ICCV 2021) as transformers 5.17 SwinForImageClassification
// (models/swin/modeling_swin.py), on-disk (legacy) parameter names: swin.embeddings.*,
// swin.encoder.layers.{s}.blocks.{b}.attention.self.*, swin.layernorm.*, classifier.*.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace swin {
/// Default of every Swin window-attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the swin_tiny fixture. It is not (max |SDPA - manual| ~1e-8..1e-7): manual.
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace swin

/// Loads `dir`/model.safetensors for config.json `model_type` "swin" (`config` is the parsed
/// config.json; architecture SwinForImageClassification). Any input size is accepted: pixels are
/// padded to a multiple of `patch_size`, feature maps to a multiple of the window, odd maps
/// before patch merging. Stages whose map is not larger than the window use window = min(h, w)
/// and no shift (transformers `set_shift_and_window_size`); when that window is smaller than the
/// configured one, the relative-position bias reads the configured table at the smaller window's
/// offsets (transformers 5.17 fails with a shape error there). `relative_position_index` is
/// recomputed, never read from the file. Throws core::ConfigError / core::CheckpointError.
std::unique_ptr<Model> load_swin(const std::string& dir, const nlohmann::json& config,
                                 const LoadOptions& options);

}  // namespace libreyolo::models
