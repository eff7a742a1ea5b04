// RT-DETR / RT-DETRv2: config parsing, the detector's top level (query selection), the Model
// wrapper and the loader.

#include <c10/util/StringUtil.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "log/log.h"
#include "models/core/state_dict.h"
#include "models/layers/activation_field.h"
#include "models/layers/gather_rows.h"
#include "models/registry/family.h"
#include "models/rtdetr/detector_model.h"
#include "models/rtdetr/modules.h"

namespace libreyolo::models {
namespace rtdetr {
namespace {

std::string list_string(const std::vector<int64_t>& v) { return core::shape_string(v); }

void positive(const core::ConfigView& cfg, const char* field, int64_t v) {
  if (v <= 0) cfg.fail(field, "must be positive, found " + std::to_string(v));
}

}  // namespace

void Config::parse_shared(const core::ConfigView& cfg, Config& c, bool hybrid_levels) {
  c.freeze_backbone_batch_norms = cfg.get_bool("freeze_backbone_batch_norms", true);

  c.encoder_hidden_dim = cfg.get_int("encoder_hidden_dim", c.encoder_hidden_dim);
  c.encoder_in_channels = cfg.get_int_list("encoder_in_channels", c.encoder_in_channels);
  c.feat_strides = cfg.get_int_list("feat_strides", c.feat_strides);
  c.encoder_layers = cfg.get_int("encoder_layers", c.encoder_layers);
  c.encoder_ffn_dim = cfg.get_int("encoder_ffn_dim", c.encoder_ffn_dim);
  c.encoder_attention_heads = cfg.get_int("encoder_attention_heads", c.encoder_attention_heads);
  c.encode_proj_layers = cfg.get_int_list("encode_proj_layers", c.encode_proj_layers);
  c.positional_encoding_temperature =
      cfg.get_double("positional_encoding_temperature", c.positional_encoding_temperature);
  c.encoder_activation = layers::activation_field(cfg, "encoder_activation_function", "gelu");
  c.activation = layers::activation_field(cfg, "activation_function", "silu");
  c.normalize_before = cfg.get_bool("normalize_before", false);
  c.eval_size_set = cfg.has("eval_size");
  c.hidden_expansion = cfg.get_double("hidden_expansion", c.hidden_expansion);
  c.layer_norm_eps = cfg.get_double("layer_norm_eps", c.layer_norm_eps);
  c.batch_norm_eps = cfg.get_double("batch_norm_eps", c.batch_norm_eps);

  c.d_model = cfg.get_int("d_model", c.d_model);
  c.num_queries = cfg.get_int("num_queries", c.num_queries);
  c.decoder_in_channels = cfg.get_int_list("decoder_in_channels", c.decoder_in_channels);
  c.decoder_ffn_dim = cfg.get_int("decoder_ffn_dim", c.decoder_ffn_dim);
  c.num_feature_levels = cfg.get_int("num_feature_levels", c.num_feature_levels);
  c.decoder_layers = cfg.get_int("decoder_layers", c.decoder_layers);
  c.decoder_attention_heads = cfg.get_int("decoder_attention_heads", c.decoder_attention_heads);
  c.decoder_activation = layers::activation_field(cfg, "decoder_activation_function", "relu");
  const auto labels = cfg.id2label();
  c.num_labels = !labels.empty() ? static_cast<int64_t>(labels.size())
                                 : cfg.get_int("num_labels", c.num_labels);
  if (cfg.get_bool("learn_initial_query", false))
    cfg.fail("learn_initial_query", "true is not supported (broken upstream in transformers 5.17)");
  if (cfg.has("anchor_image_size")) {
    c.anchor_image_size = cfg.get_int_list("anchor_image_size");
    if (c.anchor_image_size->size() != 2) cfg.fail("anchor_image_size", "expected [height, width]");
  }

  positive(cfg, "d_model", c.d_model);
  positive(cfg, "encoder_hidden_dim", c.encoder_hidden_dim);
  positive(cfg, "num_queries", c.num_queries);
  positive(cfg, "decoder_layers", c.decoder_layers);
  positive(cfg, "encoder_attention_heads", c.encoder_attention_heads);
  positive(cfg, "decoder_attention_heads", c.decoder_attention_heads);
  positive(cfg, "num_labels", c.num_labels);
  if (c.encoder_hidden_dim % 4 != 0 || c.encoder_hidden_dim % c.encoder_attention_heads != 0)
    cfg.fail("encoder_hidden_dim", "must be divisible by 4 and by encoder_attention_heads");
  if (c.d_model % c.decoder_attention_heads != 0)
    cfg.fail("d_model", "must be divisible by decoder_attention_heads");
  if (c.num_feature_levels < static_cast<int64_t>(c.decoder_in_channels.size()))
    cfg.fail("num_feature_levels", "must be at least len(decoder_in_channels)");
  if (hybrid_levels) {
    if (c.encoder_in_channels.size() < 2)
      cfg.fail("encoder_in_channels", "needs at least 2 levels");
    if (c.decoder_in_channels.size() != c.encoder_in_channels.size())
      cfg.fail("decoder_in_channels", "needs one entry per encoder level");
    for (auto l : c.encode_proj_layers)
      if (l < 0 || l >= static_cast<int64_t>(c.encoder_in_channels.size()))
        cfg.fail("encode_proj_layers", "level " + std::to_string(l) + " out of range");
  }
  if (c.hidden_expansion <= 0) cfg.fail("hidden_expansion", "must be positive");
}

Config Config::parse(const core::ConfigView& cfg) {
  Config c;
  c.v2 = cfg.get_string("model_type") == "rt_detr_v2";
  if (cfg.get_bool("use_timm_backbone", false))
    cfg.fail("use_timm_backbone", "timm backbones are not supported (use rt_detr_resnet)");
  if (cfg.has("backbone_config")) {
    const auto b = cfg.child("backbone_config");
    b.get_enum("model_type", "rt_detr_resnet", {"rt_detr_resnet"});
    c.num_channels = b.get_int("num_channels", c.num_channels);
    c.embedding_size = b.get_int("embedding_size", c.embedding_size);
    c.hidden_sizes = b.get_int_list("hidden_sizes", c.hidden_sizes);
    c.depths = b.get_int_list("depths", c.depths);
    c.bottleneck = b.get_enum("layer_type", "bottleneck", {"bottleneck", "basic"}) == "bottleneck";
    c.hidden_act = layers::activation_field(b, "hidden_act", "relu");
    c.downsample_in_first_stage = b.get_bool("downsample_in_first_stage", false);
    c.downsample_in_bottleneck = b.get_bool("downsample_in_bottleneck", false);
    c.out_indices = b.get_int_list("out_indices", c.out_indices);
    if (c.hidden_sizes.size() != c.depths.size() || c.hidden_sizes.empty())
      b.fail("depths", "needs one entry per hidden_sizes entry");
    for (auto i : c.out_indices)
      if (i < 0 || i > static_cast<int64_t>(c.hidden_sizes.size()))
        b.fail("out_indices", "index " + std::to_string(i) + " out of range");
    if (c.embedding_size < 2 || c.embedding_size % 2 != 0) b.fail("embedding_size", "must be even");
  }
  if (cfg.has("decoder_n_points") && cfg.raw("decoder_n_points").is_array())
    cfg.fail("decoder_n_points", "per-level point counts are not supported for RT-DETR");
  c.decoder_n_points = cfg.get_int("decoder_n_points", c.decoder_n_points);
  parse_shared(cfg, c);
  if (c.v2) {
    const int64_t levels = cfg.get_int("decoder_n_levels", 3);
    if (levels != c.num_feature_levels)
      cfg.fail("decoder_n_levels", "must equal num_feature_levels (" +
                                       std::to_string(c.num_feature_levels) + "), found " +
                                       std::to_string(levels));
    c.decoder_offset_scale = cfg.get_double("decoder_offset_scale", c.decoder_offset_scale);
    c.decoder_method =
        cfg.get_enum("decoder_method", "default", {"default", "discrete"}) == "discrete"
            ? kernels::SamplingMethod::discrete_per_axis  // what transformers computes
            : kernels::SamplingMethod::bilinear;
  }

  // Consistency checks that transformers would only hit as shape errors at run time.
  positive(cfg, "decoder_n_points", c.decoder_n_points);
  if (c.encoder_in_channels.size() != c.out_indices.size())
    cfg.fail("encoder_in_channels", "needs one entry per backbone output (out_indices " +
                                        list_string(c.out_indices) + ")");
  std::vector<int64_t> channels{c.embedding_size};
  for (auto h : c.hidden_sizes) channels.push_back(h);
  for (size_t i = 0; i < c.out_indices.size(); ++i)
    if (channels[c.out_indices[i]] != c.encoder_in_channels[i])
      cfg.fail("encoder_in_channels", list_string(c.encoder_in_channels) +
                                          " does not match the backbone's output channels");
  for (auto ch : c.decoder_in_channels)
    if (ch != c.encoder_hidden_dim)
      cfg.fail("decoder_in_channels", "every entry must equal encoder_hidden_dim");
  if (c.num_feature_levels > static_cast<int64_t>(c.decoder_in_channels.size()) &&
      c.d_model != c.encoder_hidden_dim)
    cfg.fail("num_feature_levels", "extra levels need d_model == encoder_hidden_dim");
  return c;
}

std::pair<at::Tensor, at::Tensor> generate_anchors(const kernels::SpatialShapes& shapes,
                                                   at::ScalarType dtype, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  std::vector<at::Tensor> anchors;
  for (size_t level = 0; level < shapes.size(); ++level) {
    const int64_t h = shapes[level][0], w = shapes[level][1];
    const auto idx = at::TensorOptions().dtype(at::kLong).device(device);
    auto grid = at::meshgrid({at::arange(h, idx).to(dtype), at::arange(w, idx).to(dtype)}, "ij");
    auto xy = at::stack({grid[1], grid[0]}, -1).unsqueeze(0) + 0.5;
    xy = at::stack(
        {xy.select(-1, 0) / static_cast<double>(w), xy.select(-1, 1) / static_cast<double>(h)}, -1);
    const auto wh = at::ones_like(xy) * 0.05 * std::pow(2.0, static_cast<double>(level));
    anchors.push_back(at::cat({xy, wh}, -1).reshape({-1, h * w, 4}));
  }
  auto a = at::cat(anchors, 1);
  const auto valid = ((a > 1e-2) * (a < 1 - 1e-2)).all(-1, /*keepdim=*/true);
  a = at::log(a / (1 - a));
  double max = 0;
  switch (dtype) {
    case at::kHalf:
      max = 65504.0;
      break;
    case at::kBFloat16:
      max = 3.3895313892515355e38;
      break;
    case at::kDouble:
      max = std::numeric_limits<double>::max();
      break;
    default:
      max = std::numeric_limits<float>::max();
  }
  a = at::where(valid, a, at::full({}, max, opts));
  return {a, valid};
}

at::Tensor flatten_sources(const std::vector<at::Tensor>& sources, kernels::SpatialShapes& shapes) {
  shapes.clear();
  std::vector<at::Tensor> flat;
  for (const auto& s : sources) {
    shapes.push_back({s.size(2), s.size(3)});
    flat.push_back(s.flatten(2).transpose(1, 2));
  }
  return at::cat(flat, 1);
}

QuerySelectionHeads register_query_selection(torch::nn::Module& model, const Config& c) {
  const int64_t d = c.d_model;
  QuerySelectionHeads h;
  auto enc_output = model.register_module("enc_output", std::make_shared<torch::nn::Module>());
  h.enc_output_linear =
      enc_output->register_module("0", std::make_shared<layers::LinearImpl>(d, d));
  h.enc_output_norm = enc_output->register_module(
      "1", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  h.enc_score_head = model.register_module("enc_score_head",
                                           std::make_shared<layers::LinearImpl>(d, c.num_labels));
  h.enc_bbox_head =
      model.register_module("enc_bbox_head", std::make_shared<layers::MLPImpl>(d, d, 4, 3));
  return h;
}

std::pair<at::Tensor, at::Tensor> select_queries(const Config& c, const QuerySelectionHeads& heads,
                                                 const at::Tensor& source_flatten,
                                                 const kernels::SpatialShapes& shapes) {
  const auto dtype = source_flatten.scalar_type();
  kernels::SpatialShapes anchor_shapes = shapes;
  if (c.anchor_image_size) {
    anchor_shapes.clear();
    for (auto s : c.feat_strides)
      anchor_shapes.push_back({(*c.anchor_image_size)[0] / s, (*c.anchor_image_size)[1] / s});
  }
  // Kept per (shapes, dtype): entry 0 the anchors, entry 1 the valid mask in `dtype`.
  std::vector<int64_t> key{static_cast<int64_t>(dtype)};
  for (const auto& s : anchor_shapes) key.insert(key.end(), {s[0], s[1]});
  auto kept = [&](int64_t which) {
    key.push_back(which);
    at::Tensor t = heads.anchors->get(key, source_flatten.device(), [&] {
      auto [a, valid] = generate_anchors(anchor_shapes, dtype, source_flatten.device());
      return which == 0 ? a : valid.to(dtype);
    });
    key.pop_back();
    return t;
  };
  const at::Tensor anchors = kept(0), valid = kept(1);
  if (anchors.size(1) != source_flatten.size(1))
    throw std::invalid_argument(
        c10::str("pixel_values: the input size does not match config.json anchor_image_size (",
                 anchors.size(1), " anchors for ", source_flatten.size(1), " tokens)"));
  const at::Tensor memory = valid * source_flatten;
  const at::Tensor output_memory =
      heads.enc_output_norm->forward(heads.enc_output_linear->forward(memory));
  const at::Tensor enc_class = heads.enc_score_head->forward(output_memory);
  const at::Tensor topk_ind =
      std::get<1>(at::topk(std::get<0>(enc_class.max(-1)), c.num_queries, 1));
  const at::Tensor target = layers::gather_rows(output_memory, topk_ind);
  // The box head on the selected queries only (transformers runs it on every anchor, then
  // gathers): its layers are row-wise, so the selected rows are the same, and 8,400 anchors'
  // three-layer MLP was about a third of RT-DETR's query-selection GEMM work.
  const at::Tensor reference_unact =
      heads.enc_bbox_head->forward(target) + layers::gather_rows(anchors, topk_ind);
  return {target, reference_unact};
}

std::function<std::vector<std::string>(const std::string&)> head_aliases(bool tie) {
  return [tie](const std::string& key) {
    // hf-models.md 1.3: top-level <-> model.decoder. prefixes, then (tied v2) index 0.
    static const std::string prefix = "model.decoder.";
    std::vector<std::string> out;
    if (key.rfind(prefix, 0) != 0) return out;
    const std::string rest = key.substr(prefix.size());  // class_embed.3.weight
    if (rest.rfind("class_embed.", 0) != 0 && rest.rfind("bbox_embed.", 0) != 0) return out;
    out.push_back(rest);
    if (tie) {
      const auto dot1 = rest.find('.');
      const auto dot2 = rest.find('.', dot1 + 1);
      const std::string head = rest.substr(0, dot1), tail = rest.substr(dot2);
      out.push_back(prefix + head + ".0" + tail);
      out.push_back(head + ".0" + tail);
    }
    return out;
  };
}

namespace {

Backbone resnet_backbone(const Config& c) {
  auto resnet = std::make_shared<ResNetBackboneImpl>(c);
  return {resnet, [resnet](const at::Tensor& x) { return resnet->forward(x); },
          resnet->out_channels};
}

}  // namespace

DetectorImpl::DetectorImpl(const Config& c) : DetectorImpl(c, resnet_backbone(c)) {}

DetectorImpl::DetectorImpl(const Config& c, Backbone backbone)
    : config_(c), backbone_(std::move(backbone)) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  model->register_module("backbone", backbone_.module);
  const int64_t e = c.encoder_hidden_dim, d = c.d_model;

  auto in_proj =
      model->register_module("encoder_input_proj", std::make_shared<torch::nn::Module>());
  for (size_t i = 0; i < backbone_.out_channels.size(); ++i) {
    encoder_input_proj_.push_back(in_proj->register_module(
        std::to_string(i),
        layers::sequential_conv_bn(backbone_.out_channels[i], e, 1, 1, 0, 1e-5)));
  }
  encoder_ = model->register_module("encoder", std::make_shared<HybridEncoderImpl>(c));

  heads_ = register_query_selection(*model, c);

  auto out_proj =
      model->register_module("decoder_input_proj", std::make_shared<torch::nn::Module>());
  int64_t in = 0;
  for (int64_t i = 0; i < c.num_feature_levels; ++i) {
    const bool extra = i >= static_cast<int64_t>(c.decoder_in_channels.size());
    // Conv2d(in, d_model, 1, bias=False), or (3, stride 2, padding 1) for an extra level.
    decoder_input_proj_.push_back(out_proj->register_module(
        std::to_string(i),
        layers::sequential_conv_bn(extra ? in : c.decoder_in_channels[i], d, extra ? 3 : 1,
                                   extra ? 2 : 1, extra ? 1 : 0, c.batch_norm_eps)));
    in = extra ? d : c.decoder_in_channels[i];
  }
  decoder_ = model->register_module("decoder", std::make_shared<DecoderImpl>(c));
}

std::pair<at::Tensor, at::Tensor> DetectorImpl::forward(const at::Tensor& pixel_values) const {
  // Backbone -> encoder_input_proj -> hybrid encoder.
  std::vector<at::Tensor> proj;
  const auto feats = backbone_.forward(pixel_values);
  for (size_t i = 0; i < feats.size(); ++i)
    proj.push_back(encoder_input_proj_[i]->forward(feats[i]));
  const auto pan = encoder_->forward(std::move(proj));

  // decoder_input_proj per level; every extra level is computed from the last PAN map.
  std::vector<at::Tensor> sources;
  for (size_t l = 0; l < decoder_input_proj_.size(); ++l) {
    const at::Tensor& in = l < pan.size() ? pan[l] : pan.back();
    sources.push_back(decoder_input_proj_[l]->forward(in));
  }
  kernels::SpatialShapes shapes;
  const at::Tensor source_flatten = flatten_sources(sources, shapes);
  const auto [target, reference_unact] = select_queries(config_, heads_, source_flatten, shapes);
  return decoder_->forward(target, reference_unact, source_flatten, shapes);
}

}  // namespace rtdetr

namespace {

/// Loads `dir`/model.safetensors for config.json `model_type` "rt_detr" or "rt_detr_v2"
/// (`config` is the parsed config.json). Throws std::runtime_error (core::ConfigError /
/// core::CheckpointError) naming config.json and the field, or the checkpoint and key.
std::unique_ptr<Model> load_rtdetr(const std::string& dir, const nlohmann::json& config,
                                   const LoadOptions& options) {
  const core::ConfigView cfg(config, dir + "/config.json");
  const auto type = cfg.get_enum("model_type", "", {"rt_detr", "rt_detr_v2"});
  const auto c = rtdetr::Config::parse(cfg);
  const bool tie = c.v2 && cfg.get_bool("tie_word_embeddings", true);
  auto labels = cfg.id2label();

  auto net = std::make_shared<rtdetr::DetectorImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  // Unused at inference: denoising embeddings; top-level heads aliasing model.decoder.* (v2).
  rules.ignored_file_keys = {R"(model\.denoising_class_embed\.weight)",
                             R"((class_embed|bbox_embed)\.\d+\..*)"};
  rules.optional_module_keys = {R"(model\.decoder\.layers\.\d+\.encoder_attn\.n_points_scale)"};
  rules.aliases = rtdetr::head_aliases(tie);
  const auto report = core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  log::debug(c10::str(dir, ": loaded ", report.loaded, " tensors as ", type, " (",
                      report.aliased.size(), " aliased, ", report.ignored.size(), " ignored)"));
  rtdetr::DetectorGeometry geometry;
  geometry.num_channels = c.num_channels;
  geometry.stride = 32;  // total stride of the ResNet-vd backbone
  geometry.num_queries = c.num_queries;
  // Levels at strides 8, 16, 32, then each extra level halves the last (ceil).
  geometry.encoder_tokens = [levels = c.num_feature_levels](int64_t H, int64_t W) {
    int64_t tokens = 0, h = H / 8, w = W / 8;
    for (int64_t l = 0; l < levels; ++l) {
      tokens += h * w;
      h = (h + 1) / 2, w = (w + 1) / 2;
    }
    return tokens;
  };
  return std::make_unique<rtdetr::DetectorModel<rtdetr::DetectorImpl>>(
      type, std::move(geometry), std::move(net), std::move(labels), options);
}

/// RT-DETR's encoder_input_proj / decoder_input_proj: nn.Sequential(nn.Conv2d, nn.BatchNorm2d)
/// upstream (modeling_rt_detr.py), no class of their own.
bool input_proj(const std::string& path) {
  return path_has_segment(path, "encoder_input_proj") ||
         path_has_segment(path, "decoder_input_proj");
}

bool backbone_shortcut(const std::string& path) {
  return path_has_segment(path, "backbone") && path_has_segment(path, "shortcut");
}

// RT-DETR (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024) and
// RT-DETRv2 (Lv et al., 2024), as transformers 5.17 RTDetrForObjectDetection /
// RTDetrV2ForObjectDetection with the ResNet-vd backbone (`rt_detr_resnet`). forward() takes
// pixel_values (B, 3, H, W); it returns logits (B, num_queries, num_labels) and pred_boxes
// (B, num_queries, 4), float32. Attention: manual math by default (fused_attention_default).
//
// Default layouts: every layout passed the parity gate. channels_last (CUDA only: its
// predicate) removes cuDNN's NCHW<->NHWC transposes, and avgpool_fold the NHWC avg_pool2d pass
// of the ResNet-vd shortcuts although its 2x2 stride-2 convolution has 4x the 1x1 shortcut's
// FLOPs (docs/BENCHMARKS.md "Against torch.compile").
const FamilyRegistrar registered{
    Family{"rtdetr", {"rt_detr", "rt_detr_v2"}, /*order=*/10, load_rtdetr}
        .predicts({Task::object_detection}, image::DetectionHead::rt_detr)
        .fused_attention(false)
        .layouts({{"batchnorm_fold", {"Sequential"}, "", input_proj},
                  {"batchnorm_fold", {"RTDetrResNetShortCut"}, "", backbone_shortcut},
                  {"batchnorm_fold", {"RTDetrResNetConvLayer"}, "", path_with("backbone")},
                  {"batchnorm_fold", {"RTDetrConvNormLayer"}, "rt_detr"},
                  {"batchnorm_fold", {"RTDetrV2ConvNormLayer"}, "rt_detr_v2"},
                  {"repvgg", {"RTDetrRepVggBlock"}, "rt_detr"},
                  {"repvgg", {"RTDetrV2RepVggBlock"}, "rt_detr_v2"},
                  {"avgpool_fold", {"AvgPool2d"}},
                  {"qkv_concat", {"RTDetrSelfAttention"}, "rt_detr"},
                  {"qkv_concat", {"RTDetrV2SelfAttention"}, "rt_detr_v2"}},
                 {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
