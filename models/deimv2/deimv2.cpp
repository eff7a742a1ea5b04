// DEIMv2: config parsing, the detector's top level and the loader (modeling_deimv2.py
// Deimv2Model / Deimv2ForObjectDetection, transformers 5.17).

#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>

#include "log/log.h"
#include "models/deimv2/modules.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace deimv2 {

Config Config::parse(const core::ConfigView& cfg) {
  Config c;
  cfg.get_enum("model_type", "", {"deimv2"});
  const auto backbone = cfg.has("backbone_config")
                            ? cfg.child("backbone_config").get_string("model_type", "hgnet_v2")
                            : std::string("hgnet_v2");
  if (backbone != "hgnet_v2" && backbone != "dinov3_vit")
    cfg.child("backbone_config")
        .fail("model_type",
              "unsupported DEIMv2 backbone \"" + backbone + "\" (supported: hgnet_v2, dinov3_vit)");
  c.lite = cfg.get_enum("encoder_type", "hybrid", {"hybrid", "lite"}) == "lite";
  // "cat" cannot run upstream either: Deimv2RepNCSPELAN5 takes encoder_hidden_dim channels.
  cfg.get_enum("encoder_fuse_op", "sum", {"sum"});
  c.use_gateway = cfg.get_bool("use_gateway", c.use_gateway);
  c.share_bbox_head = cfg.get_bool("share_bbox_head", c.share_bbox_head);
  c.trailing_conv = cfg.get_bool("encoder_has_trailing_conv", c.trailing_conv);
  if (backbone == "dinov3_vit") {
    if (c.lite)
      cfg.fail("encoder_type",
               "the lite encoder on a dinov3_vit backbone is not implemented (the published "
               "DINOv3 variants use the hybrid encoder)");
    c.dinov3 = Dinov3Config::parse(cfg);
    // Deimv2DINOv3ConvEncoder's 3 maps stand where HGNetV2's out_indices would.
    c.backbone.out_indices = c.dinov3->out_indices;
    c.backbone.num_channels = c.dinov3->num_channels;
  }
  dfine::Config::parse_fields(cfg, c, /*hybrid_levels=*/!c.lite, /*hgnet_backbone=*/!c.dinov3);
  if (c.lite) {
    // Deimv2LiteEncoder: identity conv_encoder projections, two output levels.
    if (c.backbone.out_channels() != c.encoder_in_channels)
      cfg.fail("encoder_in_channels", "must equal the backbone's output channels " +
                                          core::shape_string(c.backbone.out_channels()) +
                                          " (the lite encoder has no input projection)");
    if (c.decoder_in_channels.size() != 2)
      cfg.fail("decoder_in_channels", "needs 2 entries (the lite encoder's two levels)");
    const auto strides = c.backbone.out_strides();
    if (strides.size() > 1 && strides[1] != 2 * strides[0])
      cfg.fail("backbone_config",
               "the lite encoder needs the second map at twice the first's stride");
  }
  return c;
}

std::vector<int64_t> Config::backbone_strides() const {
  if (dinov3) return {8, 16, 32};
  return backbone.out_strides();
}

DetectorImpl::DetectorImpl(const Config& c) : config_(c) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  const int64_t e = c.encoder_hidden_dim, d = c.d_model;
  std::shared_ptr<torch::nn::Module> conv_encoder;
  if (c.dinov3) {
    // No encoder_input_proj: fusion_proj already makes encoder_hidden_dim channels.
    dinov3_ = model->register_module("conv_encoder",
                                     std::make_shared<Dinov3ConvEncoderImpl>(c, *c.dinov3));
  } else {
    conv_encoder = model->register_module("conv_encoder", std::make_shared<torch::nn::Module>());
    backbone_ =
        conv_encoder->register_module("model", std::make_shared<dfine::BackboneImpl>(c.backbone));
  }
  if (c.lite) {
    lite_ = model->register_module("encoder", std::make_shared<LiteEncoderImpl>(c));
  } else if (!c.dinov3) {
    std::vector<layers::ConvNorm> proj;
    for (auto channels : c.backbone.out_channels())
      proj.push_back(rtdetr::conv_norm(c, channels, e, 1, 1, Activation::none));
    encoder_input_proj_ = layers::register_list(*conv_encoder, "encoder_input_proj", proj);
  }
  if (!c.lite)
    hybrid_ = model->register_module(
        "encoder", std::make_shared<rtdetr::HybridEncoderImpl>(c, deimv2_ccfm(c)));
  heads_ = rtdetr::register_query_selection(*model, c);
  // decoder_input_proj: identity (no keys) when d_model == decoder_in_channels[-1]; otherwise
  // Deimv2ConvNormLayers reading decoder_in_channels[-1], 3x3 stride 2 for the extra levels.
  const int64_t in = c.decoder_in_channels.back();
  if (d != in) {
    std::vector<layers::ConvNorm> proj;
    for (int64_t i = 0; i < c.num_feature_levels; ++i) {
      const bool extra = i >= static_cast<int64_t>(c.decoder_in_channels.size());
      proj.push_back(rtdetr::conv_norm(c, in, d, extra ? 3 : 1, extra ? 2 : 1, Activation::none));
    }
    decoder_input_proj_ = layers::register_list(*model, "decoder_input_proj", proj);
  }
  decoder_ = model->register_module("decoder", make_decoder(c));
}

std::pair<at::Tensor, at::Tensor> DetectorImpl::forward(const at::Tensor& pixel_values) const {
  std::vector<at::Tensor> maps;
  if (dinov3_)
    return dfine::decode(config_, hybrid_->forward(dinov3_->forward(pixel_values)),
                         decoder_input_proj_, heads_, *decoder_);
  const auto feats = backbone_->forward(pixel_values);
  if (lite_) {
    maps = lite_->forward(feats);
  } else {
    for (size_t i = 0; i < feats.size(); ++i)
      maps.push_back(encoder_input_proj_[i]->forward(feats[i]));
    maps = hybrid_->forward(std::move(maps));
  }
  return dfine::decode(config_, maps, decoder_input_proj_, heads_, *decoder_);
}

namespace {

/// share_bbox_head: the one bbox_embed MLP is stored once, under whichever index
/// save_pretrained kept (the last one in transformers 5.17); our module key is index 0.
std::function<std::vector<std::string>(const std::string&)> shared_box_aliases(
    std::function<std::vector<std::string>(const std::string&)> base, int64_t layers) {
  return [base, layers](const std::string& key) {
    static const std::string prefix = "model.decoder.bbox_embed.0.";
    if (key.rfind(prefix, 0) != 0) return base(key);
    const std::string tail = key.substr(prefix.size());
    std::vector<std::string> out;
    for (int64_t i = layers - 1; i >= 0; --i) {
      out.push_back("model.decoder.bbox_embed." + std::to_string(i) + "." + tail);
      out.push_back("bbox_embed." + std::to_string(i) + "." + tail);
    }
    return out;
  };
}

}  // namespace
}  // namespace deimv2

namespace {

/// Default of every DEIMv2 attention module's `fused_attn` flag (AIFI encoder layer, decoder
/// self-attention), measured as for D-FINE (tests/parity/deimv2_parity_test.cpp prints it):
/// SDPA is not byte-exact with the manual math, so: manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "deimv2" (`config` is the parsed
/// config.json). Every checkpoint key must be used and every module key found. Throws
/// std::runtime_error (core::ConfigError naming config.json and the field, e.g. an unsupported
/// backbone_config.model_type; core::CheckpointError naming the file and the missing /
/// unexpected keys).
std::unique_ptr<Model> load_deimv2(const std::string& dir, const nlohmann::json& config,
                                   const LoadOptions& options) {
  const core::ConfigView cfg(config, dir + "/config.json");
  const auto c = deimv2::Config::parse(cfg);
  const bool tie = cfg.get_bool("tie_word_embeddings", true);
  auto labels = cfg.id2label();

  auto net = std::make_shared<deimv2::DetectorImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  auto rules = dfine::load_rules(tie);
  if (c.share_bbox_head) {
    rules.aliases = deimv2::shared_box_aliases(rules.aliases, c.decoder_layers);
    // The other indices, where present, are copies of the tied module.
    rules.ignored_file_keys.push_back(R"((model\.decoder\.)?bbox_embed\.\d+\..*)");
  }
  const auto report = core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  net->prepare();
  log::debug(c10::str(dir, ": loaded ", report.loaded, " tensors as deimv2 (",
                      report.aliased.size(), " aliased, ", report.ignored.size(), " ignored)"));
  // Lite: the first backbone map's stride and twice it; hybrid: the backbone's strides.
  auto strides = c.backbone_strides();
  if (c.lite) strides = {strides.front(), 2 * strides.front()};
  auto geometry = dfine::detector_geometry(c, strides);
  return std::make_unique<rtdetr::DetectorModel<deimv2::DetectorImpl>>(
      "deimv2", std::move(geometry), std::move(net), std::move(labels), options);
}

/// Under DEIMv2's HGNetV2 backbone, "model.conv_encoder.model" (Deimv2ConvEncoder; the DINOv3
/// ViT of Deimv2DINOv3ConvEncoder is "model.conv_encoder.backbone").
bool in_hgnet(const std::string& path) { return path.rfind("model.conv_encoder.model.", 0) == 0; }

// DEIMv2 (Huang et al., "Real-Time Object Detection Meets DINOv3", 2025) as transformers 5.17
// Deimv2ForObjectDetection with the HGNetV2 backbone and the hybrid or lite encoder, or the
// DINOv3 backbone (Deimv2DINOv3ConvEncoder, models/deimv2/dinov3_backbone.h) and the hybrid
// encoder (modeling_deimv2.py; DINOv3 with the lite encoder is a load error). forward() takes
// pixel_values (B, 3, H, W); it returns logits (B, num_queries, num_labels) and pred_boxes
// (B, num_queries, 4), float32. Post-processing as D-FINE's (RTDetrImageProcessor).
const FamilyRegistrar registered{
    Family{"deimv2", {"deimv2"}, /*order=*/40, load_deimv2}
        .predicts({Task::object_detection}, image::DetectionHead::rt_detr)
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"HGNetV2ConvLayer"}, "", in_hgnet},
                  {"batchnorm_fold", {"Deimv2ConvNormLayer"}},
                  {"repvgg", {"Deimv2RepVggBlock"}},
                  {"qkv_concat", {"DINOv3ViTAttention"}, "", path_with("backbone")},
                  {"qkv_concat", {"Deimv2SelfAttention"}}},
                 {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
