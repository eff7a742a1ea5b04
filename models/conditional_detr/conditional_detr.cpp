// ConditionalDetrForObjectDetection (transformers 5.17 models/conditional_detr/
// modular_conditional_detr.py), inference only. The stem and the encoder are DETR's
// (models/detr/detr_common.h, as upstream derives them); the decoder is Conditional DETR's. Every
// step keeps transformers' operation order so that float32 results match.

#include <torch/nn/module.h>

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
namespace conditional_detr {
namespace {

using detr::Config;
using detr::make;

/// ConditionalDetrDecoderLayer (post-norm): conditional self-attention, conditional
/// cross-attention (the query position projection on the first layer only), MLP.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const Config& c, bool first) {
    self_attn =
        DecoderSelfAttention(*this, c.d_model, c.decoder_heads, conditional_self_attention_names());
    self_attn_layer_norm =
        register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    cross_attn = DecoderCrossAttention(*this, c.d_model, c.decoder_heads,
                                       conditional_cross_attention_names(), first);
    encoder_attn_layer_norm =
        register_module("encoder_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    ffn = detr::FeedForward(*this, c, c.decoder_ffn);
    final_layer_norm =
        register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  }
  /// x, query_pos, query_sine (B, Q, D); memory, memory_pos (B, S, D); bias (B, 1, 1, S).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& query_sine,
                     const at::Tensor& memory, const at::Tensor& memory_pos,
                     const at::Tensor& bias) const {
    auto h = x + self_attn.forward(x, query_pos);
    h = self_attn_layer_norm->forward(h);
    h = h + cross_attn.forward(h, memory, memory_pos, query_sine, query_pos, bias);
    h = encoder_attn_layer_norm->forward(h);
    h = h + ffn.forward(h);
    return final_layer_norm->forward(h);
  }
  DecoderSelfAttention self_attn;
  DecoderCrossAttention cross_attn;
  layers::LayerNorm self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm;
  detr::FeedForward ffn;
};

/// The module tree with the on-disk names ("model.*", "class_labels_classifier.*",
/// "bbox_predictor.*").
class ConditionalDetrImpl : public torch::nn::Module {
 public:
  explicit ConditionalDetrImpl(const Config& c) : config(c) {
    const int64_t d = c.d_model;
    auto model = register_module("model", make<torch::nn::Module>());
    stem = detr::ConvStem(*model, c);
    auto qpe = model->register_module("query_position_embeddings", make<torch::nn::Module>());
    query_position_embeddings = qpe->register_parameter("weight", at::empty({c.num_queries, d}));
    auto encoder = model->register_module("encoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<detr::EncoderLayerImpl>> el;
    for (int64_t i = 0; i < c.encoder_layers; ++i) el.push_back(make<detr::EncoderLayerImpl>(c));
    encoder_layers = layers::register_list(*encoder, "layers", el);
    auto decoder = model->register_module("decoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<DecoderLayerImpl>> dl;
    for (int64_t i = 0; i < c.decoder_layers; ++i) dl.push_back(make<DecoderLayerImpl>(c, i == 0));
    decoder_layers = layers::register_list(*decoder, "layers", dl);
    decoder_layernorm = decoder->register_module("layernorm", make<layers::LayerNormImpl>(d, 1e-5));
    query_scale = decoder->register_module("query_scale", make<layers::MLPImpl>(d, d, d, 2));
    ref_point_head = decoder->register_module("ref_point_head", make<layers::MLPImpl>(d, d, 2, 2));
    class_labels_classifier =
        register_module("class_labels_classifier", make<layers::LinearImpl>(d, c.num_labels));
    bbox_predictor = register_module("bbox_predictor", make<layers::MLPImpl>(d, d, 4, 3));
  }

  /// pixel_values (B, C, H, W), pixel_mask (B, H, W) (nonzero = valid). Returns logits
  /// (B, Q, num_labels) and pred_boxes (B, Q, 4).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const at::Tensor& pixel_mask) const {
    const auto s = stem.forward(pixel_values, pixel_mask);
    const int64_t B = s.source.size(0);
    const auto pos = stem.position_embedding(s.mask, pixel_values.scalar_type());

    at::Tensor memory = s.source;
    for (const auto& layer : encoder_layers) memory = layer->forward(memory, pos, s.bias);

    // ConditionalDetrDecoder: reference points from the object queries, their sine embedding
    // scaled per layer by query_scale(x) (not on the first layer).
    const auto query_pos = query_position_embeddings.unsqueeze(0).repeat({B, 1, 1});
    at::Tensor x = at::zeros_like(query_pos);
    const auto reference = ref_point_head->forward(query_pos).sigmoid();  // (B, Q, 2)
    const auto sine = deformable_detr::anchor_position_embedding(reference, config.d_model / 2);
    for (size_t i = 0; i < decoder_layers.size(); ++i) {
      const auto query_sine = i == 0 ? sine : sine * query_scale->forward(x);
      x = decoder_layers[i]->forward(x, query_pos, query_sine, memory, pos, s.bias);
    }
    x = decoder_layernorm->forward(x);

    auto box = bbox_predictor->forward(x);
    const auto center = box.narrow(-1, 0, 2) + layers::inverse_sigmoid(reference);
    box = at::cat({center, box.narrow(-1, 2, 2)}, -1);
    return {class_labels_classifier->forward(x), box.sigmoid()};
  }

  Config config;
  detr::ConvStem stem;
  at::Tensor query_position_embeddings;
  std::vector<std::shared_ptr<detr::EncoderLayerImpl>> encoder_layers;
  std::vector<std::shared_ptr<DecoderLayerImpl>> decoder_layers;
  layers::LayerNorm decoder_layernorm;
  layers::MLP query_scale, ref_point_head, bbox_predictor;
  layers::Linear class_labels_classifier;
};

class ConditionalDetrModel : public ModuleModel<ConditionalDetrImpl> {
 public:
  ConditionalDetrModel(std::shared_ptr<ConditionalDetrImpl> net, const LoadOptions& options)
      : ModuleModel("conditional_detr", Task::object_detection, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.num_channels);
    const at::Tensor mask =
        core::checked_pixel_mask("conditional_detr", x, pixel_mask, options_.device);
    auto [logits, boxes] = net_->forward(x, mask);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }
};

}  // namespace
}  // namespace conditional_detr

namespace {

/// Default of the attention modules' `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the conditional_detr_tiny fixture. It is not: manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "conditional_detr". The timm
/// backbone's architecture is read from the checkpoint (detr::read_backbone); the rest is
/// strict. Throws core::ConfigError / core::CheckpointError naming the file and the field or key.
std::unique_ptr<Model> load_conditional_detr(const std::string& dir, const nlohmann::json& config,
                                             const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  detr::ConfigSchema schema;
  schema.default_num_queries = 300;
  auto c = detr::parse_config(view, schema);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  detr::read_backbone(c, *file);
  auto net = std::make_shared<conditional_detr::ConditionalDetrImpl>(c);
  core::load_state_dict(*net, *file, detr::position_embedding_load_rules(), options.dtype,
                        options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<conditional_detr::ConditionalDetrModel>(std::move(net), options);
}

// Conditional DETR (Meng et al., "Conditional DETR for Fast Training Convergence", ICCV 2021)
// as transformers 5.17 ConditionalDetrForObjectDetection: DETR's ResNet backbone (timm's, as
// microsoft/conditional-detr-resnet-50 publishes it, DC5 with `dilation`, or transformers'
// ResNetBackbone), input_projection, sine (or learned) position embeddings and post-norm
// encoder; a decoder whose queries carry 2-D reference points (ref_point_head of the object
// queries): the cross-attention concatenates, per head, the content with the reference point's
// sine embedding (scaled by query_scale of the decoder state) on the queries and with the
// spatial embedding on the keys. class_labels_classifier (num_labels, sigmoid: no "no object"
// class) and bbox_predictor, whose centre is offset by the reference point's inverse sigmoid.
// forward() takes pixel_values (B, 3, H, W) and an optional pixel_mask (B, H, W); it returns
// logits (B, num_queries, num_labels) and pred_boxes (B, num_queries, 4), float32.
// Post-processing: ConditionalDetrImageProcessor.post_process_object_detection, the same code
// as Deformable DETR's (sigmoid, top-100 over queries x classes: image::DetectionHead::
// deformable_detr).
const FamilyRegistrar registered{
    Family{"conditional_detr", {"conditional_detr"}, /*order=*/16, load_conditional_detr}
        .predicts({Task::object_detection}, image::DetectionHead::deformable_detr)
        .takes_pixel_mask()
        .fused_attention(kFusedAttentionDefault)
        .layouts(
            detr::with_resnet_backbone_rules(
                {{"qkv_concat", {"ConditionalDetrSelfAttention"}, "", path_with("self_attn")}}),
            {"batchnorm_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
