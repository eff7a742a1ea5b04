// Deformable DETR (Zhu et al., "Deformable DETR: Deformable Transformers for End-to-End Object
// Detection", ICLR 2021) as transformers 5.17 DeformableDetrForObjectDetection
// (models/deformable_detr/modeling_deformable_detr.py) with the Hugging Face ResNet backbone
// (`backbone_config.model_type == "resnet"`, frozen BatchNorm), including iterative box
// refinement (`with_box_refine`) and the two-stage variant (`two_stage`).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

namespace deformable_detr {
/// Default of the decoder self-attention modules' `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the deformable_detr_tiny fixture. It is not: manual. (Multi-scale deformable
/// attention is a kernel slot, not affected by the flag.)
inline constexpr bool kFusedAttentionDefault = false;
}  // namespace deformable_detr

/// Loads `dir`/model.safetensors for config.json `model_type` "deformable_detr" (`config` is the
/// parsed config.json). Head keys follow hf-models.md 1.3: `class_embed.i` / `bbox_embed.i`,
/// else `model.decoder.{class,bbox}_embed.i`, else (tied heads only: class heads without
/// two_stage, box heads without with_box_refine) index 0. Throws core::ConfigError /
/// core::CheckpointError (std::runtime_error) naming the file and the field or tensor key;
/// unsupported options (timm backbone, learned position embedding, dilation) are ConfigErrors.
std::unique_ptr<Model> load_deformable_detr(const std::string& dir, const nlohmann::json& config,
                                            const LoadOptions& options);

}  // namespace libreyolo::models
