// PP-DocLayoutV2: config parsing, the detector's top level (RT-DETR's outputs sorted kept-first,
// then the reading order), the Model and the loader (modular_pp_doclayout_v2.py
// PPDocLayoutV2ForObjectDetection, transformers 5.17).

#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>

#include "log/log.h"
#include "models/core/state_dict.h"
#include "models/pp_doclayout_v2/modules.h"
#include "models/registry/family.h"
#include "models/rtdetr/detector_model.h"

namespace libreyolo::models {
namespace pp_doclayout_v2 {

Config Config::parse(const core::ConfigView& cfg) {
  Config c;
  parse_detector(cfg, c, "pp_doclayout_v2", "PPDocLayoutV2Config", 0);
  if (c.num_feature_levels != static_cast<int64_t>(c.decoder_in_channels.size()))
    cfg.fail("num_feature_levels",
             "must equal len(decoder_in_channels) (extra levels are not "
             "supported for this family)");
  // forward() indexes both lists by class id: upstream's torch.tensor(None) fails without them.
  const std::string per_label =
      "needs at least one entry per label (" + std::to_string(c.num_labels) + ")";
  if (!cfg.has("class_thresholds") || cfg.raw("class_thresholds").is_null())
    cfg.fail("class_thresholds", "is required (the per-class score thresholds)");
  c.class_thresholds = cfg.get_double_list("class_thresholds");
  if (static_cast<int64_t>(c.class_thresholds.size()) < c.num_labels)
    cfg.fail("class_thresholds", per_label);
  if (!cfg.has("class_order") || cfg.raw("class_order").is_null())
    cfg.fail("class_order", "is required (the reading-order category of each class)");
  c.class_order = cfg.get_int_list("class_order");
  if (static_cast<int64_t>(c.class_order.size()) < c.num_labels) cfg.fail("class_order", per_label);
  if (!cfg.has("reading_order_config"))
    cfg.fail("reading_order_config", "is required (PPDocLayoutV2ReadingOrderConfig; write it out)");
  c.reading_order = ReadingOrderConfig::parse(cfg.child("reading_order_config"));
  for (auto k : c.class_order)
    if (k < 0 || k >= c.reading_order.num_classes)
      cfg.fail("class_order", "entries must be in [0, reading_order_config.num_classes " +
                                  std::to_string(c.reading_order.num_classes) + ")");
  // Position ids reach num_queries + 2 + pad_token_id (start, every query kept, end).
  if (c.num_queries + 2 + c.reading_order.pad_token_id >= c.reading_order.max_position_embeddings)
    cfg.fail("reading_order_config",
             "max_position_embeddings must exceed num_queries + 2 + pad_token_id (" +
                 std::to_string(c.num_queries + 2 + c.reading_order.pad_token_id) + ")");
  return c;
}

namespace {

rtdetr::Backbone hgnetv2_backbone(const Config& c) {
  // PPDocLayoutV2ConvEncoder: the HGNetV2Backbone below "model.backbone.model".
  auto encoder = std::make_shared<torch::nn::Module>();
  auto net = encoder->register_module("model", std::make_shared<dfine::BackboneImpl>(c.backbone));
  return {encoder, [net](const at::Tensor& x) { return net->forward(x); },
          c.backbone.out_channels()};
}

}  // namespace

DetectorImpl::DetectorImpl(const Config& c) : rtdetr::DetectorImpl(c, hgnetv2_backbone(c)) {
  reading_order_ =
      register_module("reading_order", std::make_shared<ReadingOrderImpl>(c.reading_order));
  std::vector<float> thresholds(c.class_thresholds.begin(), c.class_thresholds.end());
  threshold_bits_ = register_buffer(
      "class_threshold_bits",
      at::from_blob(thresholds.data(), {static_cast<int64_t>(thresholds.size())}, at::kFloat)
          .view(at::kInt)
          .clone());
  class_order_ = register_buffer("class_order", at::tensor(c.class_order, at::kLong));
}

ModelOutput DetectorImpl::forward(const at::Tensor& pixel_values) const {
  const auto [all_logits, raw_boxes] = rtdetr::DetectorImpl::forward(pixel_values);
  const int64_t C = all_logits.size(-1);
  const at::Tensor centers = raw_boxes.narrow(-1, 0, 2), sizes = raw_boxes.narrow(-1, 2, 2);
  const at::Tensor boxes =
      (at::cat({centers - 0.5 * sizes, centers + 0.5 * sizes}, -1) * 1000).clamp(0.0, 1000.0);
  const auto [best, class_ids] = all_logits.max(-1);
  const at::Tensor thresholds =
      threshold_bits_.view(at::kFloat).index_select(0, class_ids.flatten()).view_as(class_ids);
  const at::Tensor mask = best.sigmoid() >= thresholds;
  // torch.argsort(mask.int(), dim=1, descending=True): not stable, so the order among equal
  // keys is ATen's sort's (introsort above 16 queries on CPU); the same call here.
  const at::Tensor order = at::argsort(mask.to(at::kInt), 1, /*descending=*/true);
  const at::Tensor order4 = order.unsqueeze(-1).expand({-1, -1, 4});
  const at::Tensor kept = mask.gather(1, order);
  ModelOutput out;
  out.logits = all_logits.gather(1, order.unsqueeze(-1).expand({-1, -1, C}));
  out.pred_boxes = raw_boxes.gather(1, order4);
  const at::Tensor reading_boxes =
      at::where(kept.unsqueeze(-1), boxes.gather(1, order4), at::zeros({}, boxes.options()));
  const at::Tensor reading_ids =
      at::where(kept, class_ids.gather(1, order), at::zeros({}, class_ids.options()));
  out.order_logits = reading_order_->forward(
      reading_boxes, class_order_.index_select(0, reading_ids.flatten()).view_as(reading_ids),
      mask);
  return out;
}

}  // namespace pp_doclayout_v2

namespace {

/// Default of the attention modules' `fused_attn` flag: manual math, as RT-DETR's (the fixture
/// is not byte-exact under SDPA: tests/parity/pp_doclayout_v2_parity_test.cpp measures it).
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "pp_doclayout_v2". Throws
/// std::runtime_error (core::ConfigError / core::CheckpointError) naming config.json and the
/// field, or the checkpoint and key.
std::unique_ptr<Model> load_pp_doclayout_v2(const std::string& dir, const nlohmann::json& config,
                                            const LoadOptions& options) {
  const core::ConfigView cfg(config, dir + "/config.json");
  const auto c = pp_doclayout_v2::Config::parse(cfg);
  auto labels = cfg.id2label();
  auto net = std::make_shared<pp_doclayout_v2::DetectorImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  // Unused at inference: the denoising embedding (training only); the spatial-bias tables
  // LayoutLMv3 would use, which PP-DocLayoutV2's encoder replaces by rel_bias_module (upstream
  // lists them in _keys_to_ignore_on_load_missing: files may lack them).
  rules.ignored_file_keys = {R"(model\.denoising_class_embed\.weight)",
                             R"(reading_order\.encoder\.rel_pos_[xy]_bias\.weight)"};
  // Not on disk: the config's class_thresholds / class_order as buffers.
  rules.optional_module_keys = {"class_threshold_bits", "class_order"};
  rules.aliases = rtdetr::head_aliases(false);
  const auto report = core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  log::debug(c10::str(dir, ": loaded ", report.loaded, " tensors as pp_doclayout_v2 (",
                      report.aliased.size(), " aliased, ", report.ignored.size(), " ignored)"));
  rtdetr::DetectorGeometry geometry;
  geometry.num_channels = c.num_channels;
  geometry.stride = c.backbone.out_strides().back();
  geometry.num_queries = c.num_queries;
  geometry.encoder_tokens = [strides = c.backbone.out_strides()](int64_t H, int64_t W) {
    int64_t tokens = 0;
    for (auto s : strides) tokens += (H / s) * (W / s);
    return tokens;
  };
  return std::make_unique<rtdetr::DetectorModel<pp_doclayout_v2::DetectorImpl>>(
      "pp_doclayout_v2", std::move(geometry), std::move(net), std::move(labels), options);
}

/// encoder_input_proj / decoder_input_proj: nn.Sequential(nn.Conv2d, nn.BatchNorm2d) upstream.
bool input_proj(const std::string& path) {
  return path_has_segment(path, "encoder_input_proj") ||
         path_has_segment(path, "decoder_input_proj");
}

// PP-DocLayoutV2 (PaddlePaddle's document layout detector: RT-DETR with an HGNetV2 backbone,
// then a LayoutLMv3-style pointer network ordering the kept detections) as transformers 5.17
// PPDocLayoutV2ForObjectDetection. forward() takes pixel_values (B, 3, H, W); it returns logits
// (B, Q, num_labels), pred_boxes (B, Q, 4) and order_logits (B, Q, Q), float32, the queries
// sorted kept-first as upstream; post-processing: image::post_process_document_layout without
// masks (PPDocLayoutV2ImageProcessor).
const FamilyRegistrar registered{
    Family{"pp_doclayout_v2", {"pp_doclayout_v2"}, /*order=*/34, load_pp_doclayout_v2}
        .predicts({Task::object_detection}, image::DetectionHead::pp_doclayout_v2)
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"Sequential"}, "", input_proj},
                  {"batchnorm_fold", {"HGNetV2ConvLayer"}, "", path_with("backbone")},
                  {"batchnorm_fold", {"PPDocLayoutV2ConvNormLayer"}},
                  {"repvgg", {"PPDocLayoutV2RepVggBlock"}},
                  {"qkv_concat",
                   {"PPDocLayoutV2ReadingOrderSelfAttention"},
                   "",
                   path_with("reading_order")},
                  {"qkv_concat", {"PPDocLayoutV2SelfAttention"}}},
                 {},
                 // bfloat16 / float16 only: folded, the float32 reading-order logits move by
                 // ~1e-4 (DESIGN.md "Layouts"); measured on the H200, docs/BENCHMARKS.md.
                 {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
