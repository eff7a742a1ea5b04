// PP-DocLayoutV3: config parsing, the detector's top level, the Model wrapper and the loader
// (modeling_pp_doclayout_v3.py PPDocLayoutV3Model / PPDocLayoutV3ForObjectDetection,
// transformers 5.17).

#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "log/log.h"
#include "models/core/state_dict.h"
#include "models/model.h"
#include "models/pp_doclayout_v3/modules.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace pp_doclayout_v3 {

void HGNetV2DetectorConfig::parse_detector(const core::ConfigView& cfg, HGNetV2DetectorConfig& c,
                                           const std::string& model_type,
                                           const std::string& config_class, size_t skip) {
  cfg.get_enum("model_type", "", {model_type});
  if (cfg.get_bool("use_timm_backbone", false))
    cfg.fail("use_timm_backbone", "timm backbones are not supported (use hgnet_v2)");
  if (!cfg.has("backbone_config"))
    cfg.fail("backbone_config",
             "is required (" + config_class + "'s default is HGNetV2 arch \"L\"; write it out)");
  // V3's stage1 (x4 feature) feeds encoder_mask_lateral by x4_feat_dim, not by hidden_sizes:
  // the Hub's arch "L" config has hidden_sizes[0] 256 against its 128 channels, as transformers
  // accepts.
  c.backbone = dfine::HGNetV2Config::parse(cfg.child("backbone_config"), skip);
  rtdetr::Config::parse_shared(cfg, c);
  c.backbone.frozen_batch_norm = c.freeze_backbone_batch_norms;
  c.num_channels = c.backbone.num_channels;
  c.out_indices = c.backbone.out_indices;
  c.decoder_n_points = cfg.get_int("decoder_n_points", c.decoder_n_points);
  if (c.decoder_n_points <= 0) cfg.fail("decoder_n_points", "must be positive");

  const std::string after = skip ? " after the first (stride-4) one" : "";
  const auto channels = c.backbone.out_channels();
  if (channels.size() != c.encoder_in_channels.size() + skip)
    cfg.fail("encoder_in_channels", "needs one entry per backbone output" + after +
                                        ": backbone out_indices " +
                                        core::shape_string(c.backbone.out_indices));
  for (size_t i = 0; i < c.encoder_in_channels.size(); ++i)
    if (c.encoder_in_channels[i] != channels[i + skip])
      cfg.fail("encoder_in_channels", "entry " + std::to_string(i) +
                                          " must equal the backbone's output channels " +
                                          core::shape_string(channels));
  const auto strides = c.backbone.out_strides();
  for (size_t i = 0; i < c.feat_strides.size(); ++i)
    if (c.feat_strides.size() != c.encoder_in_channels.size() ||
        c.feat_strides[i] != strides[i + skip])
      cfg.fail("feat_strides", std::string("must equal the backbone's output strides") +
                                   (skip ? " after the first " : " ") +
                                   core::shape_string(strides));
  for (auto d : c.decoder_in_channels)
    if (d != c.encoder_hidden_dim)
      cfg.fail("decoder_in_channels", "entries must equal encoder_hidden_dim (" +
                                          std::to_string(c.encoder_hidden_dim) + ")");
}

Config Config::parse(const core::ConfigView& cfg) {
  Config c;
  parse_detector(cfg, c, "pp_doclayout_v3", "PPDocLayoutV3Config", 1);
  c.x4_feat_dim = cfg.get_int("x4_feat_dim", c.x4_feat_dim);
  c.num_prototypes = cfg.get_int("num_prototypes", c.num_prototypes);
  c.mask_feature_channels = cfg.get_int_list("mask_feature_channels", c.mask_feature_channels);
  c.global_pointer_head_size = cfg.get_int("global_pointer_head_size", c.global_pointer_head_size);
  c.mask_enhanced = cfg.get_bool("mask_enhanced", c.mask_enhanced);

  const auto channels = c.backbone.out_channels();
  if (channels[0] != c.x4_feat_dim)
    cfg.fail("x4_feat_dim", "must equal the channels of the first backbone output (" +
                                std::to_string(channels[0]) + ")");
  const auto strides = c.backbone.out_strides();
  if (strides[0] * 2 != strides[1])
    cfg.fail("backbone_config", "the first output must have half the stride of the second");
  for (auto s : c.feat_strides)
    if (s % c.feat_strides.front() != 0 ||
        ((s / c.feat_strides.front()) & (s / c.feat_strides.front() - 1)) != 0)
      cfg.fail("feat_strides", "must be power-of-two multiples of the first");
  if (c.mask_feature_channels.size() != 2 || c.mask_feature_channels[0] <= 0 ||
      c.mask_feature_channels[1] <= 0)
    cfg.fail("mask_feature_channels", "expected two positive channel counts");
  if (c.num_prototypes <= 0) cfg.fail("num_prototypes", "must be positive");
  if (c.global_pointer_head_size <= 0) cfg.fail("global_pointer_head_size", "must be positive");
  if (c.num_feature_levels != static_cast<int64_t>(c.decoder_in_channels.size()))
    cfg.fail("num_feature_levels",
             "must equal len(decoder_in_channels) (upstream builds extra levels from an undefined "
             "mask in this family)");
  return c;
}

DetectorImpl::DetectorImpl(const Config& c) : config_(c) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  auto backbone = model->register_module("backbone", std::make_shared<torch::nn::Module>());
  backbone_ = backbone->register_module("model", std::make_shared<dfine::BackboneImpl>(c.backbone));
  const int64_t e = c.encoder_hidden_dim, d = c.d_model;

  // encoder_input_proj_list[1:]: the stride-4 map has no projection. BatchNorm2d default eps.
  auto in_proj =
      model->register_module("encoder_input_proj", std::make_shared<torch::nn::Module>());
  const auto channels = c.backbone.out_channels();
  for (size_t i = 1; i < channels.size(); ++i)
    encoder_input_proj_.push_back(in_proj->register_module(
        std::to_string(i - 1), layers::sequential_conv_bn(channels[i], e, 1, 1, 0, 1e-5)));
  encoder_ = model->register_module("encoder", std::make_shared<rtdetr::HybridEncoderImpl>(c));
  mask_branch_ = register_mask_branch(*encoder_, c);
  heads_ = rtdetr::register_query_selection(*model, c);

  auto out_proj =
      model->register_module("decoder_input_proj", std::make_shared<torch::nn::Module>());
  for (size_t i = 0; i < c.decoder_in_channels.size(); ++i)
    decoder_input_proj_.push_back(out_proj->register_module(
        std::to_string(i),
        layers::sequential_conv_bn(c.decoder_in_channels[i], d, 1, 1, 0, c.batch_norm_eps)));
  decoder_ = model->register_module("decoder", std::make_shared<DecoderImpl>(c, *model));
}

DecoderOutput DetectorImpl::forward(const at::Tensor& pixel_values) const {
  const auto feats = backbone_->forward(pixel_values);
  std::vector<at::Tensor> proj;
  for (size_t i = 1; i < feats.size(); ++i)
    proj.push_back(encoder_input_proj_[i - 1]->forward(feats[i]));
  const auto pan = encoder_->forward(std::move(proj));
  const at::Tensor mask_feat = mask_branch_.forward(pan, feats[0]);

  std::vector<at::Tensor> sources;
  for (size_t l = 0; l < pan.size(); ++l)
    sources.push_back(decoder_input_proj_[l]->forward(pan[l]));
  kernels::SpatialShapes shapes;
  const at::Tensor source_flatten = rtdetr::flatten_sources(sources, shapes);
  auto [target, reference_unact] = rtdetr::select_queries(config_, heads_, source_flatten, shapes);
  if (config_.mask_enhanced) {
    // Reference boxes: the tight boxes of the selected queries' masks (mask logits > 0).
    const at::Tensor enc_masks = decoder_->masks(target, mask_feat);
    reference_unact = layers::inverse_sigmoid(
        mask_to_box_coordinate(enc_masks.gt(0), reference_unact.scalar_type()));
  }
  return decoder_->forward(target, reference_unact, source_flatten, shapes, mask_feat);
}

}  // namespace pp_doclayout_v3

namespace {

/// Default of the attention modules' `fused_attn` flag: manual math (as RT-DETR's; the fixture
/// is not byte-exact under SDPA).
constexpr bool kFusedAttentionDefault = false;

/// PPDocLayoutV3ForObjectDetection as a Model: logits, pred_boxes, pred_masks (the mask logits,
/// (B, Q, H/4, W/4)) and order_logits (B, Q, Q), all float32.
class DocLayoutModel final : public Model {
 public:
  DocLayoutModel(pp_doclayout_v3::Config config, std::shared_ptr<pp_doclayout_v3::DetectorImpl> net,
                 std::map<int64_t, std::string> labels, LoadOptions options)
      : config_(std::move(config)),
        net_(std::move(net)),
        labels_(std::move(labels)),
        options_(std::move(options)) {}

  std::string model_type() const override { return "pp_doclayout_v3"; }
  Task task() const override { return Task::object_detection; }

  /// pixel_values (B, 3, H, W), H and W multiples of the backbone's largest stride, with at
  /// least num_queries encoder tokens; pixel_mask is ignored (the family never reads it).
  /// Throws std::invalid_argument naming pixel_values otherwise.
  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    const auto strides = config_.backbone.out_strides();
    const int64_t stride = strides.back();
    check_pixel_values(model_type(), pixel_values, config_.num_channels, stride, stride);
    const int64_t H = pixel_values.size(2), W = pixel_values.size(3);
    int64_t tokens = 0;
    for (size_t i = 1; i < strides.size(); ++i) tokens += (H / strides[i]) * (W / strides[i]);
    if (tokens < config_.num_queries)
      throw std::invalid_argument(c10::str("pixel_values: ", H, "x", W, " gives ", tokens,
                                           " encoder tokens, fewer than num_queries ",
                                           config_.num_queries));
    at::NoGradGuard no_grad;
    const auto out = net_->forward(pixel_values.to(options_.device, options_.dtype));
    ModelOutput o;
    o.logits = out.logits.to(at::kFloat);
    o.pred_boxes = out.pred_boxes.to(at::kFloat);
    o.pred_masks = out.masks.to(at::kFloat);
    o.order_logits = out.order_logits.to(at::kFloat);
    return o;
  }

  const std::map<int64_t, std::string>& id2label() const override { return labels_; }
  const LoadOptions& options() const override { return options_; }
  int set_fused_attention(bool enabled) override {
    return layers::set_fused_attention(*net_, enabled);
  }
  torch::nn::Module& root() override { return *net_; }

 private:
  pp_doclayout_v3::Config config_;
  std::shared_ptr<pp_doclayout_v3::DetectorImpl> net_;
  std::map<int64_t, std::string> labels_;
  LoadOptions options_;
};

/// Loads `dir`/model.safetensors for config.json `model_type` "pp_doclayout_v3". Throws
/// std::runtime_error (core::ConfigError / core::CheckpointError) naming config.json and the
/// field, or the checkpoint and key.
std::unique_ptr<Model> load_pp_doclayout_v3(const std::string& dir, const nlohmann::json& config,
                                            const LoadOptions& options) {
  const core::ConfigView cfg(config, dir + "/config.json");
  const auto c = pp_doclayout_v3::Config::parse(cfg);
  const bool tie = cfg.get_bool("tie_word_embeddings", true);
  auto labels = cfg.id2label();

  auto net = std::make_shared<pp_doclayout_v3::DetectorImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  // Unused at inference: the denoising embedding (training only).
  rules.ignored_file_keys = {R"(model\.denoising_class_embed\.weight)"};
  // _tied_weights_keys: decoder.class_embed <- enc_score_head, decoder.bbox_embed <-
  // enc_bbox_head; a tied file holds only the latter.
  if (tie)
    rules.aliases = [](const std::string& key) -> std::vector<std::string> {
      static const std::string cls = "model.decoder.class_embed.",
                               box = "model.decoder.bbox_embed.";
      if (key.rfind(cls, 0) == 0) return {"model.enc_score_head." + key.substr(cls.size())};
      if (key.rfind(box, 0) == 0) return {"model.enc_bbox_head." + key.substr(box.size())};
      return {};
    };
  const auto report = core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  log::debug(c10::str(dir, ": loaded ", report.loaded, " tensors as pp_doclayout_v3 (",
                      report.aliased.size(), " aliased, ", report.ignored.size(), " ignored)"));
  return std::make_unique<DocLayoutModel>(c, std::move(net), std::move(labels), options);
}

/// encoder_input_proj / decoder_input_proj: nn.Sequential(nn.Conv2d, nn.BatchNorm2d) upstream.
bool input_proj(const std::string& path) {
  return path_has_segment(path, "encoder_input_proj") ||
         path_has_segment(path, "decoder_input_proj");
}

/// The mask branch's PPDocLayoutV3ConvLayer modules (ResNetConvLayer upstream).
bool mask_branch(const std::string& path) {
  return path_has_segment(path, "mask_feature_head") ||
         path_has_segment(path, "encoder_mask_lateral") ||
         path_has_segment(path, "encoder_mask_output");
}

// PP-DocLayoutV3 (PaddlePaddle's document layout detector: RT-DETR with an HGNetV2 backbone,
// mask-enhanced query selection, per-query masks and a global-pointer reading order) as
// transformers 5.17 PPDocLayoutV3ForObjectDetection. forward() takes pixel_values (B, 3, H, W);
// it returns logits (B, Q, num_labels), pred_boxes (B, Q, 4), pred_masks (B, Q, H/4, W/4) and
// order_logits (B, Q, Q), float32; post-processing: image::post_process_document_layout.
const FamilyRegistrar registered{
    Family{"pp_doclayout_v3", {"pp_doclayout_v3"}, /*order=*/35, load_pp_doclayout_v3}
        .predicts({Task::object_detection}, image::DetectionHead::pp_doclayout)
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"Sequential"}, "", input_proj},
                  {"batchnorm_fold", {"HGNetV2ConvLayer"}, "", path_with("backbone")},
                  {"batchnorm_fold", {"PPDocLayoutV3ConvLayer"}, "", mask_branch},
                  {"batchnorm_fold", {"PPDocLayoutV3ConvNormLayer"}},
                  {"repvgg", {"PPDocLayoutV3RepVggBlock"}},
                  {"qkv_concat", {"PPDocLayoutV3SelfAttention"}}},
                 {},
                 // bfloat16 / float16 only: folded, the float32 reading-order logits move by
                 // ~1e-4 (DESIGN.md "Layouts"); measured on the H200, docs/BENCHMARKS.md.
                 {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
