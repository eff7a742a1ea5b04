// DetrForObjectDetection (transformers 5.17 models/detr/modeling_detr.py) as a family: its
// stem, config and encoder layer are models/detr/detr_common.h (shared with Conditional DETR and
// DAB-DETR), its transformer and heads models/detr/detr.h (shared with Table Transformer).

#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "models/detr/detr.h"
#include "models/detr/detr_segmentation.h"
#include "models/layers/layers.h"
#include "models/registry/family.h"

namespace libreyolo::models {

namespace {

/// Default of the attention modules' `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the detr_tiny fixture. It is not: manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "detr". The timm backbone's
/// architecture (depths, widths, block type) is read from the checkpoint's tensors under
/// model.backbone.conv_encoder.model. (detr::read_timm_resnet_config); the rest is strict.
/// Throws core::ConfigError / core::CheckpointError naming the file and the field or key.
std::unique_ptr<Model> load_detr(const std::string& dir, const nlohmann::json& config,
                                 const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  if (detr::is_segmentation_checkpoint(config, *file))
    return detr::load_segmentation(dir, view, *file, options, kFusedAttentionDefault);
  auto c = detr::parse_config(view);
  detr::read_backbone(c, *file);
  auto net = std::make_shared<detr::DetrImpl>(c, "detr");
  core::load_state_dict(*net, *file, detr::position_embedding_load_rules(), options.dtype,
                        options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return detr::make_detection_model(std::move(net), options);
}

// DETR (Carion et al., "End-to-End Object Detection with Transformers", ECCV 2020) as
// transformers 5.17 DetrForObjectDetection (models/detr/modeling_detr.py): a ResNet backbone
// with frozen BatchNorm (timm's, as facebook/detr-resnet-50 and -101 publish it, also their
// DC5 variants (`dilation`: the last stage dilated, output stride 16), or
// transformers' ResNetBackbone), its last feature map through a 1x1 input_projection, sine (or
// learned) position embeddings of the downsampled pixel_mask, a post-norm encoder with the key
// padding mask, a decoder over learned object queries from a zero target, then
// class_labels_classifier and the 3-layer bbox_predictor. forward() takes pixel_values
// (B, 3, H, W) and an optional pixel_mask (B, H, W); it returns logits (B, num_queries,
// num_labels + 1: the last class is "no object") and pred_boxes (B, num_queries, 4), float32.
// Post-processing: DetrImageProcessor.post_process_object_detection (image::DetectionHead::detr).
// DetrForSegmentation checkpoints (config.json architectures, else keys under "detr.model.",
// as facebook/detr-resnet-50-panoptic) load as Task::panoptic_segmentation
// (models/detr/detr_segmentation.h): pred_masks (B, num_queries, H/4, W/4) too, post-processed
// by DetrImageProcessor.post_process_panoptic_segmentation (models/image/panoptic.h).
const FamilyRegistrar registered{
    Family{"detr", {"detr"}, /*order=*/15, load_detr}
        .predicts({Task::object_detection, Task::panoptic_segmentation}, image::DetectionHead::detr)
        .takes_pixel_mask()
        .fused_attention(kFusedAttentionDefault)
        .layouts(detr::with_resnet_backbone_rules(
                     {{"qkv_concat", {"DetrSelfAttention"}, "", path_with("self_attn")}}),
                 {"batchnorm_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
