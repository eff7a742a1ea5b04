// DabDetrForObjectDetection (transformers 5.17 models/dab_detr/modeling_dab_detr.py), inference
// only. The stem and the encoder layers are DETR's (models/detr/detr_common.h), the decoder
// attentions Conditional DETR's (models/conditional_detr/conditional_attention.h), as upstream
// derives them; the anchor boxes, their sine embeddings and the per-layer box refinement are
// DAB-DETR's. Every step keeps transformers' operation order so that float32 results match.

#include <torch/nn/module.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "models/conditional_detr/conditional_attention.h"
#include "models/core/config.h"
#include "models/core/pixel_mask.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/deformable_detr/geometry.h"
#include "models/detr/detr_common.h"
#include "models/layers/layers.h"
#include "models/module_model.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace dab_detr {
namespace {

using conditional_detr::AttentionNames;
using conditional_detr::DecoderCrossAttention;
using conditional_detr::DecoderSelfAttention;
using detr::make;

/// DabDetrConfig beyond DETR's fields.
struct Config : detr::Config {
  double temperature_height = 20, temperature_width = 20;
  double sine_scale = 2 * M_PI;  ///< sine_position_embedding_scale (null: 2*pi)
  bool keep_query_pos = false;
  bool normalize_before = false;  ///< a LayerNorm after the encoder (model.encoder.norm)
  int64_t num_patterns = 0;
};

Config parse_config(const core::ConfigView& v) {
  detr::ConfigSchema schema;
  schema.hidden_field = "hidden_size";
  schema.default_num_queries = 300;
  schema.default_activation = "prelu";
  schema.allow_prelu = true;
  schema.has_position_embedding_type = false;
  Config c;
  static_cast<detr::Config&>(c) = detr::parse_config(v, schema);
  c.temperature_height = v.get_double("temperature_height", 20);
  c.temperature_width = v.get_double("temperature_width", 20);
  c.sine_scale = v.get_double("sine_position_embedding_scale", 2 * M_PI);
  c.keep_query_pos = v.get_bool("keep_query_pos", false);
  c.normalize_before = v.get_bool("normalize_before", false);
  c.num_patterns = v.get_int("num_patterns", 0);
  if (v.get_int("query_dim", 4) != 4) v.fail("query_dim", "must be 4 (DabDetrConfig)");
  if (c.num_patterns < 0) v.fail("num_patterns", "must not be negative");
  if (c.temperature_height <= 0) v.fail("temperature_height", "must be positive");
  if (c.temperature_width <= 0) v.fail("temperature_width", "must be positive");
  return c;
}

/// DabDetrSinePositionEmbedding of the downsampled mask (B, h, w) bool -> (B, h*w, D) in
/// `dtype`: like DETR's (normalised cumulative sums, no offset) but with its own temperatures
/// for x and y and scale, and its dim_t computed as upstream does in place (floor(i / 2) *
/// (2 / (D/2)), then temperature ** that), float32.
at::Tensor sine_position_embedding(const at::Tensor& mask, const Config& c, at::ScalarType dtype) {
  const int64_t half = c.d_model / 2;
  const auto m = mask.to(at::kFloat);
  auto y = m.cumsum(1);
  auto x = m.cumsum(2);
  y = y / (y.slice(1, -1) + 1e-6) * c.sine_scale;
  x = x / (x.slice(2, -1) + 1e-6) * c.sine_scale;
  auto dim_t = [&](double temperature) {
    auto d = at::arange(half, at::TensorOptions().dtype(at::kFloat).device(mask.device()));
    d = at::div(d, 2, "floor").mul_(2.0 / static_cast<double>(half));
    return at::pow(temperature, d);
  };
  auto interleave = [](const at::Tensor& p) {
    return at::stack({p.slice(3, 0, c10::nullopt, 2).sin(), p.slice(3, 1, c10::nullopt, 2).cos()},
                     4)
        .flatten(3);
  };
  const auto pos_x = interleave(x.unsqueeze(-1) / dim_t(c.temperature_width));
  const auto pos_y = interleave(y.unsqueeze(-1) / dim_t(c.temperature_height));
  return at::cat({pos_y, pos_x}, 3).flatten(1, 2).to(dtype);  // (B, h*w, D)
}

AttentionNames self_attention_names() {
  return {"self_attn_query_content_proj",
          "self_attn_query_pos_proj",
          "self_attn_key_content_proj",
          "self_attn_key_pos_proj",
          "self_attn_value_proj",
          "",
          "self_attn",
          "output_proj"};
}

AttentionNames cross_attention_names() {
  return {"cross_attn_query_content_proj",
          "cross_attn_query_pos_proj",
          "cross_attn_key_content_proj",
          "cross_attn_key_pos_proj",
          "cross_attn_value_proj",
          "cross_attn_query_pos_sine_proj",
          "cross_attn",
          "output_proj"};
}

/// DabDetrDecoderLayer: self_attn (DabDetrDecoderLayerSelfAttention, its LayerNorm inside),
/// cross_attn (DabDetrDecoderLayerCrossAttention: the query position projection on the first
/// layer, or on every layer with keep_query_pos), mlp (DabDetrDecoderLayerFFN), each post-norm.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const Config& c, bool first) {
    const int64_t d = c.d_model;
    auto sa = register_module("self_attn", make<torch::nn::Module>());
    self_attn = DecoderSelfAttention(*sa, d, c.decoder_heads, self_attention_names());
    self_attn_layer_norm =
        sa->register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(d, 1e-5));
    auto ca = register_module("cross_attn", make<torch::nn::Module>());
    cross_attn = DecoderCrossAttention(*ca, d, c.decoder_heads, cross_attention_names(),
                                       first || c.keep_query_pos);
    cross_attn_layer_norm =
        ca->register_module("cross_attn_layer_norm", make<layers::LayerNormImpl>(d, 1e-5));
    auto mlp = register_module("mlp", make<torch::nn::Module>());
    ffn = detr::FeedForward(*mlp, c, c.decoder_ffn);
    final_layer_norm =
        mlp->register_module("final_layer_norm", make<layers::LayerNormImpl>(d, 1e-5));
  }
  /// x, query_pos, query_sine (B, Q, D); memory, memory_pos (B, S, D); bias (B, 1, 1, S).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& query_sine,
                     const at::Tensor& memory, const at::Tensor& memory_pos,
                     const at::Tensor& bias) const {
    auto h = self_attn_layer_norm->forward(x + self_attn.forward(x, query_pos));
    h = cross_attn_layer_norm->forward(
        h + cross_attn.forward(h, memory, memory_pos, query_sine, query_pos, bias));
    return final_layer_norm->forward(h + ffn.forward(h));
  }
  DecoderSelfAttention self_attn;
  DecoderCrossAttention cross_attn;
  layers::LayerNorm self_attn_layer_norm, cross_attn_layer_norm, final_layer_norm;
  detr::FeedForward ffn;
};

/// The module tree with the on-disk names ("model.*", "class_embed.*", "bbox_predictor.*").
class DabDetrImpl : public torch::nn::Module {
 public:
  explicit DabDetrImpl(const Config& c) : config(c) {
    const int64_t d = c.d_model;
    auto model = register_module("model", make<torch::nn::Module>());
    stem = detr::ConvStem(*model, c);
    auto refs = model->register_module("query_refpoint_embeddings", make<torch::nn::Module>());
    query_refpoint_embeddings = refs->register_parameter("weight", at::empty({c.num_queries, 4}));
    if (c.num_patterns > 0) {
      auto p = model->register_module("patterns", make<torch::nn::Module>());
      patterns = p->register_parameter("weight", at::empty({c.num_patterns, d}));
    }
    auto encoder = model->register_module("encoder", make<torch::nn::Module>());
    encoder_query_scale =
        encoder->register_module("query_scale", make<layers::MLPImpl>(d, d, d, 2));
    std::vector<std::shared_ptr<detr::EncoderLayerImpl>> el;
    for (int64_t i = 0; i < c.encoder_layers; ++i) el.push_back(make<detr::EncoderLayerImpl>(c));
    encoder_layers = layers::register_list(*encoder, "layers", el);
    if (c.normalize_before)
      encoder_norm = encoder->register_module("norm", make<layers::LayerNormImpl>(d, 1e-5));
    auto decoder = model->register_module("decoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<DecoderLayerImpl>> dl;
    for (int64_t i = 0; i < c.decoder_layers; ++i) dl.push_back(make<DecoderLayerImpl>(c, i == 0));
    decoder_layers = layers::register_list(*decoder, "layers", dl);
    decoder_layernorm = decoder->register_module("layernorm", make<layers::LayerNormImpl>(d, 1e-5));
    query_scale = decoder->register_module("query_scale", make<layers::MLPImpl>(d, d, d, 2));
    ref_point_head =
        decoder->register_module("ref_point_head", make<layers::MLPImpl>(2 * d, d, d, 2));
    ref_anchor_head =
        decoder->register_module("ref_anchor_head", make<layers::MLPImpl>(d, d, 2, 2));
    class_embed = register_module("class_embed", make<layers::LinearImpl>(d, c.num_labels));
    bbox_predictor = register_module("bbox_predictor", make<layers::MLPImpl>(d, d, 4, 3));
  }

  /// pixel_values (B, C, H, W), pixel_mask (B, H, W) (nonzero = valid). Returns logits
  /// (B, Q', num_labels) and pred_boxes (B, Q', 4); Q' = num_queries * max(1, num_patterns).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const at::Tensor& pixel_mask) const {
    const auto s = stem.forward(pixel_values, pixel_mask);
    const int64_t B = s.source.size(0), D = config.d_model;
    const auto pos = sine_position_embedding(s.mask, config, s.source.scalar_type());

    // DabDetrEncoder: the position embeddings scaled per layer by query_scale(x).
    at::Tensor memory = s.source;
    for (const auto& layer : encoder_layers)
      memory = layer->forward(memory, pos * encoder_query_scale->forward(memory), s.bias);
    if (encoder_norm) memory = encoder_norm->forward(memory);

    // DabDetrModel: zero queries over the anchors, or each pattern over every anchor.
    at::Tensor anchors = query_refpoint_embeddings.unsqueeze(0).repeat({B, 1, 1});
    at::Tensor x;
    if (config.num_patterns == 0) {
      x = at::zeros({B, config.num_queries, D}, s.source.options());
    } else {
      x = patterns.unsqueeze(1).unsqueeze(1).repeat({1, config.num_queries, B, 1}).flatten(0, 1);
      x = x.permute({1, 0, 2});
      anchors = anchors.repeat({1, config.num_patterns, 1});
    }

    // DabDetrDecoder: per layer the anchors' sine embedding gives the query positions
    // (ref_point_head), its (x, y) half is scaled by query_scale(x) and modulated by the
    // predicted anchor size over the anchor's (ref_anchor_head: w, h), then the box head refines
    // the anchors (iter_update).
    at::Tensor reference = anchors.sigmoid();  // (B, Q', 4) cx, cy, w, h
    at::Tensor last_reference = reference;
    for (size_t i = 0; i < decoder_layers.size(); ++i) {
      const auto sine = deformable_detr::anchor_position_embedding(reference, D / 2);
      const auto query_pos = ref_point_head->forward(sine);
      auto xy = sine.narrow(-1, 0, D);
      if (i > 0) xy = xy * query_scale->forward(x);
      const auto anchor_size = ref_anchor_head->forward(x).sigmoid();
      const auto scale_w = (anchor_size.select(-1, 0) / reference.select(-1, 2)).unsqueeze(-1);
      const auto scale_h = (anchor_size.select(-1, 1) / reference.select(-1, 3)).unsqueeze(-1);
      const auto query_sine =
          at::cat({xy.narrow(-1, 0, D / 2) * scale_h, xy.narrow(-1, D / 2, D / 2) * scale_w}, -1);
      x = decoder_layers[i]->forward(x, query_pos, query_sine, memory, pos, s.bias);
      last_reference = reference;
      if (i + 1 < decoder_layers.size())
        reference = (bbox_predictor->forward(x) + layers::inverse_sigmoid(reference)).sigmoid();
    }
    x = decoder_layernorm->forward(x);
    const auto boxes =
        (bbox_predictor->forward(x) + layers::inverse_sigmoid(last_reference)).sigmoid();
    return {class_embed->forward(x), boxes};
  }

  Config config;
  detr::ConvStem stem;
  at::Tensor query_refpoint_embeddings, patterns;
  layers::MLP encoder_query_scale;
  std::vector<std::shared_ptr<detr::EncoderLayerImpl>> encoder_layers;
  layers::LayerNorm encoder_norm;
  std::vector<std::shared_ptr<DecoderLayerImpl>> decoder_layers;
  layers::LayerNorm decoder_layernorm;
  layers::MLP query_scale, ref_point_head, ref_anchor_head, bbox_predictor;
  layers::Linear class_embed;
};

class DabDetrModel : public ModuleModel<DabDetrImpl> {
 public:
  DabDetrModel(std::shared_ptr<DabDetrImpl> net, const LoadOptions& options)
      : ModuleModel("dab-detr", Task::object_detection, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.num_channels);
    const at::Tensor mask = core::checked_pixel_mask("dab-detr", x, pixel_mask, options_.device);
    auto [logits, boxes] = net_->forward(x, mask);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }
};

/// The box head is tied to the decoder's (DabDetrForObjectDetection._tied_weights_keys:
/// model.decoder.bbox_embed = bbox_predictor): save_pretrained writes bbox_predictor only; a
/// file that carries the decoder's copy too (or only it) loads the same.
core::LoadRules load_rules() {
  core::LoadRules rules;
  rules.aliases = [](const std::string& key) {
    static const std::string prefix = "bbox_predictor.";
    std::vector<std::string> out;
    if (key.rfind(prefix, 0) == 0)
      out.push_back("model.decoder.bbox_embed." + key.substr(prefix.size()));
    return out;
  };
  rules.ignored_file_keys = {R"(model\.decoder\.bbox_embed\.layers\.[0-2]\.(weight|bias))"};
  return rules;
}

}  // namespace
}  // namespace dab_detr

namespace {

/// Default of the attention modules' `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the dab_detr_tiny fixture. It is not: manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "dab-detr" (DabDetrConfig's
/// spelling). The timm backbone's architecture is read from the checkpoint
/// (detr::read_backbone); the rest is strict. Throws core::ConfigError / core::CheckpointError
/// naming the file and the field or key.
std::unique_ptr<Model> load_dab_detr(const std::string& dir, const nlohmann::json& config,
                                     const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  auto c = dab_detr::parse_config(view);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  detr::read_backbone(c, *file);
  auto net = std::make_shared<dab_detr::DabDetrImpl>(c);
  core::load_state_dict(*net, *file, dab_detr::load_rules(), options.dtype, options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<dab_detr::DabDetrModel>(std::move(net), options);
}

// DAB-DETR (Liu et al., "DAB-DETR: Dynamic Anchor Boxes are Better Queries for DETR", ICLR
// 2022) as transformers 5.17 DabDetrForObjectDetection: DETR's ResNet backbone (timm's as
// IDEA-Research/dab-detr-resnet-50 publishes it, or transformers' ResNetBackbone) and
// input_projection; sine position embeddings with their own temperatures; an encoder whose
// position embeddings are scaled per layer (query_scale), PReLU feed-forwards; learned anchor
// boxes (cx, cy, w, h) as queries, whose sine embedding gives the query positions and, scaled
// and size-modulated, the conditional cross-attention's spatial query, refined by the box head
// after every decoder layer. class_embed (num_labels, sigmoid) and bbox_predictor offset by the
// last anchors' inverse sigmoid. forward() takes pixel_values (B, 3, H, W) and an optional
// pixel_mask (B, H, W); it returns logits (B, num_queries, num_labels) and pred_boxes
// (B, num_queries, 4), float32 (num_patterns > 0: num_queries * num_patterns queries).
// Post-processing: ConditionalDetrImageProcessor.post_process_object_detection (the Hub
// checkpoints' processor; sigmoid, top-100 over queries x classes: image::DetectionHead::
// deformable_detr).
const FamilyRegistrar registered{
    Family{"dab_detr", {"dab-detr"}, /*order=*/17, load_dab_detr}
        .predicts({Task::object_detection}, image::DetectionHead::deformable_detr)
        .takes_pixel_mask()
        .fused_attention(kFusedAttentionDefault)
        .layouts(detr::with_resnet_backbone_rules(
                     {{"qkv_concat", {"DetrAttention"}, "", path_with("encoder")}}),
                 {"batchnorm_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
