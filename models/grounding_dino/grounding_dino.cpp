// GroundingDinoForObjectDetection / MMGroundingDinoForObjectDetection (transformers 5.17
// models/grounding_dino/modeling_grounding_dino.py, mm_grounding_dino/), inference only; every
// step keeps transformers' operation order so that float32 results match.

#include "models/grounding_dino/grounding_dino.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/core/config.h"
#include "models/core/pixel_mask.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/deformable_detr/geometry.h"
#include "models/deformable_detr/input_proj.h"
#include "models/grounding_dino/config.h"
#include "models/grounding_dino/decoder_layer.h"
#include "models/grounding_dino/encoder_layer.h"
#include "models/grounding_dino/postprocess.h"
#include "models/layers/attention.h"
#include "models/layers/bert_model.h"
#include "models/layers/gather_rows.h"
#include "models/layers/layers.h"
#include "models/module_model.h"
#include "models/prompted.h"
#include "models/registry/family.h"
#include "models/swin/backbone.h"

namespace libreyolo::models {
namespace grounding_dino {
namespace {

namespace geometry = deformable_detr;

}  // namespace

/// Multi-head attention modules' `fused_attn` default: the manual math (no fixture measured
/// byte-exact SDPA; the phrase masks are dense additive biases).
constexpr bool kFusedAttentionDefault = false;

namespace {

using deformable_detr::InputProjImpl;

/// A batch's captions through the text encoder: what the feature enhancer reads of the text
/// (and what the prompt cache keeps per caption, PromptedDetector::encode_text).
struct Captions {
  at::Tensor features;      ///< (B, T, d_model) model dtype: BERT + text_projection
  at::Tensor phrase_mask;   ///< (B, T, T) bool: tokens attend within their phrase
  at::Tensor position_ids;  ///< (B, T) int64: the index within the phrase
  at::Tensor token_mask;    ///< (B, T) bool: true on tokens, false on padding
};

/// The module tree with the on-disk names ("model.*", "bbox_embed.*", "class_embed.*").
class GroundingDinoImpl : public torch::nn::Module {
 public:
  explicit GroundingDinoImpl(const Config& c) : config(c) {
    const int64_t d = c.d_model;
    auto model = register_module("model", std::make_shared<torch::nn::Module>());
    auto backbone_parent =
        model->register_module("backbone", std::make_shared<torch::nn::Module>());
    auto conv_encoder =
        backbone_parent->register_module("conv_encoder", std::make_shared<torch::nn::Module>());
    backbone =
        conv_encoder->register_module("model", std::make_shared<swin::BackboneImpl>(c.backbone));
    const auto channels = backbone->channels();
    std::vector<std::shared_ptr<InputProjImpl>> projs;
    for (const auto ch : channels) projs.push_back(std::make_shared<InputProjImpl>(ch, d, false));
    int64_t in = channels.back();
    for (auto l = static_cast<int64_t>(channels.size()); l < c.num_levels; ++l) {
      projs.push_back(std::make_shared<InputProjImpl>(in, d, true));
      in = d;
    }
    input_proj = layers::register_list(*model, "input_proj_vision", projs);
    text_backbone =
        model->register_module("text_backbone", std::make_shared<layers::BertModelImpl>(c.text));
    text_projection = model->register_module(
        "text_projection", std::make_shared<layers::LinearImpl>(c.text.hidden_size, d));
    auto qpe =
        model->register_module("query_position_embeddings", std::make_shared<torch::nn::Module>());
    query_position_embeddings = qpe->register_parameter("weight", at::empty({c.num_queries, d}));
    level_embed = model->register_parameter("level_embed", at::empty({c.num_levels, d}));
    auto encoder = model->register_module("encoder", std::make_shared<torch::nn::Module>());
    std::vector<std::shared_ptr<EncoderLayerImpl>> el;
    for (int64_t i = 0; i < c.encoder_layers; ++i)
      el.push_back(std::make_shared<EncoderLayerImpl>(c));
    encoder_layers = layers::register_list(*encoder, "layers", el);
    auto decoder = model->register_module("decoder", std::make_shared<torch::nn::Module>());
    std::vector<std::shared_ptr<DecoderLayerImpl>> dl;
    for (int64_t i = 0; i < c.decoder_layers; ++i)
      dl.push_back(std::make_shared<DecoderLayerImpl>(c));
    decoder_layers = layers::register_list(*decoder, "layers", dl);
    decoder_norm = decoder->register_module(
        "layer_norm", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
    reference_points_head = decoder->register_module(
        "reference_points_head", std::make_shared<layers::MLPImpl>(2 * d, d, d, 2));
    enc_output = model->register_module("enc_output", std::make_shared<layers::LinearImpl>(d, d));
    enc_output_norm = model->register_module(
        "enc_output_norm", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
    encoder_output_bbox_embed = model->register_module(
        "encoder_output_bbox_embed", std::make_shared<layers::MLPImpl>(d, d, 4, 3));
    std::vector<layers::MLP> be;
    for (int64_t i = 0; i < c.decoder_layers; ++i)
      be.push_back(std::make_shared<layers::MLPImpl>(d, d, 4, 3));
    bbox_embed = layers::register_list(*this, "bbox_embed", be);
    if (c.mm) {
      // MMGroundingDinoContrastiveEmbedding's scalar bias.
      auto enc_class = model->register_module("encoder_output_class_embed",
                                              std::make_shared<torch::nn::Module>());
      encoder_class_bias = enc_class->register_parameter("bias", at::empty({}));
      auto ce = register_module("class_embed", std::make_shared<torch::nn::Module>());
      for (int64_t i = 0; i < c.decoder_layers; ++i) {
        auto m = ce->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
        class_bias.push_back(m->register_parameter("bias", at::empty({})));
      }
    }
  }

  void prepare(const at::Device& device) { backbone->prepare(device); }

  /// GroundingDinoContrastiveEmbedding (MM: scaled by 1/sqrt(d) plus `bias`): queries (B, Q, d)
  /// . text (B, T, d) -> (B, Q, max_text_len) float32, -inf where token_mask (B, T) is false
  /// and past T.
  at::Tensor contrastive(const at::Tensor& queries, const at::Tensor& text,
                         const at::Tensor& token_mask, const at::Tensor& bias) const {
    auto out = at::matmul(queries, text.transpose(-1, -2));
    if (config.mm) out = out / std::sqrt(static_cast<double>(queries.size(-1))) + bias;
    const double inf = std::numeric_limits<double>::infinity();
    out = out.masked_fill(token_mask.logical_not().unsqueeze(1), -inf);
    auto full = at::full({out.size(0), out.size(1), config.max_text_len}, -inf,
                         out.options().dtype(at::kFloat));
    full.slice(2, 0, out.size(2)).copy_(out);
    return full;
  }

  /// BERT then text_projection: input_ids, token_type_ids, position_ids (B, T) int64 and the
  /// phrase self-attention mask (B, T, T) bool -> (B, T, d_model) in the model's dtype.
  at::Tensor text_features(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                           const at::Tensor& position_ids, const at::Tensor& phrase_mask) const {
    return text_projection->forward(
        text_backbone->forward(input_ids, token_type_ids, position_ids, phrase_mask));
  }

  /// The text side of forward_text (inputs checked and on the model's device): phrase masks
  /// over the padded batch, everything cut at max_text_len as upstream, then text_features.
  Captions encode_captions(at::Tensor input_ids, const at::Tensor& attention_mask,
                           at::Tensor token_type_ids) const {
    Captions t;
    std::tie(t.phrase_mask, t.position_ids) = phrase_masks(input_ids);
    t.token_mask = attention_mask.to(at::kBool);
    if (input_ids.size(1) > config.max_text_len) {
      const int64_t n = config.max_text_len;
      t.phrase_mask = t.phrase_mask.slice(1, 0, n).slice(2, 0, n);
      t.position_ids = t.position_ids.slice(1, 0, n);
      input_ids = input_ids.slice(1, 0, n);
      token_type_ids = token_type_ids.slice(1, 0, n);
      t.token_mask = t.token_mask.slice(1, 0, n);
    }
    t.features = text_features(input_ids, token_type_ids, t.position_ids, t.phrase_mask);
    return t;
  }

  /// Everything after the text encoder (see TextConditioned::forward_text): pixel inputs
  /// checked and on the model's device, `captions` for the same B images.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const at::Tensor& pixel_mask,
                                            const Captions& captions) const {
    const int64_t d = config.d_model;
    const auto& text_mask = captions.phrase_mask;
    const auto& position_ids = captions.position_ids;
    const auto& token_mask = captions.token_mask;
    const auto& text_features = captions.features;

    // Multi-scale maps, masks and position embeddings.
    const auto features = backbone->forward(pixel_values);
    const auto mask_input = pixel_mask.unsqueeze(0).to(at::kFloat);
    auto level_mask = [&](const at::Tensor& source) {
      return at::upsample_nearest2d(mask_input, {source.size(2), source.size(3)})
          .to(at::kBool)
          .squeeze(0);
    };
    std::vector<at::Tensor> sources, masks;
    for (size_t l = 0; l < features.size(); ++l) {
      sources.push_back(input_proj[l]->forward(features[l]));
      masks.push_back(level_mask(features[l]));
    }
    for (size_t l = features.size(); l < static_cast<size_t>(config.num_levels); ++l) {
      sources.push_back(
          input_proj[l]->forward(l == features.size() ? features.back() : sources.back()));
      masks.push_back(level_mask(sources.back()));
    }
    kernels::SpatialShapes shapes;
    std::vector<at::Tensor> source_flat, mask_flat, pos_flat, ratios;
    for (size_t l = 0; l < sources.size(); ++l) {
      const auto& s = sources[l];
      shapes.push_back({s.size(2), s.size(3)});
      const auto pos =
          geometry::sine_position_embedding(masks[l], d / 2, at::kFloat, 0.0, config.temperature)
              .to(s.scalar_type());
      source_flat.push_back(s.flatten(2).transpose(1, 2));
      pos_flat.push_back(pos.flatten(2).transpose(1, 2) +
                         level_embed.select(0, static_cast<int64_t>(l)).view({1, 1, -1}));
      mask_flat.push_back(masks[l].flatten(1));
    }
    const auto source = at::cat(source_flat, 1);
    const auto valid = at::cat(mask_flat, 1);
    for (const auto& m : masks) ratios.push_back(geometry::valid_ratio(m, source.scalar_type()));
    const auto valid_ratios = at::stack(ratios, 1);  // (B, L, 2)

    // Feature enhancer.
    EncoderInputs in;
    in.vision_pos = at::cat(pos_flat, 1);
    in.vision_valid = valid;
    in.vision_padding = valid.logical_not();
    in.reference_points = geometry::encoder_reference_points(shapes, valid_ratios);
    in.shapes = shapes;
    in.text_padding = token_mask.logical_not();
    in.text_bias =
        at::zeros(text_mask.sizes(), text_features.options())
            .masked_fill(text_mask.logical_not(), layers::finfo_min(text_features.scalar_type()))
            .unsqueeze(1);
    // encode_sinusoidal_position_embedding of the int64 position ids returns int64 upstream:
    // the sines and cosines truncated toward zero (what transformers 5.17 computes).
    in.text_pos = geometry::anchor_position_embedding(position_ids.unsqueeze(-1).to(at::kFloat), d)
                      .trunc()
                      .to(text_features.scalar_type());
    at::Tensor vision = source, text = text_features;
    for (const auto& layer : encoder_layers)
      std::tie(vision, text) = layer->forward(vision, text, in);

    // Two-stage query selection.
    const int64_t B = vision.size(0), S = vision.size(1);
    if (config.num_queries > S)
      throw std::invalid_argument(c10::str(
          "grounding_dino: num_queries = ", config.num_queries, " exceeds the ", S,
          " encoder tokens of a ", pixel_values.size(2), "x", pixel_values.size(3), " input"));
    auto [masked, proposals] =
        geometry::encoder_output_proposals(vision, in.vision_padding, shapes);
    const auto object_query = enc_output_norm->forward(enc_output->forward(masked));
    const auto enc_class = contrastive(object_query, text, token_mask, encoder_class_bias);
    const auto topk = std::get<1>(at::topk(std::get<0>(enc_class.max(-1)), config.num_queries, 1));
    // The box head on the selected tokens only (upstream runs it on all S and gathers): it is
    // row-wise, so the gathered rows are the same.
    auto ref = (encoder_output_bbox_embed->forward(layers::gather_rows(object_query, topk)) +
                layers::gather_rows(proposals, topk))
                   .sigmoid();
    at::Tensor h = query_position_embeddings.unsqueeze(0).repeat({B, 1, 1});

    // Decoder: `ref` ends as the last layer's input reference (the heads use it).
    const auto text_bias = token_mask.logical_not()
                               .to(text.scalar_type())
                               .mul(layers::finfo_min(text.scalar_type()))
                               .view({B, 1, 1, -1});
    const auto ratios4 = at::cat({valid_ratios, valid_ratios}, -1).unsqueeze(1);
    const auto n = decoder_layers.size();
    for (size_t i = 0; i < n; ++i) {
      const auto ref_in = ref.unsqueeze(2) * ratios4;
      const auto query_pos = reference_points_head->forward(
          geometry::anchor_position_embedding(ref_in.select(2, 0), d / 2));
      h = decoder_layers[i]->forward(h, query_pos, ref_in, vision, valid, shapes, text, text_bias);
      if (i + 1 < n) ref = (bbox_embed[i]->forward(h) + at::logit(ref, 1e-5)).sigmoid();
    }
    const auto last = decoder_norm->forward(h);
    const auto logits =
        contrastive(last, text, token_mask, config.mm ? class_bias[n - 1] : at::Tensor());
    const auto boxes = (bbox_embed[n - 1]->forward(last) + at::logit(ref, 1e-5)).sigmoid();
    return {logits, boxes};
  }

  Config config;
  std::shared_ptr<swin::BackboneImpl> backbone;
  std::vector<std::shared_ptr<InputProjImpl>> input_proj;
  std::shared_ptr<layers::BertModelImpl> text_backbone;
  layers::Linear text_projection, enc_output;
  at::Tensor query_position_embeddings, level_embed, encoder_class_bias;
  std::vector<std::shared_ptr<EncoderLayerImpl>> encoder_layers;
  std::vector<std::shared_ptr<DecoderLayerImpl>> decoder_layers;
  layers::LayerNorm decoder_norm, enc_output_norm;
  layers::MLP reference_points_head, encoder_output_bbox_embed;
  std::vector<layers::MLP> bbox_embed;
  std::vector<at::Tensor> class_bias;
};

/// The most labels of one image (the server's cap before tokenizing, as OWL-ViT's).
constexpr int64_t kMaxLabels = 256;

/// The prompt of one image: its labels merged as the processor merges a candidate-label list.
std::string image_prompt(const std::vector<std::string>& labels) { return merge_labels(labels); }

class GroundingDinoModel : public ModuleModel<GroundingDinoImpl>,
                           public TextConditioned,
                           public PromptedDetector {
 public:
  GroundingDinoModel(std::string model_type, std::shared_ptr<GroundingDinoImpl> net,
                     text::BertTokenizer tokenizer, const LoadOptions& options)
      : ModuleModel(std::move(model_type), Task::object_detection, std::move(net), options),
        tokenizer_(std::move(tokenizer)) {}

  ModelOutput forward(const at::Tensor&, const at::Tensor&) const override {
    throw std::invalid_argument(model_type_ + ": needs a text prompt (input_ids)");
  }

  ModelOutput forward_text(const at::Tensor& pixel_values, const at::Tensor& pixel_mask,
                           const TextTensors& text) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.backbone.swin.num_channels);
    const at::Tensor mask = core::checked_pixel_mask(model_type_, x, pixel_mask, options_.device);
    const auto& ids = text.input_ids;
    if (!ids.defined() || ids.dim() != 2 || ids.size(0) != x.size(0) || ids.size(1) < 1 ||
        ids.scalar_type() != at::kLong)
      throw std::invalid_argument(c10::str(model_type_, ": input_ids must be (", x.size(0),
                                           ", L >= 1) int64, got ",
                                           ids.defined() ? ids.sizes() : at::IntArrayRef{}));
    auto same_shape = [&](const at::Tensor& t, const char* name) {
      if (!t.defined()) return at::Tensor();
      if (t.sizes() != ids.sizes() || !at::isIntegralType(t.scalar_type(), /*includeBool=*/true))
        throw std::invalid_argument(c10::str(model_type_, ": ", name, " must be an integer ",
                                             ids.sizes(), " tensor like input_ids, got ", t.sizes(),
                                             " ", t.scalar_type()));
      return t.to(options_.device, at::kLong);
    };
    const auto device_ids = ids.to(options_.device);
    auto attention = same_shape(text.attention_mask, "attention_mask");
    auto types = same_shape(text.token_type_ids, "token_type_ids");
    if (!attention.defined()) attention = at::ones_like(device_ids);
    if (!types.defined()) types = at::zeros_like(device_ids);
    return prompted_output(
        net_->forward(x, mask, net_->encode_captions(device_ids, attention, types)));
  }

  const text::BertTokenizer& tokenizer() const override { return tokenizer_; }
  int64_t max_text_len() const override { return net_->config.max_text_len; }

  // PromptedDetector (models/prompted.h): one caption per image, "a cat. a dog." from its labels.

  int64_t max_labels() const override { return kMaxLabels; }
  /// The caption's token limit: the model keeps the first max_text_len ids (upstream slices
  /// input_ids[:, :max_text_len]; its processor does not truncate).
  int64_t max_text_length() const override { return net_->config.max_text_len; }

  TextQueries encode_labels(const std::vector<std::vector<std::string>>& labels) const override {
    std::vector<std::string> prompts;
    for (const auto& l : labels) prompts.push_back(image_prompt(l));
    auto t = encode_prompts(tokenizer_, prompts);
    TextQueries q;
    q.input_ids = t.input_ids.to(options_.device);
    q.attention_mask = t.attention_mask.to(options_.device);
    q.token_type_ids = t.token_type_ids.to(options_.device);
    q.truncated = truncation(labels);
    return q;
  }

  PromptedOutput forward_prompted(const at::Tensor& pixel_values,
                                  const TextQueries& queries) const override {
    return forward_prompted_masked(pixel_values, at::Tensor(), queries);
  }

  PromptedOutput forward_prompted_masked(const at::Tensor& pixel_values,
                                         const at::Tensor& pixel_mask,
                                         const TextQueries& queries) const override {
    PromptedOutput out;
    static_cast<ModelOutput&>(out) =
        forward_text(pixel_values, pixel_mask,
                     {queries.input_ids, queries.attention_mask, queries.token_type_ids});
    return out;
  }

  // The prompt cache's pieces (PromptedDetector::encode_text) are whole captions: BERT reads the
  // caption before the fusion layers mix it with the image, so one caption's Captions row is
  // the same whatever the image and the batch.

  bool caches_text() const override { return true; }

  /// One key per image: its caption's token ids as encode_labels makes them (int64 bytes).
  std::vector<std::vector<std::string>> text_keys(
      const std::vector<std::vector<std::string>>& labels) const override {
    std::vector<std::string> prompts;
    for (const auto& l : labels) prompts.push_back(image_prompt(l));
    const auto t = encode_prompts(tokenizer_, prompts);
    std::vector<std::vector<std::string>> keys;
    for (int64_t b = 0; b < t.input_ids.size(0); ++b) {
      const auto ids = t.input_ids[b].masked_select(t.attention_mask[b].to(at::kBool)).contiguous();
      keys.push_back({std::string(reinterpret_cast<const char*>(ids.data_ptr<int64_t>()),
                                  static_cast<size_t>(ids.numel()) * sizeof(int64_t))});
    }
    return keys;
  }

  /// Each caption's phrase masks on its own ids (as a batch of one: what upstream computes for
  /// an unpadded caption), cut at max_text_len, then one text forward over the keys padded.
  std::vector<EncodedText> encode_text(const std::vector<std::string>& keys) const override {
    if (keys.empty()) throw std::invalid_argument(model_type_ + ": no caption to encode");
    const auto device = at::TensorOptions().device(options_.device);
    std::vector<Captions> own;  // (1, T) each, T cut at max_text_len
    std::vector<at::Tensor> own_ids;
    int64_t longest = 0;
    for (const auto& key : keys) {
      if (key.empty() || key.size() % sizeof(int64_t) != 0)
        throw std::invalid_argument(
            c10::str(model_type_, ": a caption key of ", key.size(), " bytes is not token ids"));
      const auto n = static_cast<int64_t>(key.size() / sizeof(int64_t));
      auto ids = at::empty({1, n}, at::kLong);
      std::memcpy(ids.data_ptr<int64_t>(), key.data(), key.size());
      ids = ids.to(options_.device);
      Captions c;
      std::tie(c.phrase_mask, c.position_ids) = phrase_masks(ids);
      const int64_t t = std::min(n, net_->config.max_text_len);
      c.phrase_mask = c.phrase_mask.slice(1, 0, t).slice(2, 0, t);
      c.position_ids = c.position_ids.slice(1, 0, t);
      own_ids.push_back(ids.slice(1, 0, t));
      own.push_back(std::move(c));
      longest = std::max(longest, t);
    }
    const auto b = static_cast<int64_t>(keys.size());
    auto ids = at::full({b, longest}, tokenizer_.pad_id(), device.dtype(at::kLong));
    auto positions = at::zeros({b, longest}, device.dtype(at::kLong));
    auto masks = eye_masks(b, longest);
    for (int64_t i = 0; i < b; ++i) {
      const auto& c = own[static_cast<size_t>(i)];
      const int64_t t = c.position_ids.size(1);
      ids[i].slice(0, 0, t).copy_(own_ids[static_cast<size_t>(i)][0]);
      positions[i].slice(0, 0, t).copy_(c.position_ids[0]);
      masks[i].slice(0, 0, t).slice(1, 0, t).copy_(c.phrase_mask[0]);
    }
    const auto features = net_->text_features(ids, at::zeros_like(ids), positions, masks);
    std::vector<EncodedText> out;
    for (int64_t i = 0; i < b; ++i) {
      const auto& c = own[static_cast<size_t>(i)];
      const int64_t t = c.position_ids.size(1);
      out.push_back({{features[i].slice(0, 0, t).clone(), c.phrase_mask[0].clone(),
                      c.position_ids[0].clone(), at::ones({t}, device.dtype(at::kBool))}});
    }
    return out;
  }

  /// The captions padded (right) to the longest as the processor pads them: padding tokens
  /// attend to themselves only, position 0, and carry the text encoder's features of the
  /// padding token alone (what BERT computes for them in a padded batch; the fusion layers'
  /// max over all scores sees them).
  PromptedOutput forward_encoded(
      const at::Tensor& pixel_values, const at::Tensor& pixel_mask,
      const std::vector<std::vector<EncodedText>>& pieces) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.backbone.swin.num_channels);
    const at::Tensor mask = core::checked_pixel_mask(model_type_, x, pixel_mask, options_.device);
    const int64_t b = x.size(0), d = net_->config.d_model;
    if (static_cast<int64_t>(pieces.size()) != b)
      throw std::invalid_argument(
          c10::str(model_type_, ": ", pieces.size(), " encoded captions for ", b, " images"));
    int64_t longest = 0;
    for (const auto& image : pieces) {
      const auto* t = image.size() == 1 ? &image[0].tensors : nullptr;
      if (!t || t->size() != 4 || (*t)[0].dim() != 2 || (*t)[0].size(1) != d ||
          (*t)[1].sizes() != at::IntArrayRef{(*t)[0].size(0), (*t)[0].size(0)} ||
          (*t)[2].numel() != (*t)[0].size(0) || (*t)[3].numel() != (*t)[0].size(0))
        throw std::invalid_argument(c10::str(
            model_type_, ": each image takes one caption encoded by encode_text (features (T, ", d,
            "), phrase mask (T, T), position ids (T), token mask (T))"));
      longest = std::max(longest, (*t)[0].size(0));
    }
    const auto device = at::TensorOptions().device(options_.device);
    Captions c;
    c.features = at::empty({b, longest, d}, device.dtype(options_.dtype));
    c.phrase_mask = eye_masks(b, longest);
    c.position_ids = at::zeros({b, longest}, device.dtype(at::kLong));
    c.token_mask = at::zeros({b, longest}, device.dtype(at::kBool));
    at::Tensor pad;  // the padding token's features, computed when a caption is shorter
    for (int64_t i = 0; i < b; ++i) {
      const auto& t = pieces[static_cast<size_t>(i)][0].tensors;
      const int64_t n = t[0].size(0);
      if (n < longest) {
        if (!pad.defined()) {
          const auto one = at::ones({1, 1}, device.dtype(at::kLong));
          pad = net_->text_features(one * tokenizer_.pad_id(), one * 0, one * 0,
                                    one.to(at::kBool).unsqueeze(0))[0][0];
        }
        c.features[i].slice(0, n).copy_(pad.expand({longest - n, d}));
      }
      c.features[i].slice(0, 0, n).copy_(t[0]);
      c.phrase_mask[i].slice(0, 0, n).slice(1, 0, n).copy_(t[1]);
      c.position_ids[i].slice(0, 0, n).copy_(t[2]);
      c.token_mask[i].slice(0, 0, n).copy_(t[3]);
    }
    return prompted_output(net_->forward(x, mask, c));
  }

  /// A label is cut when its tokens or its '.' fall past max_text_len - 1 in the caption
  /// ([CLS] label0 . label1 . ... [SEP]; BERT splits at '.', so label j starts after the
  /// tokens and periods of the labels before it).
  std::vector<std::vector<bool>> truncation(
      const std::vector<std::vector<std::string>>& labels) const override {
    std::vector<std::vector<bool>> cut;
    for (size_t b = 0; b < labels.size(); ++b) {
      std::vector<bool> row;
      int64_t end = 0;  // index of the last token so far: [CLS] = 0, then each label's '.'
      for (size_t i = 0; i < labels[b].size(); ++i) {
        std::string label = labels[b][i];
        try {
          label = image_prompt({label});  // "label." stripped, lower-cased ('.' inside refused)
          end += static_cast<int64_t>(tokenizer_.content_ids(label).size());
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(c10::str("labels[", b, "][", i, "]: ", e.what()));
        }
        row.push_back(end >= net_->config.max_text_len);
      }
      cut.push_back(std::move(row));
    }
    return cut;
  }

  /// post_process_grounded_object_detection's defaults (threshold 0.25, text_threshold 0.25).
  PromptThresholds default_thresholds() const override { return {0.25, 0.25}; }
  bool uses_text_threshold() const override { return true; }

  /// Boxes named by their phrase (labels -1: free phrases, not an index into the list).
  std::vector<PromptedDetections> post_process(
      const PromptedOutput& out, const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
      const std::vector<std::vector<std::string>>& labels,
      const PromptThresholds& thresholds) const override {
    if (labels.size() != target_sizes.size() ||
        static_cast<int64_t>(labels.size()) != out.logits.size(0))
      throw std::invalid_argument(c10::str(model_type_, ": ", labels.size(), " label lists and ",
                                           target_sizes.size(), " target sizes for a batch of ",
                                           out.logits.size(0)));
    std::vector<std::string> prompts;
    for (const auto& l : labels) prompts.push_back(image_prompt(l));
    const auto ids = encode_prompts(tokenizer_, prompts).input_ids;
    const auto dets = post_process_grounded_object_detection(
        out.logits, out.pred_boxes, ids, thresholds.box_threshold, thresholds.text_threshold,
        target_sizes, tokenizer_);
    std::vector<PromptedDetections> result;
    for (const auto& d : dets) {
      PromptedDetections p;
      p.scores = d.scores;
      p.boxes = d.boxes;
      p.labels = at::full({d.scores.numel()}, -1, at::kLong);
      p.phrases = d.phrases;
      result.push_back(std::move(p));
    }
    return result;
  }

 private:
  /// (logits, boxes) of GroundingDinoImpl::forward as float32 outputs.
  static PromptedOutput prompted_output(std::pair<at::Tensor, at::Tensor> forward) {
    PromptedOutput out;
    out.logits = forward.first.to(at::kFloat);
    out.pred_boxes = forward.second.to(at::kFloat);
    return out;
  }

  /// (n, t, t) bool identity masks on the model's device (a token attends to itself), writable.
  at::Tensor eye_masks(int64_t n, int64_t t) const {
    return at::eye(t, at::TensorOptions().dtype(at::kBool).device(options_.device))
        .unsqueeze(0)
        .repeat({n, 1, 1});
  }

  text::BertTokenizer tokenizer_;
};

/// Tied heads (GroundingDinoForObjectDetection._tied_weights_keys): `bbox_embed.i` (and MM's
/// `class_embed.i.bias`) read `model.decoder.<head>.i`, then index 0 when shared.
core::LoadRules load_rules(const Config& c) {
  core::LoadRules rules;
  const bool share_boxes = c.mm || c.decoder_bbox_embed_share;
  rules.aliases = [share_boxes](const std::string& key) {
    static const std::regex re(R"((bbox_embed|class_embed)\.(\d+)\.(.*))");
    std::smatch m;
    std::vector<std::string> out;
    if (!std::regex_match(key, m, re)) return out;
    const std::string head = m[1], index = m[2], rest = m[3];
    out.push_back("model.decoder." + head + "." + index + "." + rest);
    if ((head == "class_embed" || share_boxes) && index != "0") {
      out.push_back(head + ".0." + rest);
      out.push_back("model.decoder." + head + ".0." + rest);
    }
    return out;
  };
  rules.ignored_file_keys = {
      // The decoder's references to the heads (saved by older transformers).
      R"(model\.decoder\.(bbox|class)_embed\..*)",
      // Derived, recomputed; SwinBackbone's unused final norm (_keys_to_ignore_on_load_missing).
      R"(.*\.relative_position_index)",
      R"(model\.backbone\.conv_encoder\.model\.swin\.layernorm\..*)",
      // BertModel's buffer and the pooler that add_pooling_layer=False drops.
      R"(model\.text_backbone\.embeddings\.(position_ids|token_type_ids))",
      R"(model\.text_backbone\.pooler\..*)"};
  return rules;
}

std::unique_ptr<Model> load(const std::string& dir, const nlohmann::json& config,
                            const LoadOptions& options, bool mm) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = parse_config(view, mm);
  auto tokenizer = text::BertTokenizer::from_folder(dir);
  auto net = std::make_shared<GroundingDinoImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::load_state_dict(*net, *file, load_rules(c), options.dtype, options.device);
  net->prepare(options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<GroundingDinoModel>(mm ? "mm-grounding-dino" : "grounding-dino",
                                              std::move(net), std::move(tokenizer), options);
}

}  // namespace
}  // namespace grounding_dino

namespace {

/// Loads `dir` for config.json model_type "grounding-dino" (GroundingDinoForObjectDetection) or
/// "mm-grounding-dino" (MMGroundingDinoForObjectDetection): config.json, model.safetensors
/// (strict; tied heads as load_rules), the BERT tokenizer files. Throws core::ConfigError /
/// core::CheckpointError naming the file and the field or tensor key.
std::unique_ptr<Model> load_family(const std::string& dir, const nlohmann::json& config,
                                   const LoadOptions& options) {
  const bool mm = config.is_object() && config.value("model_type", "") == "mm-grounding-dino";
  return grounding_dino::load(dir, config, options, mm);
}

// Grounding DINO and MM Grounding DINO: Swin backbone (SwinBackbone, always_partition), BERT
// text encoder, feature enhancer (fusion, text self-attention, deformable self-attention),
// two-stage query selection by text similarity, decoder with text cross-attention, contrastive
// class head over the prompt's tokens. forward_text() (grounding_dino.h) takes the prompt;
// Model::forward without one throws.
const FamilyRegistrar registered{
    Family{"grounding_dino", {"grounding-dino", "mm-grounding-dino"}, /*order=*/25, load_family}
        .predicts({Task::object_detection}, image::DetectionHead::prompted)
        .fused_attention(grounding_dino::kFusedAttentionDefault)};

}  // namespace
}  // namespace libreyolo::models
