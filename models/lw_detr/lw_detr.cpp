// LwDetrForObjectDetection (transformers 5.17), inference only; every step keeps transformers'
// operation order so that float32 results match.

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
#include "models/lw_detr/config.h"
#include "models/lw_detr/decoder.h"
#include "models/lw_detr/projector.h"
#include "models/lw_detr/two_stage.h"
#include "models/lw_detr/vit_backbone.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace lw_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// The module tree with the on-disk names ("model.*", "class_embed.*", "bbox_embed.*").
class LwDetrImpl : public torch::nn::Module {
 public:
  explicit LwDetrImpl(const Config& c) : config(c) {
    const int64_t d = c.detr.d_model;
    auto model = register_module("model", make<torch::nn::Module>());
    auto conv_encoder = model->register_module("backbone", make<torch::nn::Module>());
    backbone = conv_encoder->register_module("backbone", make<ViTBackboneImpl>(c.backbone));
    projector = conv_encoder->register_module(
        "projector", make<MultiScaleProjectorImpl>(c.detr, backbone->channels()));
    decoder = model->register_module("decoder", make<DecoderImpl>(c.detr));
    selection = std::make_unique<QuerySelection>(*model, c.detr);
    class_embed = register_module("class_embed", make<layers::LinearImpl>(d, c.detr.num_labels));
    bbox_embed =
        register_module("bbox_embed", make<layers::MLPImpl>(d, d, 4, 3, layers::Activation::relu));
  }

  /// pixel_values (B, 3, H, W), pixel_mask (B, H, W) (nonzero = valid) or undefined (no
  /// padding: the masks, valid ratios and proposals' validity are then not computed).
  /// Returns logits (B, Q, num_labels) and pred_boxes (B, Q, 4).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const at::Tensor& pixel_mask) const {
    const auto sources =
        projector->forward(backbone->forward(pixel_values, projector->channels_last()));
    kernels::SpatialShapes shapes;
    std::vector<at::Tensor> source_flat, mask_flat, ratios;
    for (const auto& s : sources) {
      shapes.push_back({s.size(2), s.size(3)});
      source_flat.push_back(s.flatten(2).transpose(1, 2));
      if (!pixel_mask.defined()) continue;
      const auto m =
          at::upsample_nearest2d(pixel_mask.unsqueeze(0).to(at::kFloat), {s.size(2), s.size(3)})
              .to(at::kBool)
              .squeeze(0);
      mask_flat.push_back(m.flatten(1));
      ratios.push_back(m);
    }
    const auto memory = at::cat(source_flat, 1);
    at::Tensor mask, valid_ratios;
    if (pixel_mask.defined()) {
      mask = at::cat(mask_flat, 1);
      for (auto& m : ratios) m = deformable_detr::valid_ratio(m, memory.scalar_type());
      valid_ratios = at::stack(ratios, 1);  // (B, L, 2)
    }
    const auto queries = selection->forward(memory, mask, shapes);
    const auto h = decoder->forward(queries.target, queries.reference_points, valid_ratios, memory,
                                    mask, shapes);
    const auto logits = class_embed->forward(h);
    const auto boxes = refine_boxes(queries.reference_points, bbox_embed->forward(h));
    return {logits, boxes};
  }

  Config config;
  std::shared_ptr<ViTBackboneImpl> backbone;
  std::shared_ptr<MultiScaleProjectorImpl> projector;
  std::shared_ptr<DecoderImpl> decoder;
  std::unique_ptr<QuerySelection> selection;
  layers::Linear class_embed;
  layers::MLP bbox_embed;
};

class LwDetrModel : public ModuleModel<LwDetrImpl> {
 public:
  LwDetrModel(std::shared_ptr<LwDetrImpl> net, const LoadOptions& options)
      : ModuleModel("lw_detr", Task::object_detection, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const auto& b = net_->config.backbone;
    const at::Tensor x =
        checked_input(pixel_values, b.num_channels, b.patch_size * b.num_windows_side);
    // No mask: no padding, the unmasked path (LwDetrImpl::forward).
    const at::Tensor mask =
        pixel_mask.defined() ? core::checked_pixel_mask("lw_detr", x, pixel_mask, options_.device)
                             : at::Tensor();
    auto [logits, boxes] = net_->forward(x, mask);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }
};

}  // namespace
}  // namespace lw_detr

namespace {

/// Default of the attention modules' `fused_attn` flag (backbone and decoder self-attention).
/// Manual math, as every family (tests/parity/lw_detr_parity_test.cpp measures both paths).
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "lw_detr" (`config` is the parsed
/// config.json). Every checkpoint key must be used and every module key present (the ViT
/// attention may carry save_pretrained's names, attention.attention.query / attention.output,
/// or transformers 5's, attention.q_proj / attention.o_proj). Throws core::ConfigError /
/// core::CheckpointError (std::runtime_error) naming the file and the field or tensor keys.
std::unique_ptr<Model> load_lw_detr(const std::string& dir, const nlohmann::json& config,
                                    const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = lw_detr::parse_config(view);
  auto net = std::make_shared<lw_detr::LwDetrImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  rules.aliases = [](const std::string& key) {
    std::vector<std::string> out;
    auto alt = lw_detr::vit_attention_alias(key);
    if (!alt.empty()) out.push_back(std::move(alt));
    return out;
  };
  core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<lw_detr::LwDetrModel>(std::move(net), options);
}

// LW-DETR (Chen et al., "LW-DETR: A Transformer Replacement to YOLO for Real-Time Detection",
// 2024) as transformers 5.17 LwDetrForObjectDetection (models/lw_detr/modeling_lw_detr.py),
// inference only: ViT backbone (vit_backbone.h), multi-scale C2F projector (projector.h),
// two-stage query selection (two_stage.h), deformable decoder (decoder.h), class and box heads.
// Pre-processing is DeformableDetrImageProcessor's (transformers' auto mapping for "lw_detr"),
// post-processing DeformableDetr's post_process_object_detection (image::DetectionHead::
// deformable_detr). forward() takes pixel_values (B, 3, H, W) with H and W multiples of
// patch_size * sqrt(num_windows), and an optional pixel_mask (B, H, W) integer or bool; it
// returns logits (B, num_queries, num_labels) and pred_boxes (B, num_queries, 4) (cx, cy, w, h
// normalised), float32.
//
// Layout classes: the projector's ConvNorms (conv + BatchNorm2d), the ViT backbone's attention,
// then the decoder self-attention. channels_last (CUDA, 16-bit or TF32: layouts::on_by_default)
// takes the projector's convolutions, and the backbone then hands its maps over as channels_last
// rows instead of transposing them into NCHW: LW-DETR small bf16 batch 32 7.21 against 7.64 ms
// on an H100 (docs/BENCHMARKS.md, "The attention slot's small-head kernel").
const FamilyRegistrar registered{
    Family{"lw_detr", {"lw_detr"}, /*order=*/50, load_lw_detr}
        .predicts({Task::object_detection}, image::DetectionHead::deformable_detr)
        .takes_pixel_mask()
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"LwDetrConvNormLayer"}},
                  {"qkv_concat", {"LwDetrViTAttention"}, "", path_with("backbone")},
                  {"qkv_concat", {"LwDetrAttention"}}},
                 {"batchnorm_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
