// DetrForObjectDetection (transformers 5.17 models/detr/modeling_detr.py), inference only. Every
// step keeps transformers' operation order so that float32 results match.

#include <torch/nn/module.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>

#include "models/core/config.h"
#include "models/core/pixel_mask.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/deformable_detr/geometry.h"
#include "models/deformable_detr/resnet.h"
#include "models/detr/timm_resnet.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/module_model.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace detr {
namespace {

using layers::Activation;

/// The on-disk prefix of the backbone (DetrConvEncoder.model; transformers 5.17 renames it to
/// model.backbone.model in memory and back on save_pretrained: conversion_mapping.py DetrModel).
constexpr const char* kBackbonePrefix = "model.backbone.conv_encoder.model.";

struct Config {
  int64_t d_model = 256, encoder_layers = 6, decoder_layers = 6;
  int64_t encoder_heads = 8, decoder_heads = 8, encoder_ffn = 2048, decoder_ffn = 2048;
  int64_t num_queries = 100, num_labels = 2, num_channels = 3;
  bool learned_positions = false;
  Activation act = Activation::relu;
  /// Which backbone: timm's ResNet (use_timm_backbone, facebook/detr-resnet-50) or transformers'
  /// ResNetBackbone (backbone_config model_type "resnet").
  bool timm = true;
  std::string timm_name;
  int64_t timm_last_stage = 4;
  int64_t timm_output_stride = 32;  ///< 16: DETR-DC5 (`dilation`)
  TimmResNetConfig timm_backbone;   ///< filled from the checkpoint at load
  deformable_detr::ResNetConfig hf_backbone;
  std::map<int64_t, std::string> id2label;
};

/// config.json, both forms: the Hub's (facebook/detr-resnet-50: use_timm_backbone true,
/// backbone "resnet50", backbone_config null) and transformers 5.17's save_pretrained
/// (backbone_config {model_type "timm_backbone", backbone, out_indices} or {model_type
/// "resnet", ...}). Without either, DetrConfig's defaults: timm "resnet50".
Config parse_config(const core::ConfigView& v) {
  Config c;
  c.d_model = v.get_int("d_model", 256);
  c.encoder_layers = v.get_int("encoder_layers", 6);
  c.decoder_layers = v.get_int("decoder_layers", 6);
  c.encoder_heads = v.get_int("encoder_attention_heads", 8);
  c.decoder_heads = v.get_int("decoder_attention_heads", 8);
  c.encoder_ffn = v.get_int("encoder_ffn_dim", 2048);
  c.decoder_ffn = v.get_int("decoder_ffn_dim", 2048);
  c.num_queries = v.get_int("num_queries", 100);
  c.num_channels = v.get_int("num_channels", 3);
  try {
    c.act = layers::activation_from_name(v.get_string("activation_function", "relu"));
  } catch (const std::invalid_argument& e) {
    v.fail("activation_function", e.what());
  }
  c.id2label = v.id2label();
  // transformers writes no id2label for its default 2 labels (PreTrainedConfig num_labels 2).
  c.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  c.learned_positions =
      v.get_enum("position_embedding_type", "sine", {"sine", "learned"}) == "learned";
  const bool has_backbone_config = v.has("backbone_config");
  if (has_backbone_config) {
    const auto bc = v.child("backbone_config");
    const auto type = bc.get_enum("model_type", "", {"resnet", "timm_backbone"});
    if (type == "timm_backbone") {
      c.timm = true;
      c.timm_name = bc.get_string("backbone");
      c.timm_output_stride = bc.get_int("output_stride", 32);
      if (c.timm_output_stride != 32 && c.timm_output_stride != 16)
        bc.fail("output_stride", "must be 32, or 16 (DETR-DC5: the last stage dilated)");
      const auto out = bc.get_int_list("out_indices", {1, 2, 3, 4});
      if (out.empty() || out.back() < 1 || out.back() > 4)
        bc.fail("out_indices", "the last index must be a stage, 1 to 4");
      c.timm_last_stage = out.back();
      c.num_channels = bc.get_int("num_channels", c.num_channels);
    } else {
      c.timm = false;
      c.hf_backbone = deformable_detr::parse_resnet_config(bc, {4});
      c.hf_backbone.out_indices = {c.hf_backbone.out_indices.back()};  // DETR uses the last map
    }
  } else if (v.get_bool("use_timm_backbone", true)) {
    c.timm = true;
    c.timm_name = v.get_string("backbone", "resnet50");
    // DetrConfig: `dilation` gives the timm backbone output_stride 16 (DC5).
    c.timm_output_stride = v.get_bool("dilation", false) ? 16 : 32;
  } else {           // (`dilation` is a timm option: transformers ignores it here too)
    c.timm = false;  // DetrConfig's default ResNetConfig(out_features=["stage4"])
    c.hf_backbone.out_indices = {4};
    c.hf_backbone.num_channels = c.num_channels;
  }
  if (c.timm) {
    // timm's plain ResNets; the architecture itself is read from the checkpoint.
    const std::string field = has_backbone_config ? "backbone_config" : "backbone";
    if (c.timm_name.rfind("resnet", 0) != 0 && c.timm_name.rfind("timm/resnet", 0) != 0)
      v.fail(field, "timm backbone \"" + c.timm_name +
                        "\" is not supported (timm's plain ResNets: resnet18, resnet34, "
                        "resnet50, resnet101, ...)");
  }
  if (c.d_model <= 0) v.fail("d_model", "must be positive");
  if (c.encoder_heads <= 0 || c.d_model % c.encoder_heads != 0)
    v.fail("encoder_attention_heads", "must divide d_model");
  if (c.decoder_heads <= 0 || c.d_model % c.decoder_heads != 0)
    v.fail("decoder_attention_heads", "must divide d_model");
  if (c.d_model % 2 != 0) v.fail("d_model", "must be even (position embedding)");
  if (c.num_queries < 1) v.fail("num_queries", "must be positive");
  if (c.num_labels < 1) v.fail("num_labels", "must be positive");
  return c;
}

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

layers::Attention attention(int64_t d, int64_t heads) {
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = heads;
  return make<layers::AttentionImpl>(o);  // q_proj, k_proj, v_proj, out_proj (on-disk names)
}

/// DetrEncoderLayer (post-norm): position embeddings added to queries and keys.
class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const Config& c) : act(c.act) {
    self_attn = register_module("self_attn", attention(c.d_model, c.encoder_heads));
    self_attn_layer_norm =
        register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    fc1 = register_module("fc1", make<layers::LinearImpl>(c.d_model, c.encoder_ffn));
    fc2 = register_module("fc2", make<layers::LinearImpl>(c.encoder_ffn, c.d_model));
    final_layer_norm =
        register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  }
  /// x (B, S, D), pos (B, S, D), bias (B, 1, 1, S) additive key padding mask.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& bias) const {
    const auto qk = x + pos;
    auto h = x + self_attn->forward(qk, qk, x, bias);
    h = self_attn_layer_norm->forward(h);
    h = h + fc2->forward(layers::activate(act, fc1->forward(h)));
    return final_layer_norm->forward(h);
  }
  layers::Attention self_attn;
  layers::LayerNorm self_attn_layer_norm, final_layer_norm;
  layers::Linear fc1, fc2;
  Activation act;
};

/// DetrDecoderLayer (post-norm): self-attention (object query embeddings added to queries and
/// keys), cross-attention (query embeddings on the queries, spatial embeddings on the keys), MLP.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c) : act(c.act) {
    self_attn = register_module("self_attn", attention(c.d_model, c.decoder_heads));
    self_attn_layer_norm =
        register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    encoder_attn = register_module("encoder_attn", attention(c.d_model, c.decoder_heads));
    encoder_attn_layer_norm =
        register_module("encoder_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    fc1 = register_module("fc1", make<layers::LinearImpl>(c.d_model, c.decoder_ffn));
    fc2 = register_module("fc2", make<layers::LinearImpl>(c.decoder_ffn, c.d_model));
    final_layer_norm =
        register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  }
  /// x (B, Q, D), query_pos (B, Q, D), memory (B, S, D), memory_keys = memory + spatial pos,
  /// bias (B, 1, 1, S).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& memory,
                     const at::Tensor& memory_keys, const at::Tensor& bias) const {
    const auto qk = x + query_pos;
    auto h = x + self_attn->forward(qk, qk, x);
    h = self_attn_layer_norm->forward(h);
    h = h + encoder_attn->forward(h + query_pos, memory_keys, memory, bias);
    h = encoder_attn_layer_norm->forward(h);
    h = h + fc2->forward(layers::activate(act, fc1->forward(h)));
    return final_layer_norm->forward(h);
  }
  layers::Attention self_attn, encoder_attn;
  layers::LayerNorm self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm;
  layers::Linear fc1, fc2;
  Activation act;
};

/// The module tree with the on-disk names ("model.*", "class_labels_classifier.*",
/// "bbox_predictor.*").
class DetrImpl : public torch::nn::Module {
 public:
  explicit DetrImpl(const Config& c) : config(c) {
    const int64_t d = c.d_model;
    auto model = register_module("model", make<torch::nn::Module>());
    auto backbone = model->register_module("backbone", make<torch::nn::Module>());
    auto conv_encoder = backbone->register_module("conv_encoder", make<torch::nn::Module>());
    int64_t channels = 0;
    if (c.timm) {
      timm_backbone = conv_encoder->register_module("model", make<TimmResNetImpl>(c.timm_backbone));
      channels = timm_backbone->channels();
    } else {
      hf_backbone = conv_encoder->register_module(
          "model", make<deformable_detr::ResNetBackboneImpl>(c.hf_backbone));
      channels = hf_backbone->channels().back();
    }
    if (c.learned_positions) {
      auto pe = model->register_module("position_embedding", make<torch::nn::Module>());
      auto rows = pe->register_module("row_embeddings", make<torch::nn::Module>());
      auto cols = pe->register_module("column_embeddings", make<torch::nn::Module>());
      row_embeddings = rows->register_parameter("weight", at::empty({50, d / 2}));
      column_embeddings = cols->register_parameter("weight", at::empty({50, d / 2}));
    }
    auto qpe = model->register_module("query_position_embeddings", make<torch::nn::Module>());
    query_position_embeddings = qpe->register_parameter("weight", at::empty({c.num_queries, d}));
    layers::Conv2dOptions p;
    p.in = channels;
    p.out = d;
    p.kernel = 1;
    p.bias = true;
    input_projection = model->register_module("input_projection", make<layers::Conv2dImpl>(p));
    auto encoder = model->register_module("encoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<EncoderLayerImpl>> el;
    for (int64_t i = 0; i < c.encoder_layers; ++i) el.push_back(make<EncoderLayerImpl>(c));
    encoder_layers = layers::register_list(*encoder, "layers", el);
    auto decoder = model->register_module("decoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<DecoderLayerImpl>> dl;
    for (int64_t i = 0; i < c.decoder_layers; ++i) dl.push_back(make<DecoderLayerImpl>(c));
    decoder_layers = layers::register_list(*decoder, "layers", dl);
    decoder_layernorm = decoder->register_module("layernorm", make<layers::LayerNormImpl>(d, 1e-5));
    class_labels_classifier =
        register_module("class_labels_classifier", make<layers::LinearImpl>(d, c.num_labels + 1));
    bbox_predictor =
        register_module("bbox_predictor", make<layers::MLPImpl>(d, d, 4, 3, Activation::relu));
  }

  /// DetrLearnedPositionEmbedding: (B, D, h, w), [column embedding, row embedding] per pixel.
  at::Tensor learned_position_embedding(int64_t batch, int64_t h, int64_t w) const {
    if (h > 50 || w > 50)
      throw std::invalid_argument(
          c10::str("detr: a ", h, "x", w,
                   " feature map exceeds the 50x50 learned position embeddings "
                   "(position_embedding_type \"learned\"); send smaller images"));
    const auto opts = at::TensorOptions().dtype(at::kLong).device(row_embeddings.device());
    const auto x_emb = at::embedding(column_embeddings, at::arange(w, opts));
    const auto y_emb = at::embedding(row_embeddings, at::arange(h, opts));
    const auto pos =
        at::cat({x_emb.unsqueeze(0).repeat({h, 1, 1}), y_emb.unsqueeze(1).repeat({1, w, 1})}, -1);
    return pos.permute({2, 0, 1}).unsqueeze(0).repeat({batch, 1, 1, 1});
  }

  /// pixel_values (B, 3, H, W), pixel_mask (B, H, W) (nonzero = valid). Returns logits
  /// (B, Q, num_labels + 1) and pred_boxes (B, Q, 4).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const at::Tensor& pixel_mask) const {
    const auto dtype = pixel_values.scalar_type();
    const at::Tensor feature = config.timm ? timm_backbone->forward(pixel_values)
                                           : hf_backbone->forward(pixel_values).back();
    const int64_t B = feature.size(0), h = feature.size(2), w = feature.size(3);
    // DetrConvEncoder: interpolate(pixel_mask[None].float(), size).to(bool)[0] (nearest).
    const auto mask = at::upsample_nearest2d(pixel_mask.unsqueeze(0).to(at::kFloat), {h, w})
                          .to(at::kBool)
                          .squeeze(0);
    const auto source = input_projection->forward(feature).flatten(2).transpose(1, 2);
    const auto pos_map = config.learned_positions
                             ? learned_position_embedding(B, h, w)
                             : deformable_detr::sine_position_embedding(mask, config.d_model / 2,
                                                                        dtype, /*offset=*/0);
    const auto pos = pos_map.flatten(2).transpose(1, 2);
    const auto flat_mask = mask.flatten(1);
    // The additive key padding mask of eager_attention_forward (create_bidirectional_mask):
    // 0 where valid, the dtype's lowest value where padded, (B, 1, 1, S).
    const auto st = source.scalar_type();
    const double lowest = st == at::kHalf       ? -65504.0
                          : st == at::kBFloat16 ? -3.3895313892515355e38
                                                : std::numeric_limits<float>::lowest();
    const auto bias = at::zeros(flat_mask.sizes(), source.options())
                          .masked_fill(flat_mask.logical_not(), lowest)
                          .view({B, 1, 1, -1});

    at::Tensor memory = source;
    for (const auto& layer : encoder_layers) memory = layer->forward(memory, pos, bias);

    const auto query_pos = query_position_embeddings.unsqueeze(0).repeat({B, 1, 1});
    at::Tensor x = at::zeros_like(query_pos);
    const auto memory_keys = memory + pos;
    for (const auto& layer : decoder_layers)
      x = layer->forward(x, query_pos, memory, memory_keys, bias);
    x = decoder_layernorm->forward(x);
    return {class_labels_classifier->forward(x), bbox_predictor->forward(x).sigmoid()};
  }

  Config config;
  std::shared_ptr<TimmResNetImpl> timm_backbone;
  std::shared_ptr<deformable_detr::ResNetBackboneImpl> hf_backbone;
  at::Tensor row_embeddings, column_embeddings, query_position_embeddings;
  layers::Conv2d input_projection;
  std::vector<std::shared_ptr<EncoderLayerImpl>> encoder_layers;
  std::vector<std::shared_ptr<DecoderLayerImpl>> decoder_layers;
  layers::LayerNorm decoder_layernorm;
  layers::Linear class_labels_classifier;
  layers::MLP bbox_predictor;
};

class DetrModel : public ModuleModel<DetrImpl> {
 public:
  DetrModel(std::shared_ptr<DetrImpl> net, const LoadOptions& options)
      : ModuleModel("detr", Task::object_detection, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.num_channels);
    const at::Tensor mask = core::checked_pixel_mask("detr", x, pixel_mask, options_.device);
    auto [logits, boxes] = net_->forward(x, mask);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }
};

/// Learned position embeddings: transformers 5.17 keeps them at model.position_embedding;
/// checkpoints of transformers 4 (DetrConvModel) at model.backbone.position_embedding.
core::LoadRules load_rules() {
  core::LoadRules rules;
  rules.aliases = [](const std::string& key) {
    static const std::string prefix = "model.position_embedding.";
    std::vector<std::string> out;
    if (key.rfind(prefix, 0) == 0)
      out.push_back("model.backbone.position_embedding." + key.substr(prefix.size()));
    return out;
  };
  return rules;
}

}  // namespace
}  // namespace detr

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
  auto c = detr::parse_config(view);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  if (c.timm) {
    c.timm_backbone = detr::read_timm_resnet_config(*file, detr::kBackbonePrefix, c.num_channels,
                                                    c.timm_last_stage, c.timm_name);
    c.timm_backbone.output_stride = c.timm_output_stride;
  }
  auto net = std::make_shared<detr::DetrImpl>(c);
  core::load_state_dict(*net, *file, detr::load_rules(), options.dtype, options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<detr::DetrModel>(std::move(net), options);
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
const FamilyRegistrar registered{
    Family{"detr", {"detr"}, /*order=*/15, load_detr}
        .predicts({Task::object_detection}, image::DetectionHead::detr)
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"ResNetShortCut"}, "", path_with("shortcut")},
                  {"batchnorm_fold", {"ResNetConvLayer"}},
                  {"qkv_concat", {"DetrSelfAttention"}, "", path_with("self_attn")}},
                 {"batchnorm_fold", "qkv_concat"})};

}  // namespace
}  // namespace libreyolo::models
