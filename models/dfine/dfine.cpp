// D-FINE: config parsing, the detector's top level, the Model wrapper and the loader
// (modeling_d_fine.py DFineModel / DFineForObjectDetection, transformers 5.17).

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "log/log.h"
#include "models/core/state_dict.h"
#include "models/dfine/modules.h"
#include "models/registry/family.h"
#include "models/rtdetr/detector_model.h"

namespace libreyolo::models {
namespace dfine {

Config Config::parse(const core::ConfigView& cfg) {
  Config c;
  cfg.get_enum("model_type", "", {"d_fine"});
  parse_fields(cfg, c);
  return c;
}

void Config::parse_fields(const core::ConfigView& cfg, Config& c, bool hybrid_levels,
                          bool hgnet_backbone) {
  if (cfg.get_bool("use_timm_backbone", false))
    cfg.fail("use_timm_backbone", "timm backbones are not supported (use hgnet_v2)");
  if (hgnet_backbone && cfg.has("backbone_config"))
    c.backbone = HGNetV2Config::parse(cfg.child("backbone_config"));
  rtdetr::Config::parse_shared(cfg, c, hybrid_levels);
  c.backbone.frozen_batch_norm = c.freeze_backbone_batch_norms;
  c.num_channels = c.backbone.num_channels;
  c.out_indices = c.backbone.out_indices;

  // decoder_n_points: one count for every level, or one per level.
  if (cfg.has("decoder_n_points") && cfg.raw("decoder_n_points").is_array()) {
    c.decoder_points = cfg.get_int_list("decoder_n_points");
    if (static_cast<int64_t>(c.decoder_points.size()) != c.num_feature_levels)
      cfg.fail("decoder_n_points", "needs one entry per feature level (num_feature_levels " +
                                       std::to_string(c.num_feature_levels) + ")");
  } else {
    c.decoder_points.assign(c.num_feature_levels, cfg.get_int("decoder_n_points", 4));
  }
  for (auto p : c.decoder_points)
    if (p <= 0) cfg.fail("decoder_n_points", "must be positive, found " + std::to_string(p));
  c.decoder_n_points = c.decoder_points.front();
  c.decoder_offset_scale = cfg.get_double("decoder_offset_scale", 0.5);
  c.decoder_method =
      cfg.get_enum("decoder_method", "default", {"default", "discrete"}) == "discrete"
          ? kernels::SamplingMethod::discrete_per_axis  // what transformers computes
          : kernels::SamplingMethod::bilinear;
  const int64_t eval_idx = cfg.get_int("eval_idx", -1);
  if (eval_idx != -1 && eval_idx != c.decoder_layers - 1)
    cfg.fail("eval_idx",
             "only the last decoder layer (-1) is supported (other values index past "
             "the heads in transformers 5.17), found " +
                 std::to_string(eval_idx));
  c.max_num_bins = cfg.get_int("max_num_bins", c.max_num_bins);
  if (c.max_num_bins < 4 || c.max_num_bins % 2 != 0)
    cfg.fail("max_num_bins",
             "must be even and at least 4, found " + std::to_string(c.max_num_bins));
  c.top_prob_values = cfg.get_int("top_prob_values", c.top_prob_values);
  if (c.top_prob_values < 1 || c.top_prob_values > c.max_num_bins + 1)
    cfg.fail("top_prob_values", "must be in [1, max_num_bins + 1]");
  c.lqe_hidden_dim = cfg.get_int("lqe_hidden_dim", c.lqe_hidden_dim);
  c.lqe_layers = cfg.get_int("lqe_layers", c.lqe_layers);
  if (c.lqe_hidden_dim < 1) cfg.fail("lqe_hidden_dim", "must be positive");
  if (c.lqe_layers < 1) cfg.fail("lqe_layers", "must be positive");
  c.depth_mult = cfg.get_double("depth_mult", c.depth_mult);
  if (c.depth_mult < 0) cfg.fail("depth_mult", "must not be negative");
  c.reg_scale = cfg.get_double("reg_scale", c.reg_scale);
  c.up = cfg.get_double("up", c.up);

  // Consistency checks that transformers would only hit as shape errors at run time.
  const size_t levels = c.backbone.out_indices.size();
  if (c.encoder_in_channels.size() != levels ||
      (hybrid_levels && c.decoder_in_channels.size() != levels))
    cfg.fail("encoder_in_channels",
             "encoder_in_channels and decoder_in_channels need one entry "
             "per backbone output (out_indices " +
                 core::shape_string(c.backbone.out_indices) + ")");
  if (c.decoder_in_channels.back() != c.encoder_hidden_dim)
    cfg.fail("decoder_in_channels", "the last entry must equal encoder_hidden_dim (" +
                                        std::to_string(c.encoder_hidden_dim) + ")");
  if (std::floor(c.hidden_expansion * static_cast<double>(c.encoder_hidden_dim) / 2.0) < 1)
    cfg.fail("hidden_expansion", "gives RepNCSPELAN4 branches without channels");
}

DetectorImpl::DetectorImpl(const Config& c) : config_(c) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  auto backbone = model->register_module("backbone", std::make_shared<torch::nn::Module>());
  backbone_ = backbone->register_module("model", std::make_shared<BackboneImpl>(c.backbone));
  const int64_t e = c.encoder_hidden_dim, d = c.d_model;

  // BatchNorm2d(encoder_hidden_dim): PyTorch's default eps, not batch_norm_eps.
  auto in_proj =
      model->register_module("encoder_input_proj", std::make_shared<torch::nn::Module>());
  const auto channels = c.backbone.out_channels();
  for (size_t i = 0; i < channels.size(); ++i) {
    encoder_input_proj_.push_back(in_proj->register_module(
        std::to_string(i), layers::sequential_conv_bn(channels[i], e, 1, 1, 0, 1e-5)));
  }
  encoder_ = model->register_module("encoder",
                                    std::make_shared<rtdetr::HybridEncoderImpl>(c, dfine_ccfm(c)));
  heads_ = rtdetr::register_query_selection(*model, c);

  // decoder_input_proj: identity (no keys) when d_model == decoder_in_channels[-1]; otherwise
  // every level, the extra ones too, reads decoder_in_channels[-1] channels.
  const int64_t in = c.decoder_in_channels.back();
  if (d != in) {
    auto out_proj =
        model->register_module("decoder_input_proj", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < c.num_feature_levels; ++i) {
      const bool extra = i >= static_cast<int64_t>(c.decoder_in_channels.size());
      decoder_input_proj_.push_back(out_proj->register_module(
          std::to_string(i), layers::sequential_conv_bn(in, d, extra ? 3 : 1, extra ? 2 : 1,
                                                        extra ? 1 : 0, c.batch_norm_eps)));
    }
  }
  decoder_ = model->register_module("decoder", std::make_shared<DecoderImpl>(c));
}

std::pair<at::Tensor, at::Tensor> DetectorImpl::forward(const at::Tensor& pixel_values) const {
  std::vector<at::Tensor> proj;
  const auto feats = backbone_->forward(pixel_values);
  for (size_t i = 0; i < feats.size(); ++i)
    proj.push_back(encoder_input_proj_[i]->forward(feats[i]));
  const auto pan = encoder_->forward(std::move(proj));

  return decode(config_, pan, decoder_input_proj_, heads_, *decoder_);
}

std::pair<at::Tensor, at::Tensor> decode(const Config& c, const std::vector<at::Tensor>& pan,
                                         const std::vector<layers::ConvNorm>& decoder_input_proj,
                                         const rtdetr::QuerySelectionHeads& heads,
                                         const DecoderImpl& decoder) {
  // Every extra level is computed from the last encoder map (not chained), as upstream.
  std::vector<at::Tensor> sources;
  for (int64_t l = 0; l < c.num_feature_levels; ++l) {
    const at::Tensor& in = l < static_cast<int64_t>(pan.size()) ? pan[l] : pan.back();
    sources.push_back(decoder_input_proj.empty() ? in : decoder_input_proj[l]->forward(in));
  }
  kernels::SpatialShapes shapes;
  const at::Tensor source_flatten = rtdetr::flatten_sources(sources, shapes);
  const auto [target, reference_unact] = rtdetr::select_queries(c, heads, source_flatten, shapes);
  return decoder.forward(target, reference_unact, source_flatten, shapes);
}

core::LoadRules load_rules(bool tie) {
  core::LoadRules rules;
  // Unused at inference: denoising embeddings; top-level heads aliasing model.decoder.*.
  rules.ignored_file_keys = {R"(model\.denoising_class_embed\.weight)",
                             R"((class_embed|bbox_embed)\.\d+\..*)"};
  // A buffer derived from decoder_n_points: files converted without it keep the computed one.
  rules.optional_module_keys = {R"(model\.decoder\.layers\.\d+\.encoder_attn\.num_points_scale)"};
  rules.aliases = rtdetr::head_aliases(tie);
  return rules;
}

rtdetr::DetectorGeometry detector_geometry(const Config& c, std::vector<int64_t> strides) {
  rtdetr::DetectorGeometry geometry;
  geometry.num_channels = c.num_channels;
  geometry.stride = *std::max_element(strides.begin(), strides.end());
  geometry.num_queries = c.num_queries;
  geometry.encoder_tokens = [strides, levels = c.num_feature_levels,
                             projected = c.d_model != c.decoder_in_channels.back()](int64_t H,
                                                                                    int64_t W) {
    int64_t tokens = 0, h = 0, w = 0;
    for (auto s : strides) tokens += (h = H / s) * (w = W / s);
    // Extra levels: conv 3x3 stride 2 of the last map, or the map itself (identity projection).
    if (projected) h = (h + 1) / 2, w = (w + 1) / 2;
    return tokens + (levels - static_cast<int64_t>(strides.size())) * h * w;
  };
  return geometry;
}

}  // namespace dfine

namespace {

/// Default of every D-FINE attention module's `fused_attn` flag (AIFI encoder layer, decoder
/// self-attention), decided by measurement as for the other families
/// (tests/parity/dfine_parity_test.cpp prints it): SDPA is not byte-exact with the manual math
/// on the dfine_tiny fixture (max |SDPA - manual| ~1e-6 on the logits), so: manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "d_fine" (`config` is the parsed
/// config.json). Throws std::runtime_error (core::ConfigError / core::CheckpointError) naming
/// config.json and the field, or the checkpoint and key.
std::unique_ptr<Model> load_dfine(const std::string& dir, const nlohmann::json& config,
                                  const LoadOptions& options) {
  const core::ConfigView cfg(config, dir + "/config.json");
  const auto c = dfine::Config::parse(cfg);
  const bool tie = cfg.get_bool("tie_word_embeddings", true);
  auto labels = cfg.id2label();

  auto net = std::make_shared<dfine::DetectorImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  const auto report =
      core::load_state_dict(*net, *file, dfine::load_rules(tie), options.dtype, options.device);
  net->prepare();
  log::debug(c10::str(dir, ": loaded ", report.loaded, " tensors as d_fine (",
                      report.aliased.size(), " aliased, ", report.ignored.size(), " ignored)"));
  auto geometry = dfine::detector_geometry(c, c.backbone.out_strides());
  return std::make_unique<rtdetr::DetectorModel<dfine::DetectorImpl>>(
      "d_fine", std::move(geometry), std::move(net), std::move(labels), options);
}

/// D-FINE's encoder_input_proj / decoder_input_proj: nn.Sequential(nn.Conv2d, nn.BatchNorm2d)
/// upstream (modeling_d_fine.py), no class of their own.
bool input_proj(const std::string& path) {
  return path_has_segment(path, "encoder_input_proj") ||
         path_has_segment(path, "decoder_input_proj");
}

// D-FINE (Peng et al., "D-FINE: Redefine Regression Task in DETRs as Fine-grained Distribution
// Refinement", ICLR 2025) as transformers 5.17 DFineForObjectDetection with the HGNetV2
// backbone (`hgnet_v2`). forward() takes pixel_values (B, 3, H, W); it returns logits
// (B, num_queries, num_labels) and pred_boxes (B, num_queries, 4), float32.
const FamilyRegistrar registered{
    Family{"dfine", {"d_fine"}, /*order=*/30, load_dfine}
        .predicts({Task::object_detection}, image::DetectionHead::rt_detr)
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"Sequential"}, "", input_proj},
                  {"batchnorm_fold", {"HGNetV2ConvLayer"}, "", path_with("backbone")},
                  {"batchnorm_fold", {"DFineConvNormLayer"}},
                  {"repvgg", {"DFineRepVggBlock"}},
                  {"qkv_concat", {"DFineSelfAttention"}}},
                 {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
