// DetrForSegmentation (see detr_segmentation.h): transformers 5.17 modeling_detr.py
// DetrForSegmentation, DetrMHAttentionMap, DetrMaskHeadSmallConv, inference only.

#include "models/detr/detr_segmentation.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <stdexcept>

#include "models/core/pixel_mask.h"
#include "models/module_model.h"

namespace libreyolo::models::detr {
namespace {

layers::Conv2d conv(int64_t in, int64_t out, int64_t kernel) {
  layers::Conv2dOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.padding = kernel / 2;
  o.bias = true;
  return make<layers::Conv2dImpl>(o);
}

/// The lowest value of `dtype` (torch.finfo(dtype).min): the bbox attention's padding bias.
double lowest(at::ScalarType dtype) {
  return dtype == at::kHalf       ? -65504.0
         : dtype == at::kBFloat16 ? -3.3895313892515355e38
                                  : std::numeric_limits<float>::lowest();
}

}  // namespace

AttentionMapImpl::AttentionMapImpl(int64_t d_model, int64_t h) : heads(h) {
  q_linear = register_module("q_linear", make<layers::LinearImpl>(d_model, d_model));
  k_linear = register_module("k_linear", make<layers::LinearImpl>(d_model, d_model));
}

at::Tensor AttentionMapImpl::forward(const at::Tensor& hidden, const at::Tensor& memory,
                                     const at::Tensor& valid) const {
  const int64_t B = hidden.size(0), Q = hidden.size(1), D = hidden.size(2);
  const int64_t hd = D / heads, h = memory.size(2), w = memory.size(3);
  const double scaling = 1.0 / std::sqrt(static_cast<double>(hd));
  const auto q = q_linear->forward(hidden).view({B, Q, heads, hd});
  // k_proj as a 1x1 convolution over the memory map (upstream's conv2d with the linear's weight).
  const auto k = at::conv2d(memory, k_linear->weight.unsqueeze(-1).unsqueeze(-1), k_linear->bias)
                     .view({B, heads, hd, h, w});
  const auto query = q.transpose(1, 2).contiguous().view({B * heads, Q, hd});
  const auto key = k.permute({0, 1, 3, 4, 2}).contiguous().view({B * heads, h * w, hd});
  auto weights =
      at::matmul(query * scaling, key.transpose(1, 2)).view({B, heads, Q, h, w}).transpose(1, 2);
  const auto bias =
      at::zeros({B, 1, 1, h, w}, weights.options())
          .masked_fill(valid.logical_not().view({B, 1, 1, h, w}), lowest(weights.scalar_type()));
  weights = weights + bias;
  return at::softmax(weights.flatten(2), -1).view(weights.sizes());
}

MaskHeadImpl::MaskHeadImpl(int64_t d, int64_t heads, const std::vector<int64_t>& fpn,
                           layers::Activation a)
    : act(a) {
  const int64_t in = d + heads;
  if (in % 8 != 0)
    throw std::invalid_argument(
        c10::str("DetrMaskHeadSmallConv: d_model + heads (", in, ") must be divisible by 8"));
  if (d < 16) throw std::invalid_argument("DetrMaskHeadSmallConv: d_model must be at least 16");
  const std::vector<int64_t> outs{in, d / 2, d / 4, d / 8, d / 16};
  int64_t prev = in;
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto n = std::to_string(i + 1);
    lays.push_back(register_module("lay" + n, conv(prev, outs[i], 3)));
    gns.push_back(register_module(
        "gn" + n, make<layers::GroupNormImpl>(std::min<int64_t>(8, outs[i]), outs[i])));
    prev = outs[i];
  }
  for (size_t i = 0; i < 3; ++i)
    adapters.push_back(
        register_module("adapter" + std::to_string(i + 1), conv(fpn[i], outs[i + 1], 1)));
  out_lay = register_module("out_lay", conv(outs.back(), 1, 3));
}

at::Tensor MaskHeadImpl::forward(const at::Tensor& projected, const at::Tensor& attention,
                                 const std::vector<at::Tensor>& fpn) const {
  const int64_t B = attention.size(0), Q = attention.size(1);
  // Each query sees the same features: (B, ...) -> (B * Q, ...), batch-major as upstream.
  auto per_query = [Q](const at::Tensor& t) { return t.repeat_interleave(Q, 0); };
  auto block = [this](size_t i, const at::Tensor& x) {
    return layers::activate(act, gns[i]->forward(lays[i]->forward(x)));
  };
  auto x = at::cat({per_query(projected), attention.flatten(0, 1)}, 1);
  x = block(1, block(0, x));
  for (size_t i = 0; i < 3; ++i) {
    // DetrFPNFusionStage: the adapter over the stage's map, the running map upsampled to it.
    const auto f = per_query(adapters[i]->forward(fpn[i]));
    x = block(i + 2, f + at::upsample_nearest2d(x, {f.size(2), f.size(3)}));
  }
  const auto out = out_lay->forward(x);
  return out.view({B, Q, out.size(2), out.size(3)});
}

DetrSegmentationImpl::DetrSegmentationImpl(const Config& c) : config(c) {
  detr = register_module("detr", make<DetrImpl>(c, "detr"));
  bbox_attention =
      register_module("bbox_attention", make<AttentionMapImpl>(c.d_model, c.encoder_heads));
  const auto& outs = c.timm_backbone.outs;
  mask_head = register_module(
      "mask_head", make<MaskHeadImpl>(c.d_model, c.encoder_heads,
                                      std::vector<int64_t>{outs[2], outs[1], outs[0]}, c.act));
}

std::pair<DetrForwardResult, at::Tensor> DetrSegmentationImpl::forward(
    const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const {
  const auto stages = detr->stem.timm_backbone->forward_stages(pixel_values);
  auto r =
      detr->forward(detr->stem.from_feature(stages.back(), pixel_mask), pixel_values.scalar_type());
  const int64_t B = r.memory.size(0), D = r.memory.size(2);
  const int64_t h = r.stem.mask.size(1), w = r.stem.mask.size(2);
  const auto memory = r.memory.transpose(1, 2).reshape({B, D, h, w});
  const auto projected = r.stem.source.transpose(1, 2).reshape({B, D, h, w});
  const auto attention = bbox_attention->forward(r.hidden, memory, r.stem.mask);
  auto masks = mask_head->forward(projected, attention, {stages[2], stages[1], stages[0]});
  return {std::move(r), std::move(masks)};
}

bool is_segmentation_checkpoint(const nlohmann::json& config, const core::SafetensorsFile& file) {
  const auto it = config.find("architectures");
  if (it != config.end() && it->is_array() && !it->empty()) {
    for (const auto& a : *it)
      if (a.is_string() && a.get<std::string>() == "DetrForSegmentation") return true;
    return false;
  }
  return file.contains("detr.class_labels_classifier.weight");
}

namespace {

class SegmentationModel : public ModuleModel<DetrSegmentationImpl> {
 public:
  SegmentationModel(std::shared_ptr<DetrSegmentationImpl> net, const LoadOptions& options)
      : ModuleModel("detr", Task::panoptic_segmentation, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.num_channels);
    const at::Tensor mask = core::checked_pixel_mask(model_type_, x, pixel_mask, options_.device);
    auto [r, masks] = net_->forward(x, mask);
    ModelOutput out;
    out.logits = r.logits.to(at::kFloat);
    out.pred_boxes = r.pred_boxes.to(at::kFloat);
    out.pred_masks = masks.to(at::kFloat);
    return out;
  }
};

/// Learned position embeddings of transformers 4 checkpoints (DetrConvModel) under
/// detr.model.backbone.position_embedding (position_embedding_load_rules, under "detr.").
core::LoadRules segmentation_load_rules() {
  core::LoadRules rules;
  rules.aliases = [](const std::string& key) {
    static const std::string prefix = "detr.model.position_embedding.";
    std::vector<std::string> out;
    if (key.rfind(prefix, 0) == 0)
      out.push_back("detr.model.backbone.position_embedding." + key.substr(prefix.size()));
    return out;
  };
  return rules;
}

}  // namespace

std::unique_ptr<Model> load_segmentation(const std::string& dir, const core::ConfigView& view,
                                         const core::SafetensorsFile& file,
                                         const LoadOptions& options, bool fused_attention) {
  auto c = parse_config(view);
  if (!c.timm)
    view.fail("backbone_config",
              "DetrForSegmentation needs timm's ResNet backbone (use_timm_backbone, as "
              "facebook/detr-resnet-50-panoptic): transformers' ResNetBackbone is not supported");
  if (c.timm_last_stage != 4)
    view.fail("backbone_config", "DetrForSegmentation needs the four stages (out_indices 1-4)");
  c.timm_backbone = read_timm_resnet_config(file, std::string("detr.") + kBackbonePrefix,
                                            c.num_channels, c.timm_last_stage, c.timm_name);
  c.timm_backbone.output_stride = c.timm_output_stride;
  if (c.d_model < 16 || (c.d_model + c.encoder_heads) % 8 != 0)
    view.fail("d_model",
              "DetrForSegmentation's mask head needs d_model >= 16 and d_model + "
              "encoder_attention_heads divisible by 8");
  auto net = std::make_shared<DetrSegmentationImpl>(c);
  core::load_state_dict(*net, file, segmentation_load_rules(), options.dtype, options.device);
  layers::set_fused_attention(*net, fused_attention);
  return std::make_unique<SegmentationModel>(std::move(net), options);
}

}  // namespace libreyolo::models::detr
