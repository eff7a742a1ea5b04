// D-FINE (Peng et al., "D-FINE: Redefine Regression Task in DETRs as Fine-grained Distribution
// Refinement", ICLR 2025) as transformers 5.17 DFineForObjectDetection with the HGNetV2
// backbone (`hgnet_v2`).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace dfine {
/// Default of every D-FINE attention module's `fused_attn` flag (AIFI encoder layer, decoder
/// self-attention), decided by measurement as for the other families
/// (tests/parity/dfine_parity_test.cpp prints it): SDPA is not byte-exact with the manual math
/// on the dfine_tiny fixture (max |SDPA - manual| ~1e-6 on the logits), so: manual.
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace dfine

/// Loads `dir`/model.safetensors for config.json `model_type` "d_fine" (`config` is the parsed
/// config.json). Throws std::runtime_error (core::ConfigError / core::CheckpointError) naming
/// config.json and the field, or the checkpoint and key.
std::unique_ptr<Model> load_dfine(const std::string& dir, const nlohmann::json& config,
                                  const LoadOptions& options);

}  // namespace libreyolo::models
