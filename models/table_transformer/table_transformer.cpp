// Table Transformer (TableTransformerForObjectDetection, transformers 5.17
// models/table_transformer/modeling_table_transformer.py) as a family: DETR's architecture
// (models/detr/detr.h) with pre-norm encoder and decoder layers and a LayerNorm after the
// encoder.

#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "models/detr/detr.h"
#include "models/layers/layers.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace {

/// Default of the attention modules' `fused_attn` flag (tests/parity/
/// fused_attention_policy_test.cpp): SDPA is not byte-exact with the manual math on the
/// table_transformer_tiny fixture (TableTransformerAttention has no SDPA path upstream): manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "table-transformer"
/// (microsoft/table-transformer-detection, -structure-recognition: the Hub's config form,
/// use_timm_backbone true, backbone "resnet18"; or 5.17's backbone_config). The timm
/// backbone's architecture is read from the checkpoint under model.backbone.conv_encoder.model.;
/// the rest is strict. Throws core::ConfigError / core::CheckpointError naming the file and the
/// field or key.
std::unique_ptr<Model> load_table_transformer(const std::string& dir, const nlohmann::json& config,
                                              const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  auto c = detr::parse_config(view);
  c.pre_norm = true;
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  detr::read_backbone(c, *file);
  auto net = std::make_shared<detr::DetrImpl>(c, "table-transformer", /*encoder_layernorm=*/true);
  core::load_state_dict(*net, *file, detr::position_embedding_load_rules(), options.dtype,
                        options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return detr::make_detection_model(std::move(net), options);
}

// Table Transformer (Smock et al., "PubTables-1M: Towards comprehensive table extraction from
// unstructured documents", CVPR 2022) as transformers 5.17 TableTransformerForObjectDetection:
// DETR (models/detr/) with pre-norm layers (TableTransformerEncoderLayer / DecoderLayer: each
// sub-layer normalised first, the residual added after) and model.encoder.layernorm after the
// last encoder layer; the ResNet backbone (timm's resnet18 on the Hub), sine position
// embeddings, object queries and heads are DETR's. forward() takes pixel_values (B, 3, H, W)
// and an optional pixel_mask (B, H, W); it returns logits (B, num_queries, num_labels + 1: the
// last class is "no object") and pred_boxes (B, num_queries, 4), float32. Post-processing:
// DetrImageProcessor.post_process_object_detection (the Hub's processors are DETR's).
const FamilyRegistrar registered{
    Family{"table_transformer", {"table-transformer"}, /*order=*/18, load_table_transformer}
        .predicts({Task::object_detection}, image::DetectionHead::detr)
        .takes_pixel_mask()
        .fused_attention(kFusedAttentionDefault)
        .layouts(detr::with_resnet_backbone_rules(
                     {{"qkv_concat", {"TableTransformerAttention"}, "", path_with("self_attn")}}),
                 {"batchnorm_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
