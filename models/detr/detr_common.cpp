// Shared DETR-family pieces (see detr_common.h). Every step keeps transformers' operation order
// so that float32 results match.
#include "models/detr/detr_common.h"

#include <c10/util/StringUtil.h>

#include <limits>
#include <regex>
#include <stdexcept>

#include "models/deformable_detr/geometry.h"

namespace libreyolo::models::detr {

Config parse_config(const core::ConfigView& v, const ConfigSchema& schema) {
  Config c;
  const std::string hidden = schema.hidden_field;
  c.d_model = v.get_int(hidden, 256);
  c.encoder_layers = v.get_int("encoder_layers", 6);
  c.decoder_layers = v.get_int("decoder_layers", 6);
  c.encoder_heads = v.get_int("encoder_attention_heads", 8);
  c.decoder_heads = v.get_int("decoder_attention_heads", 8);
  c.encoder_ffn = v.get_int("encoder_ffn_dim", 2048);
  c.decoder_ffn = v.get_int("decoder_ffn_dim", 2048);
  c.num_queries = v.get_int("num_queries", schema.default_num_queries);
  c.num_channels = v.get_int("num_channels", 3);
  const auto act = v.get_string("activation_function", schema.default_activation);
  if (schema.allow_prelu && act == "prelu") {
    c.prelu = true;
  } else {
    try {
      c.act = layers::activation_from_name(act);
    } catch (const std::invalid_argument& e) {
      v.fail("activation_function", e.what());
    }
  }
  c.id2label = v.id2label();
  // transformers writes no id2label for its default 2 labels (PreTrainedConfig num_labels 2).
  c.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  if (schema.has_position_embedding_type)
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
      c.hf_backbone.out_indices = {c.hf_backbone.out_indices.back()};  // the last map only
    }
  } else if (v.get_bool("use_timm_backbone", true)) {
    c.timm = true;
    c.timm_name = v.get_string("backbone", "resnet50");
    // `dilation` gives the timm backbone output_stride 16 (DC5).
    c.timm_output_stride = v.get_bool("dilation", false) ? 16 : 32;
  } else {           // (`dilation` is a timm option: transformers ignores it here too)
    c.timm = false;  // the configs' default ResNetConfig(out_features=["stage4"])
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
  if (c.d_model <= 0) v.fail(hidden, "must be positive");
  if (c.encoder_heads <= 0 || c.d_model % c.encoder_heads != 0)
    v.fail("encoder_attention_heads", "must divide " + hidden);
  if (c.decoder_heads <= 0 || c.d_model % c.decoder_heads != 0)
    v.fail("decoder_attention_heads", "must divide " + hidden);
  if (c.d_model % 2 != 0) v.fail(hidden, "must be even (position embedding)");
  if (c.encoder_layers < 0) v.fail("encoder_layers", "must not be negative");
  if (c.decoder_layers < 1) v.fail("decoder_layers", "must be positive");
  if (c.num_queries < 1) v.fail("num_queries", "must be positive");
  if (c.num_labels < 1) v.fail("num_labels", "must be positive");
  return c;
}

void read_backbone(Config& c, const core::SafetensorsFile& file) {
  if (!c.timm) return;
  const std::string wrapped = std::string(kBackbonePrefix) + "_backbone.";
  c.timm_wrapped = file.contains(wrapped + "conv1.weight");
  c.timm_backbone = read_timm_resnet_config(file, c.timm_wrapped ? wrapped : kBackbonePrefix,
                                            c.num_channels, c.timm_last_stage, c.timm_name);
  c.timm_backbone.output_stride = c.timm_output_stride;
}

at::Tensor key_padding_bias(const at::Tensor& flat_mask, const at::Tensor& like) {
  const auto st = like.scalar_type();
  const double lowest = st == at::kHalf       ? -65504.0
                        : st == at::kBFloat16 ? -3.3895313892515355e38
                                              : std::numeric_limits<float>::lowest();
  return at::zeros(flat_mask.sizes(), like.options())
      .masked_fill(flat_mask.logical_not(), lowest)
      .view({flat_mask.size(0), 1, 1, -1});
}

ConvStem::ConvStem(torch::nn::Module& model, const Config& c)
    : d_model(c.d_model), learned_positions(c.learned_positions) {
  auto backbone = model.register_module("backbone", make<torch::nn::Module>());
  auto conv_encoder = backbone->register_module("conv_encoder", make<torch::nn::Module>());
  int64_t channels = 0;
  if (c.timm) {
    auto& owner = c.timm_wrapped
                      ? *conv_encoder->register_module("model", make<torch::nn::Module>())
                      : *conv_encoder;
    timm_backbone = owner.register_module(c.timm_wrapped ? "_backbone" : "model",
                                          make<TimmResNetImpl>(c.timm_backbone));
    channels = timm_backbone->channels();
  } else {
    hf_backbone = conv_encoder->register_module(
        "model", make<deformable_detr::ResNetBackboneImpl>(c.hf_backbone));
    channels = hf_backbone->channels().back();
  }
  if (c.learned_positions) {
    auto pe = model.register_module("position_embedding", make<torch::nn::Module>());
    auto rows = pe->register_module("row_embeddings", make<torch::nn::Module>());
    auto cols = pe->register_module("column_embeddings", make<torch::nn::Module>());
    row_embeddings = rows->register_parameter("weight", at::empty({50, c.d_model / 2}));
    column_embeddings = cols->register_parameter("weight", at::empty({50, c.d_model / 2}));
  }
  layers::Conv2dOptions p;
  p.in = channels;
  p.out = c.d_model;
  p.kernel = 1;
  p.bias = true;
  input_projection = model.register_module("input_projection", make<layers::Conv2dImpl>(p));
}

ConvStem::Output ConvStem::forward(const at::Tensor& pixel_values,
                                   const at::Tensor& pixel_mask) const {
  return from_feature(timm_backbone ? timm_backbone->forward(pixel_values)
                                    : hf_backbone->forward(pixel_values).back(),
                      pixel_mask);
}

ConvStem::Output ConvStem::from_feature(const at::Tensor& feature,
                                        const at::Tensor& pixel_mask) const {
  const int64_t h = feature.size(2), w = feature.size(3);
  Output out;
  out.mask = at::upsample_nearest2d(pixel_mask.unsqueeze(0).to(at::kFloat), {h, w})
                 .to(at::kBool)
                 .squeeze(0);
  out.source = input_projection->forward(feature).flatten(2).transpose(1, 2);
  out.flat_mask = out.mask.flatten(1);
  out.bias = key_padding_bias(out.flat_mask, out.source);
  return out;
}

at::Tensor ConvStem::position_embedding(const at::Tensor& mask, at::ScalarType dtype) const {
  const int64_t B = mask.size(0), h = mask.size(1), w = mask.size(2);
  at::Tensor pos;
  if (!learned_positions) {
    pos = deformable_detr::sine_position_embedding(mask, d_model / 2, dtype, /*offset=*/0);
  } else {
    // DetrLearnedPositionEmbedding: [column embedding, row embedding] per pixel.
    if (h > 50 || w > 50)
      throw std::invalid_argument(
          c10::str("detr: a ", h, "x", w,
                   " feature map exceeds the 50x50 learned position embeddings "
                   "(position_embedding_type \"learned\"); send smaller images"));
    const auto opts = at::TensorOptions().dtype(at::kLong).device(row_embeddings.device());
    const auto x_emb = at::embedding(column_embeddings, at::arange(w, opts));
    const auto y_emb = at::embedding(row_embeddings, at::arange(h, opts));
    pos = at::cat({x_emb.unsqueeze(0).repeat({h, 1, 1}), y_emb.unsqueeze(1).repeat({1, w, 1})}, -1)
              .permute({2, 0, 1})
              .unsqueeze(0)
              .repeat({B, 1, 1, 1});
  }
  return pos.flatten(2).transpose(1, 2);
}

std::vector<LayoutClassRule> with_resnet_backbone_rules(std::vector<LayoutClassRule> rules) {
  // timm's module paths end in "conv_encoder.model" (the stem) and "layer<s>.<i>" (a block);
  // transformers' ResNet has "...layers.<i>.layer.<j>" (no digit after "layer") and "shortcut".
  auto timm_stem = [](const std::string& path) {
    static const std::string tail = "conv_encoder.model";
    return path.size() >= tail.size() &&
           path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
  };
  auto timm_block = [](const std::string& path) {
    static const std::regex block(R"((^|.*\.)layer[0-9]+\.[0-9]+)");
    return std::regex_match(path, block);
  };
  std::vector<LayoutClassRule> out{
      {"batchnorm_fold", {"ResNet"}, "", timm_stem},
      {"batchnorm_fold", {"Bottleneck", "BasicBlock"}, "", timm_block},
      {"batchnorm_fold", {"ResNetShortCut"}, "", path_with("shortcut")},
      {"batchnorm_fold", {"ResNetConvLayer"}}};
  for (auto& r : rules) out.push_back(std::move(r));
  return out;
}

core::LoadRules position_embedding_load_rules() {
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

PReLUImpl::PReLUImpl() { weight = register_parameter("weight", at::empty({1})); }

FeedForward::FeedForward(torch::nn::Module& owner, const Config& c, int64_t ffn_dim) : act(c.act) {
  fc1 = owner.register_module("fc1", make<layers::LinearImpl>(c.d_model, ffn_dim));
  fc2 = owner.register_module("fc2", make<layers::LinearImpl>(ffn_dim, c.d_model));
  if (c.prelu) prelu = owner.register_module("activation_fn", make<PReLUImpl>());
}

at::Tensor FeedForward::forward(const at::Tensor& x) const {
  const auto h = fc1->forward(x);
  return fc2->forward(prelu ? prelu->forward(h) : layers::activate(act, h));
}

layers::Attention attention(int64_t d, int64_t heads) {
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = heads;
  return make<layers::AttentionImpl>(o);  // q_proj, k_proj, v_proj, out_proj (on-disk names)
}

EncoderLayerImpl::EncoderLayerImpl(const Config& c) : pre_norm(c.pre_norm) {
  self_attn = register_module("self_attn", attention(c.d_model, c.encoder_heads));
  self_attn_layer_norm =
      register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  ffn = FeedForward(*this, c, c.encoder_ffn);
  final_layer_norm =
      register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
}

at::Tensor EncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& pos,
                                     const at::Tensor& bias) const {
  if (pre_norm) {  // TableTransformerEncoderLayer: the values are the normalised input too
    const auto n = self_attn_layer_norm->forward(x);
    const auto nqk = n + pos;
    const auto h = x + self_attn->forward(nqk, nqk, n, bias);
    return h + ffn.forward(final_layer_norm->forward(h));
  }
  const auto qk = x + pos;
  auto h = x + self_attn->forward(qk, qk, x, bias);
  h = self_attn_layer_norm->forward(h);
  h = h + ffn.forward(h);
  return final_layer_norm->forward(h);
}

}  // namespace libreyolo::models::detr
