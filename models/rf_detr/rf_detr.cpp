// RfDetrForObjectDetection / RfDetrForInstanceSegmentation (transformers 5.17), inference
// only; every step keeps transformers' operation order so that float32 results match.

#include "models/module_model.h"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/core/config.h"
#include "models/core/pixel_mask.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/deformable_detr/geometry.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/layers/packed_projections.h"
#include "models/lw_detr/decoder.h"
#include "models/lw_detr/projector.h"
#include "models/lw_detr/two_stage.h"
#include "models/registry/family.h"
#include "models/rf_detr/checkpoint_keys.h"
#include "models/rf_detr/config.h"
#include "models/rf_detr/dinov2_backbone.h"
#include "models/rf_detr/segmentation_head.h"

namespace libreyolo::models {
namespace rf_detr {
namespace {

/// Default of the attention modules' `fused_attn` flag (backbone and decoder self-attention).
/// Manual math, as every family (tests/parity/rf_detr_parity_test.cpp measures both paths).
constexpr bool kFusedAttentionDefault = false;

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// What the detector computes: its outputs and what the mask head reads.
struct DetectorOutput {
  at::Tensor logits, boxes;
  at::Tensor features;  ///< (B, D, h, w) the projector's map (backbone_features)
  at::Tensor hidden;    ///< (B, Q, D) the decoder's last (layer-normed) hidden state
};

/// RfDetrForObjectDetection with the on-disk module names ("model.*", "class_embed.*",
/// "bbox_embed.*").
class RfDetrImpl : public torch::nn::Module {
 public:
  explicit RfDetrImpl(const Config& c) : config(c) {
    const int64_t d = c.detr.d_model;
    auto model = register_module("model", make<torch::nn::Module>());
    auto conv_encoder = model->register_module("backbone", make<torch::nn::Module>());
    backbone = conv_encoder->register_module("backbone", make<Dinov2BackboneImpl>(c.backbone));
    auto projector = conv_encoder->register_module("projector", make<torch::nn::Module>());
    // RfDetrScaleProjector: C2F over the concatenated maps, channels-first LayerNorm (1e-6).
    const auto channels = backbone->channels();
    projector_layer = projector->register_module(
        "projector_layer", make<lw_detr::C2FLayerImpl>(
                               c.detr, channels.front() * static_cast<int64_t>(channels.size())));
    projector_norm = projector->register_module("layer_norm", make<layers::LayerNormImpl>(d, 1e-6));
    decoder = model->register_module("decoder", make<lw_detr::DecoderImpl>(c.detr));
    selection = std::make_unique<lw_detr::QuerySelection>(*model, c.detr);
    class_embed = register_module("class_embed", make<layers::LinearImpl>(d, c.detr.num_labels));
    bbox_embed =
        register_module("bbox_embed", make<layers::MLPImpl>(d, d, 4, 3, layers::Activation::relu));
  }

  /// pixel_values (B, 3, H, W), pixel_mask (B, H, W) (nonzero = valid) or undefined (no
  /// padding: the mask, valid ratios and proposals' validity are then not computed).
  DetectorOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const {
    const auto features = lw_detr::layer_norm_channels_first(
        *projector_norm, projector_layer->forward(backbone_maps(pixel_values)));
    const kernels::SpatialShapes shapes{{features.size(2), features.size(3)}};
    const auto memory = features.flatten(2).transpose(1, 2);
    at::Tensor mask, valid_ratios;
    if (pixel_mask.defined()) {
      const auto m = at::upsample_nearest2d(pixel_mask.unsqueeze(0).to(at::kFloat),
                                            {features.size(2), features.size(3)})
                         .to(at::kBool)
                         .squeeze(0);
      mask = m.flatten(1);
      valid_ratios =
          deformable_detr::valid_ratio(m, memory.scalar_type()).unsqueeze(1);  // (B, 1, 2)
    }
    const auto queries = selection->forward(memory, mask, shapes);
    DetectorOutput out;
    out.hidden = decoder->forward(queries.target, queries.reference_points, valid_ratios, memory,
                                  mask, shapes);
    out.logits = class_embed->forward(out.hidden);
    out.boxes = lw_detr::refine_boxes(queries.reference_points, bbox_embed->forward(out.hidden));
    out.features = features;
    return out;
  }

  /// The backbone's maps concatenated over channels, (B, L * hidden_size, h, w): channels_last
  /// (one concatenation of the maps' rows, no transposing copies) when the projector is.
  at::Tensor backbone_maps(const at::Tensor& pixel_values) const {
    const bool channels_last = projector_layer->channels_last();
    auto maps = backbone->forward(pixel_values, channels_last);
    if (!channels_last) return at::cat(maps, 1);
    for (auto& m : maps) m = m.permute({0, 2, 3, 1});  // (B, h, w, C) rows, contiguous
    return at::cat(maps, -1).permute({0, 3, 1, 2});
  }

  /// The decoder layers' self-attention modules.
  std::vector<layers::AttentionImpl*> decoder_self_attention() const {
    std::vector<layers::AttentionImpl*> out;
    for (const auto& l : decoder->layers_) out.push_back(l->self_attn.get());
    return out;
  }

  Config config;
  std::shared_ptr<Dinov2BackboneImpl> backbone;
  std::shared_ptr<lw_detr::C2FLayerImpl> projector_layer;
  layers::LayerNorm projector_norm;
  std::shared_ptr<lw_detr::DecoderImpl> decoder;
  std::unique_ptr<lw_detr::QuerySelection> selection;
  layers::Linear class_embed;
  layers::MLP bbox_embed;
};

/// RfDetrForInstanceSegmentation: the detector as "model", the mask head's children at the root.
class RfDetrSegmentationImpl : public torch::nn::Module {
 public:
  explicit RfDetrSegmentationImpl(const Config& c)
      : config(c),
        detector(register_module("model", make<RfDetrImpl>(c))),
        head(std::make_unique<SegmentationHead>(*this, c)) {}

  Config config;
  std::shared_ptr<RfDetrImpl> detector;
  std::unique_ptr<SegmentationHead> head;
};

template <class Net>
class RfDetrModel : public ModuleModel<Net> {
 public:
  RfDetrModel(std::shared_ptr<Net> net, const LoadOptions& options, Task task)
      : ModuleModel<Net>("rf_detr", task, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const auto& b = this->net_->config.backbone;
    const at::Tensor x =
        this->checked_input(pixel_values, b.num_channels, b.patch_size * b.num_windows);
    // No mask: no padding, the unmasked path (RfDetrImpl::forward).
    const at::Tensor mask =
        pixel_mask.defined()
            ? core::checked_pixel_mask("rf_detr", x, pixel_mask, this->options_.device)
            : at::Tensor();
    ModelOutput out;
    if constexpr (std::is_same_v<Net, RfDetrSegmentationImpl>) {
      const auto d = this->net_->detector->forward(x, mask);
      out.logits = d.logits.to(at::kFloat);
      out.pred_boxes = d.boxes.to(at::kFloat);
      out.pred_masks =
          this->net_->head->forward(d.features, d.hidden, x.size(2), x.size(3)).to(at::kFloat);
    } else {
      const auto d = this->net_->forward(x, mask);
      out.logits = d.logits.to(at::kFloat);
      out.pred_boxes = d.boxes.to(at::kFloat);
    }
    return out;
  }
};

/// Loads `file` into `net` (root of either class, `detector` its RfDetrImpl) with the original
/// RF-DETR names as aliases; packs the decoder self-attention projections first when the file
/// stores them packed (self_attn.in_proj_weight).
void load_weights(torch::nn::Module& net, RfDetrImpl& detector, const core::SafetensorsFile& file,
                  bool segmentation, const LoadOptions& options) {
  const bool packed = file.contains("transformer.decoder.layers.0.self_attn.in_proj_weight");
  if (packed)
    for (auto* a : detector.decoder_self_attention()) layers::pack_projections(*a);
  core::LoadRules rules;
  rules.aliases = [segmentation](const std::string& key) {
    std::vector<std::string> out;
    auto alt = original_key(key, segmentation);
    if (alt != key) out.push_back(std::move(alt));
    return out;
  };
  core::load_state_dict(net, file, rules, options.dtype, options.device);
  if (packed)
    for (auto* a : detector.decoder_self_attention()) layers::bind_packed_projections(*a);
  layers::set_fused_attention(net, kFusedAttentionDefault);
}

}  // namespace
}  // namespace rf_detr

namespace {

/// Loads `dir`/model.safetensors for config.json `model_type` "rf_detr" (`config` is the parsed
/// config.json); architectures[0] RfDetrForInstanceSegmentation gives an instance segmentation
/// model, otherwise object detection. Every checkpoint key must be used and every module key
/// present, under the original RF-DETR names that transformers' save_pretrained writes
/// (rf_detr/checkpoint_keys.h) or transformers' module names. Throws core::ConfigError /
/// core::CheckpointError (std::runtime_error) naming the file and the field or tensor keys.
std::unique_ptr<Model> load_rf_detr(const std::string& dir, const nlohmann::json& config,
                                    const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = rf_detr::parse_config(view);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  if (c.segmentation) {
    auto net = std::make_shared<rf_detr::RfDetrSegmentationImpl>(c);
    rf_detr::load_weights(*net, *net->detector, *file, true, options);
    return std::make_unique<rf_detr::RfDetrModel<rf_detr::RfDetrSegmentationImpl>>(
        std::move(net), options, Task::instance_segmentation);
  }
  auto net = std::make_shared<rf_detr::RfDetrImpl>(c);
  rf_detr::load_weights(*net, *net, *file, false, options);
  return std::make_unique<rf_detr::RfDetrModel<rf_detr::RfDetrImpl>>(std::move(net), options,
                                                                     Task::object_detection);
}

// RF-DETR (Robinson et al., "RF-DETR: Neural Architecture Search for Real-Time Detection
// Transformers", 2025) as transformers 5.17 RfDetrForObjectDetection and
// RfDetrForInstanceSegmentation (models/rf_detr/modeling_rf_detr.py), inference only: DINOv2
// backbone with windowed attention (dinov2_backbone.h), one-level C2F projector with LayerNorm
// ConvNorms (lw_detr/projector.h), LW-DETR's two-stage query selection and deformable decoder
// (lw_detr/two_stage.h, lw_detr/decoder.h), class and box heads, and for instance segmentation
// the mask head (segmentation_head.h). Pre-processing is RfDetrImageProcessor's
// (image::ProcessorConfig: rescale, then resize, then normalise), post-processing its
// post_process_object_detection (top-k = num_queries over Q*C, sigmoid: image::DetectionHead::
// rt_detr's) and post_process_instance_segmentation (image/instance_segmentation.h). forward()
// takes pixel_values (B, 3, H, W) with H and W multiples of patch_size * num_windows, and an
// optional pixel_mask (B, H, W) integer or bool; it returns logits (B, num_queries,
// num_labels), pred_boxes (B, num_queries, 4) (cx, cy, w, h normalised) and for segmentation
// pred_masks (B, num_queries, H / r, W / r) (r = mask_downsample_ratio), float32.
//
// Layout classes: the DINOv2 backbone's attention, then the decoder self-attention. Its
// RfDetrConvNormLayer normalises with LayerNorm (statistics of each pixel's channels at run
// time, not per-channel constants): nothing for batchnorm_fold. channels_last (CUDA, 16-bit or
// TF32: layouts::on_by_default) takes the projector's convolutions, whose channels-first
// LayerNorms then normalise contiguous rows, and the backbone hands its maps over as rows.
const FamilyRegistrar registered{
    Family{"rf_detr", {"rf_detr"}, /*order=*/60, load_rf_detr}
        .predicts({Task::object_detection, Task::instance_segmentation},
                  image::DetectionHead::rt_detr)
        .takes_pixel_mask()
        .fused_attention(rf_detr::kFusedAttentionDefault)
        .layouts({{"qkv_concat",
                   {"RfDetrDinov2SelfAttention", "RfDetrDinov2Attention"},
                   "",
                   path_with("backbone")},
                  {"qkv_concat", {"RfDetrAttention"}}},
                 {"qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
